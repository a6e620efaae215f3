#include "forge/dataio/image_text.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <unordered_map>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// A record's image path: relative to its JSONL file's directory, or absolute.
fs::path resolve(const fs::path& jsonl_path, const std::string& ref) {
  return fs::path(ref).is_absolute() ? fs::path(ref) : jsonl_path.parent_path() / ref;
}

// A record's "image" field: one path or a list of them. Returns "" or why it is malformed.
std::string image_refs(const Json& field, std::vector<std::string>& refs) {
  refs.clear();
  if (field.is_string()) {
    refs.push_back(field.get<std::string>());
  } else if (field.is_array()) {
    for (const auto& p : field) {
      if (!p.is_string()) return "\"image\" holds a non-string";
      refs.push_back(p.get<std::string>());
    }
  } else {
    return "\"image\" is neither a path nor a list of paths";
  }
  for (const auto& p : refs)
    if (p.empty()) return "\"image\" holds an empty path";
  return "";
}

// A document's pictures as one key: equal keys, the same pictures in the same order.
uint64_t images_key(const Corpus& corpus, const Document& doc) {
  std::vector<uint64_t> hashes;
  for (const uint32_t i : doc.images) hashes.push_back(corpus.images[i].pixel_hash);
  return xxh3_64(hashes.data(), hashes.size() * sizeof(uint64_t), hashes.size());
}

bool images_near(const Corpus& corpus, const Document& a, const Document& b, int distance) {
  if (a.images.size() != b.images.size()) return false;
  for (size_t k = 0; k < a.images.size(); ++k)
    if (hamming_distance(corpus.images[a.images[k]].perceptual_hash,
                         corpus.images[b.images[k]].perceptual_hash) > distance)
      return false;
  return true;
}

LoadedImage load_image(const fs::path& jsonl_path, const std::string& ref, const ImageOptions& o) {
  LoadedImage out;
  const fs::path path = resolve(jsonl_path, ref);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    out.reason = "missing_file";
    out.detail = fmt::format("{}: no such file", path.string());
    return out;
  }
  std::string bytes;
  try {
    bytes = read_file(path.string());
  } catch (const Error& e) {
    out.reason = "unreadable";
    out.detail = e.what();
    return out;
  }
  out.file_bytes = bytes.size();
  const DecodeResult decoded = decode_image(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), o.max_pixels, {o.size, o.fit});
  if (!decoded.reason.empty()) {
    out.reason = decoded.reason;
    out.detail =
        fmt::format("{}: {}", path.string(), decoded.detail.empty() ? decoded.reason : decoded.detail);
    return out;
  }
  // The size rules read the file's own size; a JPEG's pixels may have been decoded reduced for the fit.
  const Image& image = decoded.image;
  const uint32_t w = decoded.stored_width, h = decoded.stored_height;
  const uint32_t shorter = std::min(w, h), longer = std::max(w, h);
  if (shorter < o.min_side || double(longer) > o.max_aspect * double(shorter)) {
    out.reason = shorter < o.min_side ? "tiny" : "extreme_aspect";
    out.detail = fmt::format("{}: {}x{}", path.string(), w, h);
    return out;
  }
  out.image.pixel_hash = pixel_hash(image);
  out.image.perceptual_hash = perceptual_hash(image);
  out.image.rgb = fit_image(image, o.size, o.fit).rgb;
  return out;
}

}  // namespace

Json ImageOptions::to_json() const {
  return {{"size", size},
          {"patch", patch},
          {"tokens", tokens()},
          {"fit", image_fit_name(fit)},
          {"min_side", min_side},
          {"max_aspect", max_aspect},
          {"max_pixels", max_pixels},
          {"near_distance", near_distance}};
}

void check_image_options(const ImageOptions& o) {
  if (o.size < 8 || o.size > 4096 || o.patch == 0 || o.size % o.patch != 0)
    fail(
        ExitCode::kUsage,
        "image.size {} and image.patch {}: the size must be 8..4096 and a multiple of the patch (the encoder "
        "cuts each picture into (size / patch)^2 patches)",
        o.size, o.patch);
  if (o.min_side == 0 || !(o.max_aspect >= 1.0) || o.max_pixels == 0)
    fail(ExitCode::kUsage,
         "image.min_side {}, image.max_aspect {}, image.max_pixels {}: must be at least 1, 1.0 and 1",
         o.min_side, o.max_aspect, o.max_pixels);
  if (o.near_distance < 0 || o.near_distance > 32)
    fail(ExitCode::kUsage, "image.near_distance {}: must be 0..32 bits of the 64-bit perceptual hash",
         o.near_distance);
}

size_t count_placeholders(std::string_view text) {
  size_t n = 0;
  for (size_t at = text.find(kImagePlaceholder); at != std::string_view::npos;
       at = text.find(kImagePlaceholder, at + kImagePlaceholder.size()))
    ++n;
  return n;
}

std::string parse_image_text_line(std::string_view line, ImageTextRecord& record) {
  record = ImageTextRecord{};
  const Json rec = Json::parse(line, nullptr, false);
  if (rec.is_discarded() || !rec.is_object()) return "not a JSON object";
  const auto image = rec.find("image");
  if (image == rec.end()) return "no \"image\" field (a path, or a list of paths)";
  if (std::string why = image_refs(*image, record.images); !why.empty()) return why;
  if (rec.contains("messages")) return parse_chat_line(line, record.chat);
  const auto text = rec.find("text");
  if (text == rec.end() || !text->is_string())
    return "neither \"messages\" nor a string \"text\" (a caption)";
  // A caption: the pictures as the user's turn, the caption as the reply (what is scored).
  std::string user;
  for (size_t k = 0; k < record.images.size(); ++k) (user += k ? "\n" : "") += kImagePlaceholder;
  record.chat.messages = {{ChatRole::kUser, std::move(user)},
                          {ChatRole::kAssistant, text->get<std::string>()}};
  for (const auto& [key, field] :
       {std::pair{"domain", &record.chat.domain}, std::pair{"source", &record.chat.source},
        std::pair{"license", &record.chat.license}}) {
    const auto v = rec.find(key);
    if (v != rec.end() && v->is_string()) *field = v->get<std::string>();
  }
  return "";
}

Json ImageIngestStats::to_json() const {
  Json bad_json = Json::object(), dropped_json = Json::object();
  for (const char* r : kBadReasons) bad_json[r] = 0;
  for (const char* r : kQualityReasons) dropped_json[r] = 0;
  for (const auto& [k, v] : bad) bad_json[k] = v;
  for (const auto& [k, v] : dropped) dropped_json[k] = v;
  return {{"images", images},
          {"file_bytes", bytes},
          {"bad", bad_json},
          {"dropped", dropped_json},
          {"decode_cpu_seconds", decode_cpu_seconds},
          {"images_per_cpu_s", decode_cpu_seconds > 0 ? double(images) / decode_cpu_seconds : 0.0}};
}

LoadedImage load_record_image(const fs::path& jsonl_path, const std::string& ref, const ImageOptions& o) {
  const double cpu0 = thread_cpu_s();
  LoadedImage out = load_image(jsonl_path, ref, o);
  out.cpu_seconds = thread_cpu_s() - cpu0;
  return out;
}

Json dedup_image_text(Corpus& corpus, const MinHashOptions& minhash, int near_distance) {
  ProgressLine progress("prepare image-dedup", "docs");
  const size_t n = corpus.docs.size();
  const MinHasher hasher(minhash);
  enum Verdict : uint8_t { kKept, kExact, kNearImages, kNearText };
  std::vector<Verdict> verdict(n, kKept);
  std::vector<uint64_t> key(n);
  std::vector<Hash128> text(n);
  // Kept documents by text, and by pictures; each list in input order.
  std::unordered_map<uint64_t, std::vector<size_t>> by_text, by_images;
  std::unordered_map<uint64_t, std::vector<uint32_t>> signatures;  // lazily, for groups of two or more
  const auto signature = [&](size_t i) -> const std::vector<uint32_t>& {
    auto [it, fresh] = signatures.try_emplace(i);
    if (fresh) it->second = hasher.signature(corpus.docs[i].text);
    return it->second;
  };
  for (size_t i = 0; i < n; ++i) {
    const Document& doc = corpus.docs[i];
    progress.add(1, doc.text.size());
    text[i] = xxh3_128(doc.text);
    key[i] = images_key(corpus, doc);
    auto& same_text = by_text[text[i].low];
    auto& same_images = by_images[key[i]];
    for (const size_t k : same_text) {
      if (text[k].high != text[i].high) continue;
      if (key[k] == key[i]) {
        verdict[i] = kExact;
        break;
      }
      if (images_near(corpus, corpus.docs[k], doc, near_distance)) verdict[i] = kNearImages;
    }
    // Text-only records all share the empty key: comparing each with every one before it would be
    // quadratic, so they are deduplicated exactly only.
    if (verdict[i] == kKept && !doc.images.empty())
      for (const size_t k : same_images)
        if (estimated_jaccard(signature(k), signature(i)) >= hasher.plan().confirm_threshold()) {
          verdict[i] = kNearText;
          break;
        }
    if (verdict[i] != kKept) continue;
    same_text.push_back(i);
    same_images.push_back(i);
  }
  // Pictures that repeat across documents (kept: another caption of the same picture is another sample).
  std::unordered_map<uint64_t, uint64_t> uses;
  uint64_t images_in = 0;
  for (size_t i = 0; i < n; ++i)
    if (verdict[i] == kKept)
      for (const uint32_t im : corpus.docs[i].images) ++uses[corpus.images[im].pixel_hash], ++images_in;
  uint64_t repeated = 0;
  for (const auto& [_, count] : uses) repeated += count > 1 ? count - 1 : 0;
  uint64_t removed[4] = {};
  Json examples = Json::array();
  std::vector<Document> kept;
  kept.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ++removed[verdict[i]];
    if (verdict[i] == kKept) {
      kept.push_back(std::move(corpus.docs[i]));
    } else if (examples.size() < 5) {
      static constexpr const char* kWhy[] = {"", "exact", "near_images", "near_text"};
      examples.push_back({{"removed", corpus.docs[i].source}, {"why", kWhy[verdict[i]]}});
    }
  }
  corpus.docs = std::move(kept);
  progress.finish();
  const uint64_t total = removed[kExact] + removed[kNearImages] + removed[kNearText];
  return {{"method", "text with pictures: xxh3-128 of the text, pixel hash and DCT perceptual hash"},
          {"near_distance_bits", near_distance},
          {"near_text_threshold", minhash.threshold},
          {"documents_in", n},
          {"removed",
           {{"exact_duplicate", removed[kExact]},
            {"same_text_near_pictures", removed[kNearImages]},
            {"same_pictures_near_text", removed[kNearText]}}},
          {"duplicate_rate", n ? double(total) / double(n) : 0.0},
          {"pictures_in_kept_documents", images_in},
          {"distinct_pictures", uses.size()},
          {"repeated_pictures", repeated},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

std::vector<uint64_t> load_eval_images(const std::vector<std::string>& files, const ImageOptions& options) {
  std::vector<uint64_t> hashes;
  std::vector<std::string> refs;
  for (const auto& file : files) {
    if (fs::path(file).extension() != ".jsonl") continue;
    const std::string data = read_file(file);
    size_t start = 0;
    for (int line_no = 1; start < data.size(); ++line_no) {
      size_t nl = data.find('\n', start);
      if (nl == std::string::npos) nl = data.size();
      const Json rec = Json::parse(std::string_view(data).substr(start, nl - start), nullptr, false);
      start = nl + 1;
      if (!rec.is_object() || !rec.contains("image")) continue;
      if (const std::string why = image_refs(rec["image"], refs); !why.empty())
        fail(ExitCode::kData, "--eval-set {}:{}: {}; fix the eval set", file, line_no, why);
      for (const auto& ref : refs) {
        // The eval set's pictures are compared as they are: not checked for size or fitted.
        const fs::path path = resolve(file, ref);
        std::error_code ec;
        if (!fs::is_regular_file(path, ec))
          fail(ExitCode::kData, "--eval-set {}:{}: image {}: no such file; fix the eval set", file, line_no,
               path.string());
        const std::string bytes = read_file(path.string());
        const DecodeResult d = decode_image(
            std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), options.max_pixels);
        if (!d.reason.empty())
          fail(ExitCode::kData, "--eval-set {}:{}: image {}: {} ({}); fix the eval set", file, line_no,
               path.string(), d.reason, d.detail);
        hashes.push_back(perceptual_hash(d.image));
      }
    }
  }
  return hashes;
}

Json decontaminate_images(Corpus& corpus, std::span<const uint64_t> eval_hashes, int near_distance) {
  ProgressLine progress("prepare image-decontam", "docs");
  const uint64_t in = corpus.docs.size();
  Json examples = Json::array();
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  for (auto& doc : corpus.docs) {
    progress.add(1, doc.text.size());
    const auto hit = std::find_if(doc.images.begin(), doc.images.end(), [&](uint32_t im) {
      return std::any_of(eval_hashes.begin(), eval_hashes.end(), [&](uint64_t e) {
        return hamming_distance(corpus.images[im].perceptual_hash, e) <= near_distance;
      });
    });
    if (hit == doc.images.end()) {
      kept.push_back(std::move(doc));
      continue;
    }
    if (examples.size() < 5) examples.push_back({{"removed", doc.source}});
  }
  progress.finish();
  corpus.docs = std::move(kept);
  return {{"eval_pictures", eval_hashes.size()},
          {"near_distance_bits", near_distance},
          {"documents_in", in},
          {"removed", {{"contaminated_picture", in - corpus.docs.size()}}},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

uint32_t image_token_id(const Tokenizer& tokenizer, const std::string& model_path) {
  const auto id = reserved_piece_id(tokenizer, kImagePlaceholder);
  if (!id)
    fail(ExitCode::kUsage,
         "--tokenizer {}: {} is not a single reserved piece of this model, so pictures cannot be placed in "
         "its token stream; use a tokenizer trained by 'forge-data prepare --format image-text' (it "
         "reserves {}) or drop --tokenizer to train one",
         model_path, kImagePlaceholder, kImagePlaceholder);
  return *id;
}

std::vector<uint64_t> expand_image_tokens(std::vector<uint32_t>& ids, std::vector<uint8_t>& mask,
                                          uint32_t image_id, uint32_t tokens) {
  const auto placeholders = static_cast<size_t>(std::count(ids.begin(), ids.end(), image_id));
  std::vector<uint64_t> starts;
  if (placeholders == 0) return starts;
  std::vector<uint32_t> out;
  std::vector<uint8_t> out_mask;
  out.reserve(ids.size() + placeholders * (tokens - 1));
  out_mask.reserve(mask.empty() ? 0 : out.capacity());
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool image = ids[i] == image_id;
    if (image) starts.push_back(out.size());
    out.insert(out.end(), image ? tokens : 1, ids[i]);
    if (!mask.empty()) out_mask.insert(out_mask.end(), image ? tokens : 1, image ? uint8_t{0} : mask[i]);
  }
  ids = std::move(out);
  if (!mask.empty()) mask = std::move(out_mask);
  return starts;
}

void verify_image_runs(const std::string& dataset_dir) {
  const Manifest m = load_manifest(dataset_dir);
  const Json& image = m.settings.at("image");
  const auto size = image.at("size").get<uint32_t>(), tokens = image.at("tokens").get<uint32_t>();
  const auto image_id = image.at("token_id").get<uint32_t>();
  for (const auto& e : m.shards) {
    const std::string path = (fs::path(dataset_dir) / e.file).string();
    ShardLayout layout;
    const ShardData data = read_shard(path, &layout);
    const uint64_t placeholders =
        static_cast<uint64_t>(std::count(data.tokens.begin(), data.tokens.end(), image_id));
    if (placeholders == 0 && !layout.has_images) continue;
    if (!layout.has_images || layout.attrs.image_size != size || layout.attrs.image_tokens != tokens)
      fail(ExitCode::kData,
           "shard {}: {} placeholder tokens but pictures of {}x{} with {} tokens each (the manifest says "
           "{}x{}, {})",
           path, placeholders, layout.attrs.image_size, layout.attrs.image_size, layout.attrs.image_tokens,
           size, size, tokens);
    if (placeholders != layout.images * tokens)
      fail(ExitCode::kData, "shard {}: {} placeholder tokens for {} pictures of {} tokens", path,
           placeholders, layout.images, tokens);
    size_t doc = 0;
    uint64_t end = 0;
    for (size_t k = 0; k < data.image_positions.size(); ++k) {
      const uint64_t at = data.image_positions[k];
      while (doc + 1 < data.doc_offsets.size() && data.doc_offsets[doc + 1] <= at) ++doc;
      const bool inside =
          at >= end && at + tokens <= data.doc_offsets[std::min(doc + 1, data.doc_offsets.size() - 1)];
      bool run = inside;
      for (uint64_t t = at; run && t < at + tokens; ++t)
        run = data.tokens[t] == image_id && (data.loss_mask.empty() || data.loss_mask[t] == 0);
      if (!run)
        fail(ExitCode::kData,
             "shard {}: picture {} at token {} is not a run of {} unscored placeholder tokens inside one "
             "document after the previous picture",
             path, k, at, tokens);
      end = at + tokens;
    }
  }
}

}  // namespace forge::data
