#include "forge/dataio/prepare.h"

#include "distributed.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/local_rank.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/chat_template.h"
#include "forge/dataio/decontam.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/prompts.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/split.h"
#include "report.h"
#include "wire.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process (encoding threads included). Rates per CPU-second are the per-core
// figures the benchmark reports: unlike wall time, other processes on a shared machine do not inflate them.
double cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Per language: the tokens written and their share of all tokens.
Json language_shares(const Json& tokens, uint64_t total) {
  Json out = Json::object();
  for (const auto& [code, n] : tokens.items())
    out[code] = {{"tokens", n}, {"token_share", total ? n.get<double>() / double(total) : 0.0}};
  return out;
}

constexpr const char* kModelTemplateRender =
    "each message's content cleaned as for forge-chat-1 (normalized, forge's marker strings respelled); the "
    "conversation rendered by the model's chat template (apply_chat_template's text) and cut into segments "
    "at the assistant replies (ChatTemplate::segments); each segment encoded on its own, no BOS added; the "
    "tokenizer's end-of-sequence id after the conversation";
constexpr const char* kModelTemplateMask =
    "1 on the tokens of each assistant reply's segment (its content and the end-of-turn text the template "
    "writes after it), of every reply for chat and of the final reply of each preference half; 0 elsewhere "
    "(the prompt's segments, end-of-sequence)";

constexpr const char* kChatFiltersSkipped =
    "chat: the prose quality filters judge web text, not conversations; they are not run";
constexpr const char* kPreferenceFiltersSkipped =
    "preference: the prose quality filters judge web text, not conversations; they are not run";

const char* filters_skipped(const std::string& format) {
  return format == "preference" ? kPreferenceFiltersSkipped : kChatFiltersSkipped;
}

// Everything that decides the dataset's content besides the input bytes; recorded in the manifest and so
// part of the version. Input paths are left out: the same corpus at another path is the same dataset.
Json settings_json(const PrepareOptions& o, const std::vector<std::string>& eval_hashes,
                   const std::string& tok_source, const ChatTemplate* model_template) {
  const auto& f = o.filters;
  Json allow = Json::object();
  for (const auto& [domain, codes] : o.language.allow) allow[domain] = codes;
  Json s = {
      {"normalize_rules", kNormalizeRules},
      {"ingest",
       {{"extensions", o.ingest.extensions},
        {"max_doc_bytes", o.ingest.max_doc_bytes},
        {"max_line_bytes", o.ingest.max_line_bytes},
        {"max_invalid_utf8", o.ingest.max_invalid_utf8},
        {"max_nul", o.ingest.max_nul},
        {"default_domain", o.ingest.default_domain},
        {"repo_depth", o.ingest.repo_depth}}},
      {"pii",
       {{"enabled", o.pii.enabled},
        {"rules", kPiiRules},
        {"action", o.pii.drop ? "drop" : "redact"},
        {"types", Json::array()}}},
      {"safety",
       {{"list_sha256", o.safety.list.empty() ? "" : sha256_file_hex(o.safety.list)},
        {"threshold", o.safety.threshold},
        {"min_words", kSafetyMinWords}}},
      {"language",
       {{"enabled", o.language.enabled}, {"identifier", language_identifier()}, {"allow", allow}}},
      {"repository",
       {{"fork_threshold", o.repository.fork_threshold},
        {"drop_forks", o.repository.drop_forks},
        {"min_fork_file_bytes", kMinForkFileBytes}}},
      {"license", {{"allow", o.license.allow}, {"detection_rules", kLicenseRules}}},
      {"exact_dedup", {{"hash", "xxh3-128"}}},
      {"near_dedup",
       {{"enabled", o.near_dedup},
        {"ngram", o.minhash.ngram},
        {"bands", o.minhash.bands},
        {"rows", o.minhash.rows},
        {"threshold", o.minhash.threshold},
        {"seed", o.minhash.seed}}},
      {"filters",
       {{"code_domains", f.code_domains},
        {"min_words", f.min_words},
        {"max_words", f.max_words},
        {"mean_word_length", {f.min_mean_word_length, f.max_mean_word_length}},
        {"max_symbol_word_ratio", f.max_symbol_word_ratio},
        {"max_digit_ratio", f.max_digit_ratio},
        {"min_alpha_word_fraction", f.min_alpha_word_fraction},
        {"max_bullet_line_fraction", f.max_bullet_line_fraction},
        {"max_ellipsis_line_fraction", f.max_ellipsis_line_fraction},
        {"max_duplicate_line_fraction", f.max_duplicate_line_fraction},
        {"max_duplicate_line_char_fraction", f.max_duplicate_line_char_fraction},
        {"max_top_ngram_fraction",
         {f.max_top_2gram_fraction, f.max_top_3gram_fraction, f.max_top_4gram_fraction}},
        {"max_boilerplate_line_fraction", f.max_boilerplate_line_fraction},
        {"max_code_line_length", f.max_code_line_length},
        {"max_code_mean_line_length", f.max_code_mean_line_length},
        {"min_code_alnum_fraction", f.min_code_alnum_fraction},
        {"code_min_lines", f.code_min_lines}}},
      {"decontam", {{"ngram", o.decontam_ngram}, {"eval_set_sha256", eval_hashes}}},
      {"tokenizer",
       {{"source", tok_source}, {"vocab", o.tokenizer.vocab}, {"sample_bytes", o.tokenizer.sample_bytes}}},
      {"split", {{"valid_fraction", o.valid_fraction}, {"seed", o.split_seed}}},
      {"shards", {{"shard_tokens", o.shard_tokens}}}};
  // Chat keys only for chat and preference datasets, so the settings (and versions) of text datasets stay
  // as they were.
  if (o.ingest.format != "text") {
    s["ingest"]["format"] = o.ingest.format;
    s["ingest"]["max_bad_lines"] = o.ingest.max_bad_lines;
    s["filters"] = {{"applied", false}, {"why", filters_skipped(o.ingest.format)}};
    s["chat"] = {{"template", chat_template_json()},
                 {"template_sha256", chat_template_sha256()},
                 {"max_tokens", o.chat.max_tokens},
                 {"truncate", o.chat.drop_long ? "drop" : "truncate"}};
    // A model's own template: its SHA-256 (text, bos and eos strings) makes the version; where it was read
    // from (ChatTemplate::name, source) does not, as input paths do not: quality.json records them.
    if (model_template) {
      s["chat"]["template"] = {{"kind", kModelTemplateKind},
                               {"sha256", model_template->sha256()},
                               {"render", kModelTemplateRender},
                               {"loss_mask", kModelTemplateMask}};
      s["chat"]["template_sha256"] = model_template->sha256();
    }
  }
  if (o.ingest.format == "preference") s["preference"] = preference_rules_json();
  if (o.ingest.format == kImageTextFormat) {
    s["image"] = o.ingest.image.to_json();
    s["image"]["decoder"] = kImageDecoder;
  }
  for (size_t t = 0; t < kPiiTypes; ++t)
    if (o.pii.types[t]) s["pii"]["types"].push_back(pii_type_name(PiiType(t)));
  return s;
}

// What every format needs: inputs, eval sets that exist, and an output directory that is new or empty.
void check_destination(const PrepareOptions& o) {
  if (o.inputs.empty()) fail(ExitCode::kUsage, "no --input given");
  if (o.out.empty()) fail(ExitCode::kUsage, "no --out given");
  for (const auto& e : o.eval_sets)
    if (!fs::is_regular_file(e)) fail(ExitCode::kUsage, "--eval-set {}: no such file", e);
  std::error_code ec;
  if (fs::exists(o.out, ec) && !(fs::is_directory(o.out, ec) && fs::is_empty(o.out, ec)))
    fail(ExitCode::kUsage,
         "--out {}: already exists and is not an empty directory; remove it or pick another path", o.out);
}

void check_options(const PrepareOptions& o) {
  if (!(o.valid_fraction >= 0 && o.valid_fraction <= 0.5))
    fail(ExitCode::kUsage, "--valid-fraction {}: must be between 0 and 0.5", o.valid_fraction);
  if (o.shard_tokens == 0) fail(ExitCode::kUsage, "--shard-tokens must be positive");
  if (o.ingest.format != "text" && o.ingest.format != "chat" && o.ingest.format != "preference" &&
      o.ingest.format != kImageTextFormat)
    fail(ExitCode::kUsage, "--format {}: must be text, chat, preference, image-text or prompts",
         o.ingest.format);
  if (o.ingest.format == kImageTextFormat) check_image_options(o.ingest.image);
  if (o.chat.max_tokens == 1)
    fail(ExitCode::kUsage,
         "--max-tokens 1: must be 0 (no limit) or at least 2 (one token is end-of-sequence)");
  if (!o.tokenizer_model.empty() && !fs::is_regular_file(o.tokenizer_model))
    fail(ExitCode::kUsage, "--tokenizer {}: no such file", o.tokenizer_model);
  if (!o.chat_template.empty()) {
    std::error_code ec;
    if (o.ingest.format == "text")
      fail(ExitCode::kUsage,
           "--chat-template {}: renders conversations; it needs --format chat or preference (a text dataset "
           "has none)",
           o.chat_template);
    if (o.tokenizer_model.empty())
      fail(ExitCode::kUsage,
           "--chat-template {}: needs --tokenizer, the model's own tokenizer (its tokenizer.json or "
           "tokenizer.model): a tokenizer trained here would not know the template's special tokens",
           o.chat_template);
    if (!fs::exists(o.chat_template, ec))
      fail(ExitCode::kUsage,
           "--chat-template {}: no such file or directory (a tokenizer_config.json or a model "
           "directory holding one)",
           o.chat_template);
  }
}

// A model's chat template at the encode step: the mode of its segments and, per document, the masks and
// why a conversation the template cannot segment is left out ("" when it is encoded).
struct TemplateEncoding {
  const ChatTemplate* chat_template = nullptr;
  ScoredReplies scored = ScoredReplies::kAll;
  std::vector<std::vector<uint8_t>> masks;
  std::vector<std::string> errors;
};

// One document (a forge-rendered conversation) through the model's template: its messages back from the
// rendered text, the template's segments, each encoded on its own. Returns "" or why the template cannot
// segment it (ids and mask then empty).
std::string encode_with_template(const Document& doc, const Tokenizer& tok, EncodeCache& cache,
                                 const ChatTemplate& chat_template, ScoredReplies scored,
                                 std::vector<uint32_t>& ids, std::vector<uint8_t>& mask) {
  const std::vector<ChatMessage> messages = parse_rendered_chat(doc.text, doc.source);
  std::vector<ChatSegment> segments;
  try {
    segments = chat_template.segments(messages, scored);
  } catch (const Error& e) {
    if (e.code() != ExitCode::kData) throw;
    return e.what();
  }
  std::vector<int> piece;
  for (const ChatSegment& s : segments) {
    tok.encode(s.text, piece, cache);
    ids.insert(ids.end(), piece.begin(), piece.end());
    mask.insert(mask.end(), piece.size(), s.scored ? 1 : 0);
  }
  if (std::find(mask.begin(), mask.end(), uint8_t{1}) == mask.end()) {
    ids.clear();
    mask.clear();
    return "the template's segments hold no token of an assistant reply";
  }
  return "";
}

// Encodes every document on `threads` threads; each result ends with the end-of-sequence id. With a model's
// template (`tmpl`), also the masks (the end-of-sequence id unscored) and the documents it cannot segment,
// left empty.
std::vector<std::vector<uint32_t>> encode_all(const Corpus& corpus, const Tokenizer& tok, int threads,
                                              TemplateEncoding* tmpl = nullptr) {
  std::vector<std::vector<uint32_t>> out(corpus.docs.size());
  if (tmpl) {
    tmpl->masks.assign(corpus.docs.size(), {});
    tmpl->errors.assign(corpus.docs.size(), {});
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes_done{0};
  std::exception_ptr error;
  std::mutex error_mu;
  const auto work = [&] {
    std::vector<int> ids;
    EncodeCache cache;
    try {
      for (size_t i; (i = next.fetch_add(1)) < corpus.docs.size();) {
        bytes_done += corpus.docs[i].text.size();
        if (tmpl) {
          tmpl->errors[i] = encode_with_template(corpus.docs[i], tok, cache, *tmpl->chat_template,
                                                 tmpl->scored, out[i], tmpl->masks[i]);
          if (!tmpl->errors[i].empty()) continue;
          tmpl->masks[i].push_back(0);
        } else {
          tok.encode(corpus.docs[i].text, ids, cache);
          out[i].assign(ids.begin(), ids.end());
        }
        out[i].push_back(static_cast<uint32_t>(tok.eos_id()));
      }
    } catch (...) {
      std::lock_guard lock(error_mu);
      error = std::current_exception();
      next = corpus.docs.size();
    }
  };
  uint64_t total = 0;
  for (const auto& d : corpus.docs) total += d.text.size();
  ProgressLine progress("prepare encode", "docs", 0, total);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  progress.add(corpus.docs.size(), bytes_done);
  progress.finish();
  if (error) std::rethrow_exception(error);
  return out;
}

enum class Fit { kFits, kCut, kTooLong, kNoScoredToken };

// The --max-tokens policy on one encoded document and its mask.
Fit fit_to_limit(std::vector<uint32_t>& ids, std::vector<uint8_t>& mask, uint32_t eos,
                 const ChatPrepareOptions& o) {
  if (o.max_tokens == 0 || ids.size() <= o.max_tokens) return Fit::kFits;
  if (o.drop_long) return Fit::kTooLong;
  // Every document still ends with the end-of-sequence id: the reader does not need it (boundaries come
  // from /doc_offsets), but decoders and `inspect` expect it.
  ids.resize(o.max_tokens - 1);
  mask.resize(o.max_tokens - 1);
  ids.push_back(eos);
  mask.push_back(0);
  return std::find(mask.begin(), mask.end(), uint8_t{1}) == mask.end() ? Fit::kNoScoredToken : Fit::kCut;
}

// After --max-tokens: a cut inside a picture's run (just before the end-of-sequence id) leaves part of a
// run; it goes. Returns the pictures left.
size_t drop_partial_image(std::vector<uint32_t>& ids, std::vector<uint8_t>& mask, uint32_t image_id,
                          uint32_t tokens) {
  const auto placeholders = static_cast<size_t>(std::count(ids.begin(), ids.end(), image_id));
  const size_t partial = placeholders % tokens;
  if (partial > 0) {
    const auto end = ids.end() - 1;  // the end-of-sequence id
    ids.erase(end - static_cast<std::ptrdiff_t>(partial), end);
    mask.erase(mask.end() - 1 - static_cast<std::ptrdiff_t>(partial), mask.end() - 1);
  }
  return placeholders / tokens;
}

uint64_t scored_in(const std::vector<uint8_t>& mask) {
  return static_cast<uint64_t>(std::count(mask.begin(), mask.end(), uint8_t{1}));
}

// The degenerate reasons of conversations (pairs) a model's template cannot segment: the template refuses
// them itself (raise_exception, e.g. roles that do not alternate), or renders them so that the replies
// cannot be told from the prompt (ChatTemplate::segments), or fails on them otherwise.
constexpr const char* kTemplateRaised = "template_raised_exception";
constexpr const char* kTemplateCannotSegment = "template_cannot_segment";

const char* template_drop_reason(const std::string& why) {
  return why.find("raise_exception") != std::string::npos ? kTemplateRaised : kTemplateCannotSegment;
}

// What a model's template left out: counts by reason and the first few, "source: why".
struct TemplateDrops {
  static constexpr size_t kListed = 20;
  std::map<std::string, uint64_t> by_reason = {{kTemplateRaised, 0}, {kTemplateCannotSegment, 0}};
  std::vector<std::string> first;
  uint64_t total = 0;
};

// The loss mask of each encoded document, then the --max-tokens policy, per unit: a conversation (chat) or
// the two halves of a pair (preference: documents 2k and 2k + 1; each half scores only its final reply,
// and the pair goes when either half goes). With `markers` the masks are computed from the marker ids
// (forge's template); without, `tmpl` holds them (a model's template) and the units it could not segment
// are left out, counted in `drops`. Units left out are removed from `corpus` and `encoded` (the returned
// masks match the survivors). `report` gets the counts and the token means of what is kept.
std::vector<std::vector<uint8_t>> masks_and_truncation(Corpus& corpus,
                                                       std::vector<std::vector<uint32_t>>& encoded,
                                                       const ChatMarkerIds* markers, TemplateEncoding* tmpl,
                                                       uint32_t eos, const ChatPrepareOptions& o,
                                                       bool preference, TemplateDrops& drops, Json& report) {
  const size_t unit = preference ? 2 : 1;
  const char* what = preference ? "pairs" : "conversations";
  std::vector<std::vector<uint8_t>> masks = tmpl ? std::move(tmpl->masks) : decltype(masks)(encoded.size());
  uint64_t truncated = 0, units_truncated = 0, dropped_long = 0, dropped_unscored = 0;
  size_t kept = 0;
  for (size_t first = 0; first < encoded.size(); first += unit) {
    if (tmpl) {
      const auto failed = std::find_if(tmpl->errors.begin() + static_cast<std::ptrdiff_t>(first),
                                       tmpl->errors.begin() + static_cast<std::ptrdiff_t>(first + unit),
                                       [](const std::string& e) { return !e.empty(); });
      if (failed != tmpl->errors.begin() + static_cast<std::ptrdiff_t>(first + unit)) {
        ++drops.by_reason[template_drop_reason(*failed)];
        ++drops.total;
        if (drops.first.size() < TemplateDrops::kListed)
          drops.first.push_back(corpus.docs[first].source + ": " + *failed);
        continue;
      }
    }
    bool too_long = false, unscored = false;
    uint64_t cut = 0;
    for (size_t i = first; i < first + unit; ++i) {
      // Without markers the masks are the template's.
      if (markers && preference)
        final_reply_loss_mask(encoded[i], *markers, masks[i]);
      else if (markers)
        chat_loss_mask(encoded[i], *markers, masks[i]);
      const Fit fit = fit_to_limit(encoded[i], masks[i], eos, o);
      too_long |= fit == Fit::kTooLong;
      unscored |= fit == Fit::kNoScoredToken;
      cut += fit == Fit::kCut;
    }
    if (too_long || unscored) {
      ++(too_long ? dropped_long : dropped_unscored);
      continue;
    }
    truncated += cut;
    units_truncated += cut > 0;
    for (size_t i = first; i < first + unit; ++i, ++kept) {
      if (kept == i) continue;
      corpus.docs[kept] = std::move(corpus.docs[i]);
      encoded[kept] = std::move(encoded[i]);
      masks[kept] = std::move(masks[i]);
    }
  }
  const uint64_t units_encoded = encoded.size() / unit;
  corpus.docs.resize(kept);
  encoded.resize(kept);
  masks.resize(kept);
  if (kept == 0 && drops.total > 0)
    fail(ExitCode::kData,
         "no {} left after the chat template and --max-tokens {} ({} the template cannot segment, first: {}; "
         "{} dropped as too long, {} cut to no scored token); nothing written",
         preference ? "pair" : "conversation", o.max_tokens, drops.total, drops.first.front(), dropped_long,
         dropped_unscored);
  if (kept == 0)
    fail(ExitCode::kData,
         "no {} left after --max-tokens {} ({} dropped as too long, {} cut to no scored token); raise "
         "--max-tokens or use --truncate truncate; nothing written",
         preference ? "pair" : "conversation", o.max_tokens, dropped_long, dropped_unscored);
  uint64_t tokens = 0, scored = 0;
  for (size_t i = 0; i < kept; ++i) {
    tokens += encoded[i].size();
    scored += scored_in(masks[i]);
  }
  const double units = static_cast<double>(kept / unit);
  Json truncation = {{"max_tokens", o.max_tokens},
                     {"policy", o.drop_long ? "drop" : "truncate"},
                     {"truncated", truncated},
                     {"dropped_too_long", dropped_long},
                     {"dropped_no_scored_token_after_cut", dropped_unscored}};
  report = {{fmt::format("{}_encoded", what), units_encoded},
            {what, kept / unit},
            {"truncation", truncation},
            {"tokens", tokens},
            {"scored_tokens", scored},
            {"scored_token_share", tokens ? double(scored) / double(tokens) : 0.0}};
  if (!preference) {
    const uint64_t prompt = tokens - scored - kept;  // the rest, less one end-of-sequence id each
    report["mean_tokens_per_conversation"] = double(tokens) / units;
    report["mean_prompt_tokens"] = double(prompt) / units;
    report["mean_response_tokens"] = double(scored) / units;
    return masks;
  }
  // Preference: "truncated" counts halves cut, the drops count pairs. The prompt is counted once per pair
  // (its halves share it); the length figures are of the replies as trained, after any cut.
  report["truncation"]["pairs_with_a_cut_half"] = units_truncated;
  uint64_t prompt = 0, chosen = 0, rejected = 0, chosen_longer = 0, rejected_longer = 0;
  for (size_t i = 0; i < kept; i += 2) {
    const uint64_t c = scored_in(masks[i]), r = scored_in(masks[i + 1]);
    prompt += encoded[i].size() - c - 1;  // the chosen half less its reply and end-of-sequence id
    chosen += c;
    rejected += r;
    chosen_longer += c > r;
    rejected_longer += r > c;
  }
  report["mean_tokens_per_pair"] = double(tokens) / units;
  report["mean_prompt_tokens"] = double(prompt) / units;
  report["mean_chosen_response_tokens"] = double(chosen) / units;
  report["mean_rejected_response_tokens"] = double(rejected) / units;
  report["length_bias"] = {{"chosen_longer_share", double(chosen_longer) / units},
                           {"rejected_longer_share", double(rejected_longer) / units},
                           {"same_length_share", double(kept / 2 - chosen_longer - rejected_longer) / units}};
  return masks;
}

// Preference: each pair Document (both rendered halves) becomes its two halves, chosen then rejected, with
// the pair's source, license and domain. Done after the cleaning stages, which must see pairs whole.
Corpus split_pairs(Corpus&& pairs) {
  Corpus halves;
  halves.domains = std::move(pairs.domains);
  halves.docs.reserve(2 * pairs.docs.size());
  for (Document& pair : pairs.docs) {
    const auto [chosen, rejected] = split_preference_pair(pair.text, pair.source);
    Document half = pair, other = pair;  // source, license, domain and language of the pair
    half.text = chosen;
    other.text = rejected;
    halves.docs.push_back(std::move(half));
    halves.docs.push_back(std::move(other));
  }
  return halves;
}

// The validation split of a preference corpus (halves, in pairs): decided per pair on the text the
// cleaning stages saw, so both halves go the same way.
std::vector<uint8_t> pair_valid_split(const Corpus& halves, double fraction, uint64_t seed) {
  Corpus pairs;
  pairs.domains = halves.domains;
  pairs.docs.reserve(halves.docs.size() / 2);
  for (size_t i = 0; i + 1 < halves.docs.size(); i += 2) {
    const Document& c = halves.docs[i];
    Document pair = c;
    pair.text = c.text + std::string(kPairSeparator) + halves.docs[i + 1].text;
    pairs.docs.push_back(std::move(pair));
  }
  const std::vector<uint8_t> per_pair = assign_valid_split(pairs, fraction, seed);
  std::vector<uint8_t> valid(halves.docs.size());
  for (size_t i = 0; i < valid.size(); ++i) valid[i] = per_pair[i / 2];
  return valid;
}

// What the shards of one rank hold, added up over the ranks for the report.
struct ShardTally {
  explicit ShardTally(const Manifest& m) : unigram(m.vocab_size) {
    for (const auto& l : m.languages) language_tokens[l] = 0;
  }
  std::vector<uint64_t> unigram;
  Json domain_stats = Json::object(), language_tokens = Json::object();
  uint64_t tokens = 0, shards = 0;
};

// Image-text: the placeholder id, positions per picture and picture side, and the pictures the documents
// index.
struct ImageRuns {
  uint32_t id = 0, tokens = 0, size = 0;
  const std::vector<CorpusImage>* pictures = nullptr;
};

// A document's pictures into a shard, before its tokens: each run of `tokens` placeholder ids is one picture,
// in order. (A distributed prepare reads text only, so a document's pictures never travel between ranks.)
void append_images(ShardData& data, const Document& doc, const std::vector<uint32_t>& ids,
                   const ImageRuns& images) {
  size_t next = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] != images.id) continue;
    if (next == doc.images.size())
      fail(ExitCode::kData, "{}: more picture runs than pictures (internal)", doc.source);
    data.image_positions.push_back(data.tokens.size() + t);
    const auto& rgb = (*images.pictures)[doc.images[next++]].rgb;
    data.images.insert(data.images.end(), rgb.begin(), rgb.end());
    t += images.tokens - 1;
  }
  if (next != doc.images.size())
    fail(ExitCode::kData, "{}: {} picture runs for {} pictures (internal)", doc.source, next,
         doc.images.size());
}

// Shards: one stream per (split, domain), cut at document boundaries every shard_tokens tokens; in a
// preference stream only after a rejected half, so a pair never straddles two shards (the reader batches
// pairs within a shard). Distributed, the cuts are those of one process: the ranks decide theirs in rank
// order, each handing the next the state of every stream's open shard; a shard is written by the rank
// holding its first document, which the following ranks send the rest of its documents. Adds the entries to
// m.shards on rank 0, in manifest order.
void write_shards(const Corpus& corpus, const std::vector<std::vector<uint32_t>>& encoded,
                  const std::vector<std::vector<uint8_t>>& masks, const std::vector<uint8_t>& valid,
                  Manifest& m, const std::string& tokenizer_sha256, const fs::path& partial,
                  uint64_t shard_tokens, bool preference, const ImageRuns* images, ShardTally& tally,
                  Ranks& ranks) {
  const size_t domains = corpus.domains.size(), streams = 2 * domains;  // train streams, then valid ones
  const auto stream_of = [&](size_t i) { return (valid[i] ? domains : 0) + corpus.docs[i].domain; };
  struct Open {  // the shard a stream is filling
    uint64_t tokens = 0, docs = 0;
    uint32_t seq = 0;    // its number (the next one's when no shard is open)
    int32_t owner = -1;  // the rank holding its first document; -1: none open
  };
  std::vector<Open> open(streams);
  struct Place {
    uint32_t seq;
    int32_t owner;
  };
  std::vector<Place> place(corpus.docs.size());
  const auto cut = [&] {
    for (size_t i = 0; i < corpus.docs.size(); ++i) {
      Open& o = open[stream_of(i)];
      if (o.owner < 0) o = {0, 0, o.seq, ranks.rank()};
      place[i] = {o.seq, o.owner};
      o.tokens += encoded[i].size();
      ++o.docs;
      if (o.tokens >= shard_tokens && (!preference || o.docs % 2 == 0)) o = {0, 0, o.seq + 1, -1};
    }
  };
  for (int turn = 0; turn < ranks.size(); ++turn) {
    if (turn == ranks.rank()) cut();
    if (turn + 1 == ranks.size()) break;
    std::vector<std::string> blocks(static_cast<size_t>(ranks.size()));
    if (turn == ranks.rank())
      blocks[static_cast<size_t>(turn + 1)].assign(reinterpret_cast<const char*>(open.data()),
                                                   open.size() * sizeof(Open));
    const auto got = ranks.exchange(std::move(blocks));
    if (turn + 1 == ranks.rank())
      std::memcpy(open.data(), got[static_cast<size_t>(turn)].data(), open.size() * sizeof(Open));
  }
  // The shards this rank writes, and the documents of shards other ranks write.
  std::map<std::pair<size_t, uint32_t>, ShardData> mine;  // (stream, seq) -> data
  Outbox continued(ranks.size());
  const auto append = [&](ShardData& data, uint16_t domain, uint16_t license, uint16_t language,
                          const uint32_t* ids, size_t n, const uint8_t* mask) {
    data.tokens.insert(data.tokens.end(), ids, ids + n);
    if (mask) data.loss_mask.insert(data.loss_mask.end(), mask, mask + n);
    data.doc_offsets.push_back(data.tokens.size());
    data.doc_domains.push_back(domain);
    data.doc_licenses.push_back(license);
    if (!m.languages.empty()) data.doc_languages.push_back(language);
  };
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const Document& doc = corpus.docs[i];
    const auto license = static_cast<uint16_t>(
        std::find(m.licenses.begin(), m.licenses.end(), doc.license.empty() ? "unknown" : doc.license) -
        m.licenses.begin());
    const auto language = static_cast<uint16_t>(
        std::lower_bound(m.languages.begin(), m.languages.end(), doc.language) - m.languages.begin());
    const std::vector<uint32_t>& ids = encoded[i];
    const uint8_t* mask = masks.empty() ? nullptr : masks[i].data();
    if (place[i].owner == ranks.rank()) {
      ShardData& data = mine[{stream_of(i), place[i].seq}];
      if (images) append_images(data, doc, ids, *images);
      append(data, doc.domain, license, language, ids.data(), ids.size(), mask);
    } else {
      Packer& p = continued.to[static_cast<size_t>(place[i].owner)];
      p.put<uint64_t>(stream_of(i))
          .put(place[i].seq)
          .put(doc.domain)
          .put(license)
          .put(language)
          .put<uint64_t>(ids.size());
      p.bytes().append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint32_t));
      if (mask) p.bytes().append(reinterpret_cast<const char*>(mask), ids.size());
    }
    // The report's figures, counted where the document is.
    for (uint32_t id : ids) ++tally.unigram[id];
    Json& ds = tally.domain_stats[corpus.domains[doc.domain]];
    if (ds.is_null()) ds = {{"documents", 0}, {"tokens", 0}, {"valid_documents", 0}, {"valid_tokens", 0}};
    ds["documents"] = ds["documents"].get<uint64_t>() + 1;
    ds["tokens"] = ds["tokens"].get<uint64_t>() + ids.size();
    if (valid[i]) {
      ds["valid_documents"] = ds["valid_documents"].get<uint64_t>() + 1;
      ds["valid_tokens"] = ds["valid_tokens"].get<uint64_t>() + ids.size();
    }
    if (!m.languages.empty()) {
      Json& n = tally.language_tokens[doc.language];
      n = n.get<uint64_t>() + ids.size();
    }
    tally.tokens += ids.size();
  }
  for (const auto& block : ranks.exchange(continued.blocks()))  // later ranks, in order
    for (Unpacker in(block); !in.done();) {
      const auto stream = in.get<uint64_t>();
      const auto seq = in.get<uint32_t>();
      const auto domain = in.get<uint16_t>(), license = in.get<uint16_t>(), language = in.get<uint16_t>();
      const auto n = in.get<uint64_t>();
      std::vector<uint32_t> ids(n);
      for (auto& id : ids) id = in.get<uint32_t>();
      std::vector<uint8_t> mask;
      if (!masks.empty()) {
        mask.resize(n);
        for (auto& b : mask) b = in.get<uint8_t>();
      }
      append(mine[{stream, seq}], domain, license, language, ids.data(), n,
             mask.empty() ? nullptr : mask.data());
    }
  Packer entries;
  for (const auto& [key, data] : mine) {
    const auto [stream, seq] = key;
    const std::string split = stream >= domains ? "valid" : "train";
    const std::string& domain = corpus.domains[stream % domains];
    const std::string rel = fmt::format("shards/{}-{}-{:05d}.h5", split, domain, seq);
    const std::string path = (partial / rel).string();
    ShardAttrs attrs{kShardSchemaVersion, split, domain, tokenizer_sha256, m.vocab_size};
    if (images) {
      attrs.image_size = images->size;
      attrs.image_tokens = images->tokens;
    }
    write_shard(path, data, attrs, m.token_bytes);
    entries.put<uint64_t>(stream)
        .put(seq)
        .put(std::string_view(rel))
        .put(std::string_view(xxh3_file_hex(path)))
        .put<uint64_t>(fs::file_size(path))
        .put<uint64_t>(data.tokens.size())
        .put<uint64_t>(data.documents());
    ++tally.shards;
  }
  std::vector<std::string> to_root(static_cast<size_t>(ranks.size()));
  to_root[0] = std::move(entries.bytes());
  const auto gathered = ranks.exchange(std::move(to_root));
  if (ranks.rank() != 0) return;
  std::vector<std::tuple<uint64_t, uint32_t, ShardEntry>> all;
  for (const auto& block : gathered)
    for (Unpacker in(block); !in.done();) {
      const auto stream = in.get<uint64_t>();
      const auto seq = in.get<uint32_t>();
      ShardEntry e;
      e.file = in.str();
      e.xxh3 = in.str();
      e.bytes = in.get<uint64_t>();
      e.tokens = in.get<uint64_t>();
      e.documents = in.get<uint64_t>();
      e.split = stream >= domains ? "valid" : "train";
      e.domain = corpus.domains[stream % domains];
      all.emplace_back(stream, seq, std::move(e));
    }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  });
  for (auto& [stream, seq, e] : all) m.shards.push_back(std::move(e));
}

// --chat-template: the model's template, tried on a probe conversation (one user message, one reply) so
// that a template the engine cannot render fails here, before any work, and not on every document.
ChatTemplate load_model_template(const std::string& path, bool preference) {
  ChatTemplate t = ChatTemplate::load(path);
  const ChatMessage probe[] = {{ChatRole::kUser, "Hello."}, {ChatRole::kAssistant, "Hi."}};
  size_t scored = 0;
  try {
    for (const ChatSegment& s : t.segments(probe, preference ? ScoredReplies::kFinal : ScoredReplies::kAll))
      scored += s.scored;
  } catch (const Error& e) {
    if (e.code() != ExitCode::kData) throw;
    fail(ExitCode::kData,
         "--chat-template {}: the template cannot render a probe conversation (one user message and one "
         "assistant reply), so it would fail on every one: {}; nothing written",
         path, e.what());
  }
  if (scored != 1)
    fail(ExitCode::kData,
         "--chat-template {}: the template renders no assistant reply of a probe conversation (one user "
         "message and one reply); nothing written",
         path);
  return t;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& o, Ranks& ranks) {
  check_destination(o);
  // A prompt set (prompts.h) is not tokenized and has a pipeline of its own.
  if (o.ingest.format == kPromptsFormat) {
    if (ranks.size() > 1)
      fail(ExitCode::kUsage,
           "--format prompts: a distributed prepare reads text datasets only; run one process (a prompt set "
           "is small)");
    return prepare_prompt_set(o);
  }
  check_options(o);
  // Chat and preference data: the chat template, a loss mask, no prose filters. A preference dataset's
  // documents go in pairs.
  const bool preference = o.ingest.format == "preference";
  const bool image_text = o.ingest.format == kImageTextFormat;
  const bool chat = o.ingest.format == "chat" || preference || image_text;
  const std::string unit = preference ? "pair" : "conversation";
  if (chat && ranks.size() > 1)
    fail(ExitCode::kUsage,
         "--format {}: a distributed prepare reads text datasets only; run one process (a chat, "
         "preference or image-text corpus is small next to pretraining text)",
         o.ingest.format);
  // A given tokenizer without the chat markers is a usage error for forge's template; say so before any
  // work is done. A model's template is loaded and tried before any work too: one the engine cannot render
  // would fail on every document.
  std::optional<ChatTemplate> model_template;
  if (!o.chat_template.empty())
    model_template.emplace(load_model_template(o.chat_template, preference));
  else if (chat && !o.tokenizer_model.empty())
    chat_marker_ids(Tokenizer::load(o.tokenizer_model), o.tokenizer_model);
  if (image_text && !o.tokenizer_model.empty())
    image_token_id(Tokenizer::load(o.tokenizer_model), o.tokenizer_model);
  const double t_start = now_s(), cpu_start = cpu_s();
  Json stages = Json::object();
  // Every check on what is left is of the whole corpus, so every rank fails the same way.
  const auto require_docs = [&](const Corpus& c, const char* stage, const Json& counters) {
    if (ranks.sum(c.docs.size()) == 0)
      fail(ExitCode::kData, "no documents left after {} ({}); nothing written", stage,
           counters.contains("removed") ? counters["removed"].dump() : std::string("no input documents"));
  };

  const NgramIndex eval_index = load_eval_sets(o.eval_sets, o.decontam_ngram);
  std::vector<std::string> eval_hashes;
  for (const auto& e : o.eval_sets) eval_hashes.push_back(sha256_file_hex(e));
  std::sort(eval_hashes.begin(), eval_hashes.end());
  // The safety list is read and compiled before any work, so a bad line fails at once (exit 64); the PII
  // patterns too, so the stage's rate is that of scanning.
  std::optional<PiiScanner> pii_scanner;
  if (o.pii.enabled) pii_scanner.emplace();
  std::optional<SafetyFilter> safety;
  if (!o.safety.list.empty()) safety.emplace(SafetyFilter::load(o.safety.list));

  Corpus corpus;
  IngestStats ist;
  double t = now_s(), cpu = cpu_s();
  ingest(o.inputs, o.ingest, corpus, ist, ranks);
  {
    Json st = ist.to_json();
    st["seconds"] = now_s() - t;
    st["cpu_seconds"] = cpu_s() - cpu;
    stages["ingest"] = merged(ranks, st);
    Json& m = stages["ingest"];
    m["mb_per_s"] = m["bytes_in"].get<double>() / 1e6 / std::max(1e-9, m["seconds"].get<double>());
    m["mb_per_cpu_s"] = m["bytes_in"].get<double>() / 1e6 / std::max(1e-9, m["cpu_seconds"].get<double>());
  }
  const Json& ingested = stages["ingest"];
  if (chat && corpus.docs.empty())
    fail(ExitCode::kData,
         "the inputs hold no usable {} ({} files, {} lines: {} malformed, degenerate {}, ingest removed {}); "
         "nothing written",
         unit, ist.files, ist.chat.lines, ist.chat.malformed_lines, ist.chat.to_json()["degenerate"].dump(),
         ingested["removed"].dump());
  if (ingested["documents_in"].get<uint64_t>() == 0)
    fail(ExitCode::kData,
         "the inputs hold no documents ({} files read, {} skipped by extension); nothing written",
         ingested["files"].get<uint64_t>(), ingested["skipped_files_by_extension"].get<uint64_t>());
  require_docs(corpus, "ingest", ingested);
  // Each stage records the bytes it was given and its rate, for the report and bench/data_prepare.sh,
  // and its documents in and out per domain, the common measure `forge-data compare` attributes changes by.
  // A distributed prepare merges the ranks' reports (wall seconds: the slowest rank's).
  const auto per_domain = [&] {
    std::vector<uint64_t> n(corpus.domains.size());
    for (const auto& d : corpus.docs) ++n[d.domain];
    return n;
  };
  const auto run = [&](const char* name, const auto& stage) {
    uint64_t bytes = 0;
    for (const auto& d : corpus.docs) bytes += d.text.size();
    const std::vector<uint64_t> before = per_domain();
    const double t0 = now_s(), cpu0 = cpu_s();
    Json st = stage();
    if (!st.contains("seconds")) st["seconds"] = now_s() - t0;
    const std::vector<uint64_t> after = per_domain();
    for (size_t d = 0; d < before.size(); ++d)
      st["documents_by_domain"][corpus.domains[d]] = {{"in", before[d]}, {"out", after[d]}};
    st["bytes_in"] = bytes;
    st["cpu_seconds"] = cpu_s() - cpu0;
    st = merged(ranks, st);
    st["mb_per_s"] = st["bytes_in"].get<double>() / 1e6 / std::max(1e-9, st["seconds"].get<double>());
    st["mb_per_cpu_s"] = st["bytes_in"].get<double>() / 1e6 / std::max(1e-9, st["cpu_seconds"].get<double>());
    stages[name] = st;
  };
  run("normalize", [&] { return normalize(corpus); });
  require_docs(corpus, "normalize", stages["normalize"]);
  // PII and safety come after normalize, which turns Unicode spaces into ' ' and removes zero-width
  // characters that would split an address or a number, and before dedup, so that documents differing only
  // in their PII (a template mailed to many addresses) become exact duplicates, and no later stage, report
  // example or tokenizer sample sees the PII or the removed documents.
  if (pii_scanner) {
    run("pii", [&] { return redact_pii(corpus, *pii_scanner, o.pii); });
    require_docs(corpus, "PII removal", stages["pii"]);
  }
  if (safety) {
    run("safety", [&] { return safety_filter(corpus, *safety, o.safety); });
    require_docs(corpus, "the safety filter", stages["safety"]);
  } else {
    stages["safety"] = {{"skipped", "no safety.list given"}, {"removed", Json::object()}};
  }
  if (o.language.enabled) {
    run("language", [&] { return identify_languages(corpus, o.language); });
    require_docs(corpus, "the language allow-list", stages["language"]);
  } else {
    stages["language"] = {{"skipped", "language.enabled = false"}, {"removed", Json::object()}};
  }
  // Before exact dedup, which would take from a fork the very files that show it is one.
  const uint64_t with_repo = ranks.sum(static_cast<uint64_t>(std::count_if(
      corpus.docs.begin(), corpus.docs.end(), [](const Document& d) { return !d.repo.empty(); })));
  if (with_repo > 0)
    run("repository", [&] { return dedup_repositories(corpus, o.repository, ranks); });
  else
    stages["repository"] = {{"skipped", "no document names a repository"}, {"removed", Json::object()}};
  if (image_text) {
    // The text stages' unit, the text, would call two questions about two pictures duplicates.
    for (const char* stage : {"exact_dedup", "near_dedup"})
      stages[stage] = {{"skipped", "image-text: deduplicated as text with its pictures (image_dedup)"},
                       {"removed", Json::object()}};
    run("image_dedup", [&] { return dedup_image_text(corpus, o.minhash, o.ingest.image.near_distance); });
  } else {
    run("exact_dedup", [&] { return exact_dedup(corpus, ranks); });
    if (o.near_dedup) run("near_dedup", [&] { return near_dedup(corpus, o.minhash, ranks); });
  }
  if (chat) {
    stages["filters"] = {{"skipped", filters_skipped(o.ingest.format)}, {"removed", Json::object()}};
  } else {
    run("filters", [&] { return apply_filters(corpus, o.filters); });
    require_docs(corpus, "the quality filters", stages["filters"]);
  }
  run("license", [&] { return apply_license_policy(corpus, o.license); });
  require_docs(corpus, "the license allow-list", stages["license"]);
  run("decontam", [&] { return decontaminate(corpus, eval_index, o.eval_sets); });
  require_docs(corpus, "decontamination", stages["decontam"]);
  if (image_text) {
    const std::vector<uint64_t> eval_pictures = load_eval_images(o.eval_sets, o.ingest.image);
    run("image_decontam",
        [&] { return decontaminate_images(corpus, eval_pictures, o.ingest.image.near_distance); });
    require_docs(corpus, "picture decontamination", stages["image_decontam"]);
  }
  // From here on a preference corpus holds the halves, in pairs: the tokenizer trains on what is encoded.
  const uint64_t pairs_cleaned = preference ? corpus.docs.size() : 0;
  if (preference) corpus = split_pairs(std::move(corpus));

  // Rank 0 makes the directory the dataset is built in, on storage every rank sees.
  const fs::path out(o.out);
  std::string partial_name;
  if (ranks.rank() == 0) {
    partial_name =
        (out.parent_path() / (out.filename().string() + ".partial-" + std::to_string(::getpid()))).string();
    fs::remove_all(partial_name);
    fs::create_directories(fs::path(partial_name) / "shards");
  }
  const fs::path partial = ranks.all_gather(partial_name)[0];
  try {
    // Tokenizer: trained on rank 0 from the documents its sample takes, wherever they are.
    t = now_s();
    cpu = cpu_s();
    // A given tokenizer is kept under its own kind's name (tokenizer.model, tokenizer.json).
    std::optional<Tokenizer> trained, given;
    if (!o.tokenizer_model.empty()) given.emplace(Tokenizer::load(o.tokenizer_model));
    if (given && given->eos_id() < 0)
      fail(ExitCode::kUsage, "--tokenizer {}: has no end-of-sequence token (documents end with one)",
           o.tokenizer_model);
    const std::string model_path = (partial / (given ? given->file_name() : "tokenizer.model")).string();
    if (given) {
      if (ranks.rank() == 0) write_file_atomic(model_path, read_file(o.tokenizer_model));
    } else {
      const Placement at = place(ranks, corpus.docs.size());
      uint64_t bytes = 0;
      for (const auto& d : corpus.docs) bytes += d.text.size();
      const uint64_t stride = Tokenizer::sample_stride(ranks.sum(bytes), o.tokenizer.sample_bytes);
      Packer sampled;
      for (uint64_t g = (at.first + stride - 1) / stride * stride; g < at.first + corpus.docs.size();
           g += stride)
        sampled.put(std::string_view(corpus.docs[g - at.first].text));
      std::vector<std::string> to_root(static_cast<size_t>(ranks.size()));
      to_root[0] = std::move(sampled.bytes());
      const auto gathered = ranks.exchange(std::move(to_root));
      if (ranks.rank() == 0) {
        Corpus sample;
        for (const auto& block : gathered)
          for (Unpacker in(block); !in.done();) sample.docs.emplace_back().text = in.str();
        TokenizerTrainOptions train = o.tokenizer;
        train.image_placeholder |= image_text;
        trained.emplace(Tokenizer::train(sample, train, model_path, 1));
      }
    }
    ranks.all_gather("");  // the model is written
    Tokenizer tok = trained ? std::move(*trained) : given ? std::move(*given) : Tokenizer::load(model_path);
    const double train_seconds = o.tokenizer_model.empty() ? now_s() - t : 0.0;
    const double train_cpu_seconds = o.tokenizer_model.empty() ? cpu_s() - cpu : 0.0;

    // Encode (then, for chat and preference, mask and truncate), then split: the split only looks at the
    // documents' text, so for text datasets the order does not matter, and conversations or pairs dropped
    // by truncation must not take a place in the validation split.
    t = now_s();
    cpu = cpu_s();
    const int threads =
        o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::optional<TemplateEncoding> by_template;
    if (model_template) {
      by_template.emplace();
      by_template->chat_template = &*model_template;
      by_template->scored = preference ? ScoredReplies::kFinal : ScoredReplies::kAll;
    }
    auto encoded = encode_all(corpus, tok, threads, by_template ? &*by_template : nullptr);
    // Each picture's placeholder becomes its run of positions before masks and --max-tokens see the ids.
    std::optional<uint32_t> image_id;
    if (image_text) {
      image_id = image_token_id(tok, o.tokenizer_model.empty() ? model_path : o.tokenizer_model);
      std::vector<uint8_t> none;
      for (size_t i = 0; i < encoded.size(); ++i)
        expand_image_tokens(encoded[i], by_template ? by_template->masks[i] : none, *image_id,
                            o.ingest.image.tokens());
    }
    {
      uint64_t bytes = 0;
      for (const auto& d : corpus.docs) bytes += d.text.size();
      Json st = {{"source", o.tokenizer_model.empty() ? "trained" : o.tokenizer_model},
                 {"vocab_size", tok.vocab_size()},
                 {"sha256", tok.sha256()},
                 {"train_seconds", train_seconds},
                 {"train_cpu_seconds", train_cpu_seconds},
                 {"encode_seconds", now_s() - t},
                 {"encode_bytes_in", bytes},
                 {"encode_cpu_seconds", cpu_s() - cpu},
                 {"encode_threads", threads}};
      st = merged(ranks, st);
      st["encode_mb_per_s"] =
          st["encode_bytes_in"].get<double>() / 1e6 / std::max(1e-9, st["encode_seconds"].get<double>());
      st["encode_mb_per_cpu_s"] =
          st["encode_bytes_in"].get<double>() / 1e6 / std::max(1e-9, st["encode_cpu_seconds"].get<double>());
      stages["tokenizer"] = st;
    }
    std::vector<std::vector<uint8_t>> masks;
    Json chat_report;
    if (chat) {
      std::optional<ChatMarkerIds> markers;
      if (!model_template)
        markers = chat_marker_ids(tok, o.tokenizer_model.empty() ? model_path : o.tokenizer_model);
      TemplateDrops drops;
      masks = masks_and_truncation(corpus, encoded, markers ? &*markers : nullptr,
                                   by_template ? &*by_template : nullptr, static_cast<uint32_t>(tok.eos_id()),
                                   o.chat, preference, drops, chat_report);
      chat_report.update(ist.chat.to_json());
      chat_report["malformed_lines"]["max_fraction"] = o.ingest.max_bad_lines;
      chat_report["template"] = kChatTemplateName;
      chat_report["template_sha256"] = chat_template_sha256();
      if (model_template) {
        // Conversations (pairs) the template cannot segment count as degenerate, by reason.
        for (const auto& [reason, n] : drops.by_reason) chat_report["degenerate"][reason] = n;
        chat_report["template"] = model_template->name();
        chat_report["template_sha256"] = model_template->sha256();
        chat_report["model_template"] = model_template->to_json();
        chat_report["model_template"]["dropped"] = drops.total;
        chat_report["model_template"]["first_dropped"] = drops.first;
      }
      chat_report["filters"] = filters_skipped(o.ingest.format);
      if (preference) chat_report["pairs_after_cleaning"] = pairs_cleaned;
      if (image_text) chat_report["images"] = ist.images.to_json();
    }
    // A cut inside a picture's run drops the picture: its positions and the document's reference to it.
    if (image_id)
      for (size_t i = 0; i < encoded.size(); ++i)
        corpus.docs[i].images.resize(
            drop_partial_image(encoded[i], masks[i], *image_id, o.ingest.image.tokens()));
    const std::vector<uint8_t> valid =
        preference ? pair_valid_split(corpus, o.valid_fraction, o.split_seed)
                   : assign_valid_split(corpus, o.valid_fraction, o.split_seed, ranks);

    // Licenses: index 0 is "unknown", the rest sorted so ids do not depend on document order; languages
    // sorted. Both over every rank's documents.
    std::set<std::string> license_set, language_set;
    {
      Packer names;
      for (const auto& d : corpus.docs) {
        if (!d.license.empty() && license_set.insert(d.license).second)
          names.put<uint8_t>(0).put(std::string_view(d.license));
        if (o.language.enabled && language_set.insert(d.language).second)
          names.put<uint8_t>(1).put(std::string_view(d.language));
      }
      for (const auto& block : ranks.all_gather(names.bytes()))
        for (Unpacker in(block); !in.done();) {
          const auto kind = in.get<uint8_t>();
          (kind == 0 ? license_set : language_set).insert(in.str());
        }
    }
    Manifest m;
    m.licenses = {"unknown"};
    m.licenses.insert(m.licenses.end(), license_set.begin(), license_set.end());
    m.domains = corpus.domains;
    m.languages.assign(language_set.begin(), language_set.end());
    m.tokenizer_file = fs::path(model_path).filename().string();
    m.tokenizer_sha256 = tok.sha256();
    m.vocab_size = tok.vocab_size();
    m.eos_id = tok.eos_id();
    m.token_bytes = token_bytes_for_vocab(m.vocab_size);
    m.format = o.ingest.format;
    const std::optional<ImageRuns> runs =
        image_id ? std::optional<ImageRuns>(
                       {*image_id, o.ingest.image.tokens(), o.ingest.image.size, &corpus.images})
                 : std::nullopt;

    t = now_s();
    cpu = cpu_s();
    ShardTally tally(m);
    write_shards(corpus, encoded, masks, valid, m, tok.sha256(), partial, o.shard_tokens, preference,
                 runs ? &*runs : nullptr, tally, ranks);
    stages["shards"] = merged(ranks, {{"shards", tally.shards},
                                      {"token_dtype", m.token_bytes == 2 ? "uint16" : "uint32"},
                                      {"seconds", now_s() - t},
                                      {"cpu_seconds", cpu_s() - cpu}});
    Json domain_stats = merged(ranks, tally.domain_stats);
    const Json language_tokens = merged(ranks, tally.language_tokens);
    const uint64_t tokens_out = ranks.sum(tally.tokens);
    const uint64_t documents_out = ranks.sum(corpus.docs.size());
    // Unigram counts, added up on rank 0.
    {
      std::vector<std::string> to_root(static_cast<size_t>(ranks.size()));
      to_root[0].assign(reinterpret_cast<const char*>(tally.unigram.data()),
                        tally.unigram.size() * sizeof(uint64_t));
      const auto counts = ranks.exchange(std::move(to_root));
      if (ranks.rank() == 0)
        for (size_t r = 1; r < counts.size(); ++r)
          for (size_t id = 0; id < tally.unigram.size(); ++id) {
            uint64_t n;
            std::memcpy(&n, counts[r].data() + id * sizeof n, sizeof n);
            tally.unigram[id] += n;
          }
    }
    m.settings = settings_json(o, eval_hashes, o.tokenizer_model.empty() ? "trained" : "given",
                               model_template ? &*model_template : nullptr);
    if (image_id) m.settings["image"]["token_id"] = *image_id;
    m.version = m.compute_version();

    // Report, then the manifest last: a directory without manifest.json is not a dataset.
    for (auto& [name, ds] : domain_stats.items()) {
      ds["document_share"] = double(ds["documents"].get<uint64_t>()) / double(documents_out);
      ds["token_share"] = tokens_out ? double(ds["tokens"].get<uint64_t>()) / double(tokens_out) : 0.0;
    }
    const double total_s = now_s() - t_start,
                 total_cpu_s = ranks.sum(uint64_t((cpu_s() - cpu_start) * 1e6)) / 1e6;
    const uint64_t bytes_in = ingested["bytes_in"].get<uint64_t>();
    Json quality = {{"dataset", o.out}, {"stages", stages}};
    quality["summary"] = {
        {"version", m.version},
        {"documents_in", ingested["documents_in"]},
        {"bytes_in", bytes_in},
        {"documents_out", documents_out},
        {"tokens_out", tokens_out},
        {"domains", domain_stats},
        {"languages", language_shares(language_tokens, tokens_out)},
        {"token_distribution", token_distribution(tally.unigram, &tok)},
        {"seconds", total_s},
        {"tokenizer_train_seconds", train_seconds},
        {"mb_per_s_excluding_tokenizer_training", bytes_in / 1e6 / std::max(1e-9, total_s - train_seconds)},
        {"cpu_seconds", total_cpu_s},
        {"mb_per_cpu_s_excluding_tokenizer_training",
         bytes_in / 1e6 / std::max(1e-9, total_cpu_s - train_cpu_seconds)},
        {"peak_rss_bytes", peak_rss_bytes()}};
    if (ranks.size() > 1) {
      // What each rank did, and what distributing cost: the bytes the ranks exchanged per input byte.
      const Json mine = {{"rank", ranks.rank()},
                         {"node", node_name()},
                         {"files", ist.files},
                         {"bytes_in", ist.bytes_in},
                         {"documents_in", ist.documents_in},
                         {"documents_out", corpus.docs.size()},
                         {"tokens_out", tally.tokens},
                         {"shards_written", tally.shards},
                         {"cpu_seconds", cpu_s() - cpu_start},
                         {"bytes_sent", ranks.bytes_sent()}};
      Json split = Json::array();
      uint64_t exchanged = 0;
      for (const auto& part : ranks.all_gather(mine.dump())) {
        split.push_back(Json::parse(part));
        exchanged += split.back()["bytes_sent"].get<uint64_t>();
      }
      quality["summary"]["distributed"] = {
          {"ranks", ranks.size()},
          {"exchanged_bytes", exchanged},
          {"exchanged_bytes_per_input_byte", double(exchanged) / double(std::max<uint64_t>(1, bytes_in))},
          {"work_split", split}};
    }
    if (chat) quality[o.ingest.format] = chat_report;
    quality["inputs"] = Json::array();
    for (const auto& in : o.inputs) quality["inputs"].push_back({{"path", in.path}, {"domain", in.domain}});
    const std::string summary = quality_summary(quality);
    if (ranks.rank() == 0) {
      write_json_atomic((partial / "quality.json").string(), quality);
      write_file_atomic((partial / "quality.txt").string(), summary);
      write_manifest(partial.string(), m);
      std::error_code ec;
      if (fs::exists(out, ec)) fs::remove(out);  // an empty directory (checked above)
      fs::rename(partial, out);
      fsync_dir(fs::absolute(out).parent_path().string());
    }
    ranks.all_gather("");  // published
    return {o.out, m.version, summary, quality};
  } catch (...) {
    std::error_code ec;
    if (ranks.rank() == 0) fs::remove_all(partial, ec);
    throw;
  }
}

}  // namespace forge::data
