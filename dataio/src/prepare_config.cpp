#include "forge/common/error.h"
#include "forge/dataio/prepare.h"

#include <sstream>

namespace forge::data {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace

ConfigSchema prepare_schema() {
  const IngestOptions in;
  const MinHashOptions mh;
  const FilterOptions f;
  const TokenizerTrainOptions tok;
  const ImageOptions img;
  ConfigSchema s;
  s.add<std::string>("ingest.extensions",
                     "txt,text,md,rst,jsonl,py,c,h,cc,cpp,hpp,rs,go,java,js,ts,sh,pl,rb,lua,tex,man",
                     "file extensions read from input directories (comma-separated, no dots)")
      .add<int64_t>("ingest.max_doc_bytes", static_cast<int64_t>(in.max_doc_bytes),
                    "larger documents are dropped")
      .add<int64_t>("ingest.max_line_bytes", static_cast<int64_t>(in.max_line_bytes),
                    "a document with a longer line is dropped")
      .add<double>("ingest.max_invalid_utf8", in.max_invalid_utf8,
                   "fraction of invalid UTF-8 bytes above which a document is dropped (below: repaired)")
      .add<double>("ingest.max_nul", in.max_nul, "fraction of NUL bytes above which a document is binary")
      .add<std::string>("ingest.default_domain", in.default_domain, "domain of inputs given without =DOMAIN")
      .add<std::string>(
          "ingest.format", in.format,
          "text (documents), chat (JSONL conversations), preference (JSONL prompt/chosen/rejected "
          "pairs), image-text (JSONL captions or conversations about pictures) or prompts (JSONL prompts for "
          "RL, not tokenized); all but text read every input file as JSONL (docs/DATA.md)")
      .add<int>("ingest.repo_depth", in.repo_depth,
                "files of an input directory belong to the repository named by their first N directories "
                "below it (2 for DIR/owner/name/...; 0 = none); JSONL records use their \"repo\" field")
      .add<double>(
          "ingest.max_bad_lines", in.max_bad_lines,
          "chat, preference, image-text: fraction of malformed lines above which prepare fails (exit 65)")
      .add<bool>("near_dedup.enabled", true, "run MinHash near dedup")
      .add<int>("near_dedup.ngram", mh.ngram, "words per shingle")
      .add<int>("near_dedup.bands", mh.bands, "LSH bands (0 with rows = 0: chosen from the threshold)")
      .add<int>("near_dedup.rows", mh.rows,
                "MinHash values per band (0 with bands = 0: chosen from the threshold)")
      .add<double>("near_dedup.threshold", mh.threshold,
                   "Jaccard similarity from which a pair is a near duplicate (docs/DATA.md)")
      .add<int64_t>("near_dedup.seed", static_cast<int64_t>(mh.seed), "seed of the hash functions")
      .add<std::string>("filters.code_domains", "code",
                        "domains filtered with the code rules (comma-separated)")
      .add<int>("filters.min_words", f.min_words, "prose: fewer words is removed")
      .add<int>("filters.max_words", f.max_words, "prose: more words is removed")
      .add<double>("filters.min_mean_word_length", f.min_mean_word_length, "prose")
      .add<double>("filters.max_mean_word_length", f.max_mean_word_length, "prose")
      .add<double>("filters.max_symbol_word_ratio", f.max_symbol_word_ratio, "prose: '#' and '...' per word")
      .add<double>("filters.max_digit_ratio", f.max_digit_ratio, "prose: digits per visible character")
      .add<double>("filters.min_alpha_word_fraction", f.min_alpha_word_fraction, "prose")
      .add<double>("filters.max_bullet_line_fraction", f.max_bullet_line_fraction, "prose")
      .add<double>("filters.max_ellipsis_line_fraction", f.max_ellipsis_line_fraction, "prose")
      .add<double>("filters.max_duplicate_line_fraction", f.max_duplicate_line_fraction, "prose")
      .add<double>("filters.max_duplicate_line_char_fraction", f.max_duplicate_line_char_fraction, "prose")
      .add<double>("filters.max_top_2gram_fraction", f.max_top_2gram_fraction, "prose")
      .add<double>("filters.max_top_3gram_fraction", f.max_top_3gram_fraction, "prose")
      .add<double>("filters.max_top_4gram_fraction", f.max_top_4gram_fraction, "prose")
      .add<double>("filters.max_boilerplate_line_fraction", f.max_boilerplate_line_fraction, "prose")
      .add<int>("filters.max_code_line_length", f.max_code_line_length, "code: a longer line is removed")
      .add<double>("filters.max_code_mean_line_length", f.max_code_mean_line_length,
                   "code: minified above this")
      .add<double>("filters.min_code_alnum_fraction", f.min_code_alnum_fraction, "code")
      .add<int>("filters.code_min_lines", f.code_min_lines, "code: fewer lines is removed")
      .add<bool>("pii.enabled", true, "find e-mail addresses, phones, IPs, cards and secrets")
      .add_choice("pii.action", "redact", {"redact", "drop"},
                  "redact: replace each with a typed placeholder (<EMAIL>, ...); drop: remove the document")
      .add<std::string>("pii.types", "email,phone,ip,card,secret",
                        "the PII types looked for (comma-separated)")
      .add<std::string>("safety.list", "",
                        "word/pattern list of the harmful-content filter (\"\" = the filter does not run)")
      .add<double>("safety.threshold", SafetyOptions{}.threshold,
                   "documents scoring above it (weighted matches per 1000 words) are removed")
      .add<bool>("language.enabled", true, "identify each document's language (CLD2)")
      .add<std::string>("language.allow", "",
                        "languages kept per domain: DOMAIN:CODE|CODE,... (* = every other domain; \"\" = all "
                        "kept; un = unknown), e.g. web:en|de,*:en")
      .add<double>("repository.fork_threshold", RepositoryOptions{}.fork_threshold,
                   "a repository sharing at least this fraction of its files with an earlier one is its fork")
      .add<bool>("repository.drop_forks", false, "remove forks whole (else they join the origin's family)")
      .add<std::string>("license.allow", "",
                        "SPDX ids kept, comma-separated (unknown = no license detected; \"\" = all kept)")
      .add<int>("decontam.ngram", 13, "words an eval n-gram must share to contaminate a document")
      .add<int64_t>("tokenizer.sample_bytes", static_cast<int64_t>(tok.sample_bytes),
                    "bytes of cleaned text the tokenizer is trained on")
      .add<int>("tokenizer.threads", tok.threads, "threads for tokenizer training")
      .add<bool>("tokenizer.image_placeholder", false,
                 "reserve <image> in a trained tokenizer (always for image-text): a text model that will "
                 "take pictures later")
      .add<int64_t>("split.seed", 0, "seed of the document hash that picks the validation split")
      .add<int>("prepare.threads", 0, "threads for encoding (0 = all cores)")
      .add<int64_t>("chat.max_tokens", 0,
                    "chat, preference: most tokens of a conversation (of each half of a pair), "
                    "end-of-sequence id included (0 = no limit)")
      .add<std::string>("chat.truncate", "truncate",
                        "chat, preference: a longer conversation is cut to max_tokens (truncate) or left out "
                        "(drop; a pair with a longer half)")
      .add<int>("image.size", int(img.size),
                "image-text: the encoder's input side; pictures are stored size x size")
      .add<int>("image.patch", int(img.patch),
                "image-text: the encoder's patch side; a picture takes (size / patch)^2 token positions")
      .add_choice("image.fit", image_fit_name(img.fit), {"pad", "crop", "stretch"},
                  "image-text: how a picture that is not square is fitted (docs/DATA.md)")
      .add<int>("image.min_side", int(img.min_side),
                "image-text: a picture with a shorter side is dropped (tiny)")
      .add<double>("image.max_aspect", img.max_aspect,
                   "image-text: a picture whose longer side is more times its shorter is dropped")
      .add<int64_t>("image.max_pixels", static_cast<int64_t>(img.max_pixels),
                    "image-text: a larger picture is a bad line (too_large), refused before decoding")
      .add<int>("image.near_distance", img.near_distance,
                "image-text: perceptual-hash bits within which two pictures are near duplicates");
  return s;
}

void apply_config(const Config& c, PrepareOptions& o) {
  const auto positive = [&](const std::string& key, auto v) {
    if (v <= 0) c.reject(key, "must be positive");
    return v;
  };
  const auto fraction = [&](const std::string& key) {
    const double v = c.get<double>(key);
    if (!(v >= 0 && v <= 1)) c.reject(key, "must be between 0 and 1");
    return v;
  };
  o.ingest.extensions = split_list(c.get<std::string>("ingest.extensions"));
  o.ingest.max_doc_bytes =
      static_cast<size_t>(positive("ingest.max_doc_bytes", c.get<int64_t>("ingest.max_doc_bytes")));
  o.ingest.max_line_bytes =
      static_cast<size_t>(positive("ingest.max_line_bytes", c.get<int64_t>("ingest.max_line_bytes")));
  o.ingest.max_invalid_utf8 = fraction("ingest.max_invalid_utf8");
  o.ingest.max_nul = fraction("ingest.max_nul");
  o.ingest.default_domain = c.get<std::string>("ingest.default_domain");
  check_domain_name(o.ingest.default_domain, c.source("ingest.default_domain") + ": ingest.default_domain");
  o.ingest.format = c.get<std::string>("ingest.format");
  if (o.ingest.format != "text" && o.ingest.format != "chat" && o.ingest.format != "preference" &&
      o.ingest.format != kImageTextFormat && o.ingest.format != "prompts")
    c.reject("ingest.format", "must be text, chat, preference, image-text or prompts");
  ImageOptions& img = o.ingest.image;
  img.size = static_cast<uint32_t>(positive("image.size", c.get<int>("image.size")));
  img.patch = static_cast<uint32_t>(positive("image.patch", c.get<int>("image.patch")));
  if (img.size % img.patch != 0 || img.size < 8 || img.size > 4096)
    c.reject("image.size",
             fmt::format("{} must be 8..4096 and a multiple of image.patch ({})", img.size, img.patch));
  img.fit = parse_image_fit(c.get<std::string>("image.fit"));
  img.min_side = static_cast<uint32_t>(positive("image.min_side", c.get<int>("image.min_side")));
  img.max_aspect = c.get<double>("image.max_aspect");
  if (!(img.max_aspect >= 1)) c.reject("image.max_aspect", "must be at least 1");
  img.max_pixels = static_cast<uint64_t>(positive("image.max_pixels", c.get<int64_t>("image.max_pixels")));
  img.near_distance = c.get<int>("image.near_distance");
  if (img.near_distance < 0 || img.near_distance > 32) c.reject("image.near_distance", "must be 0..32");
  o.ingest.max_bad_lines = fraction("ingest.max_bad_lines");
  o.ingest.repo_depth = c.get<int>("ingest.repo_depth");
  if (o.ingest.repo_depth < 0) c.reject("ingest.repo_depth", "must be >= 0");
  o.near_dedup = c.get<bool>("near_dedup.enabled");
  o.minhash.ngram = positive("near_dedup.ngram", c.get<int>("near_dedup.ngram"));
  o.minhash.bands = c.get<int>("near_dedup.bands");
  o.minhash.rows = c.get<int>("near_dedup.rows");
  // 0 and 0: chosen from the threshold; a single 0 is a half-written explicit setting.
  const char* const banding = "must be at least 1, or 0 with the other of bands and rows 0 (automatic)";
  if (o.minhash.bands < 0 || (o.minhash.bands == 0 && o.minhash.rows != 0))
    c.reject("near_dedup.bands", banding);
  if (o.minhash.rows < 0 || (o.minhash.rows == 0 && o.minhash.bands != 0))
    c.reject("near_dedup.rows", banding);
  if (int64_t(o.minhash.bands) * o.minhash.rows > kMaxMinHashes)
    c.reject("near_dedup.rows", fmt::format("bands * rows must be at most {}", kMaxMinHashes));
  o.minhash.threshold = fraction("near_dedup.threshold");
  o.minhash.seed = static_cast<uint64_t>(c.get<int64_t>("near_dedup.seed"));
  auto& f = o.filters;
  f.code_domains = split_list(c.get<std::string>("filters.code_domains"));
  f.min_words = c.get<int>("filters.min_words");
  f.max_words = positive("filters.max_words", c.get<int>("filters.max_words"));
  f.min_mean_word_length = c.get<double>("filters.min_mean_word_length");
  f.max_mean_word_length = c.get<double>("filters.max_mean_word_length");
  f.max_symbol_word_ratio = c.get<double>("filters.max_symbol_word_ratio");
  f.max_digit_ratio = fraction("filters.max_digit_ratio");
  f.min_alpha_word_fraction = fraction("filters.min_alpha_word_fraction");
  f.max_bullet_line_fraction = fraction("filters.max_bullet_line_fraction");
  f.max_ellipsis_line_fraction = fraction("filters.max_ellipsis_line_fraction");
  f.max_duplicate_line_fraction = fraction("filters.max_duplicate_line_fraction");
  f.max_duplicate_line_char_fraction = fraction("filters.max_duplicate_line_char_fraction");
  f.max_top_2gram_fraction = fraction("filters.max_top_2gram_fraction");
  f.max_top_3gram_fraction = fraction("filters.max_top_3gram_fraction");
  f.max_top_4gram_fraction = fraction("filters.max_top_4gram_fraction");
  f.max_boilerplate_line_fraction = fraction("filters.max_boilerplate_line_fraction");
  f.max_code_line_length =
      positive("filters.max_code_line_length", c.get<int>("filters.max_code_line_length"));
  f.max_code_mean_line_length = c.get<double>("filters.max_code_mean_line_length");
  f.min_code_alnum_fraction = fraction("filters.min_code_alnum_fraction");
  f.code_min_lines = c.get<int>("filters.code_min_lines");
  o.pii.enabled = c.get<bool>("pii.enabled");
  o.pii.drop = c.get<std::string>("pii.action") == "drop";
  o.pii.types.fill(false);
  for (const auto& name : split_list(c.get<std::string>("pii.types")))
    o.pii.types[static_cast<size_t>(pii_type_from_name(name, c.source("pii.types") + ": pii.types"))] = true;
  o.safety.list = c.get<std::string>("safety.list");
  o.safety.threshold = c.get<double>("safety.threshold");
  if (!(o.safety.threshold >= 0)) c.reject("safety.threshold", "must be >= 0");
  o.language.enabled = c.get<bool>("language.enabled");
  o.language.allow = parse_language_allow(c.get<std::string>("language.allow"),
                                          c.source("language.allow") + ": language.allow");
  if (!o.language.enabled && !o.language.allow.empty())
    c.reject("language.allow", "needs language.enabled = true (the allow-list judges identified languages)");
  o.repository.fork_threshold = fraction("repository.fork_threshold");
  if (o.repository.fork_threshold == 0) c.reject("repository.fork_threshold", "must be above 0");
  o.repository.drop_forks = c.get<bool>("repository.drop_forks");
  o.license.allow.clear();
  for (auto& id : split_list(c.get<std::string>("license.allow"))) {
    if (id.empty()) continue;
    if (id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-+") !=
        std::string::npos)
      c.reject("license.allow",
               fmt::format("'{}' is not an SPDX identifier (e.g. MIT, Apache-2.0, BSD-3-Clause; "
                           "unknown = no license detected)",
                           id));
    o.license.allow.push_back(std::move(id));
  }
  o.decontam_ngram = positive("decontam.ngram", c.get<int>("decontam.ngram"));
  o.tokenizer.sample_bytes =
      static_cast<uint64_t>(positive("tokenizer.sample_bytes", c.get<int64_t>("tokenizer.sample_bytes")));
  o.tokenizer.threads = positive("tokenizer.threads", c.get<int>("tokenizer.threads"));
  o.tokenizer.image_placeholder = c.get<bool>("tokenizer.image_placeholder");
  o.split_seed = static_cast<uint64_t>(c.get<int64_t>("split.seed"));
  o.threads = c.get<int>("prepare.threads");
  if (o.threads < 0) c.reject("prepare.threads", "must be >= 0");
  const int64_t max_tokens = c.get<int64_t>("chat.max_tokens");
  // One token is the end-of-sequence id, so a limit of 1 would leave no room for the conversation.
  if (max_tokens < 0 || max_tokens == 1) c.reject("chat.max_tokens", "must be 0 (no limit) or at least 2");
  o.chat.max_tokens = static_cast<uint64_t>(max_tokens);
  const std::string policy = c.get<std::string>("chat.truncate");
  if (policy != "truncate" && policy != "drop") c.reject("chat.truncate", "must be truncate or drop");
  o.chat.drop_long = policy == "drop";
}

}  // namespace forge::data
