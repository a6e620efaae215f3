#include "forge/dataio/prepare.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/decontam.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/split.h"
#include "report.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

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

void add_cpu_rate(Json& stage, uint64_t bytes, double cpu_seconds) {
  stage["cpu_seconds"] = cpu_seconds;
  stage["mb_per_cpu_s"] = bytes / 1e6 / std::max(1e-9, cpu_seconds);
}

constexpr const char* kChatFiltersSkipped =
    "chat: the prose quality filters judge web text, not conversations; they are not run";

// Everything that decides the dataset's content besides the input bytes; recorded in the manifest and so
// part of the version. Input paths are left out: the same corpus at another path is the same dataset.
Json settings_json(const PrepareOptions& o, const std::vector<std::string>& eval_hashes,
                   const std::string& tok_source) {
  const auto& f = o.filters;
  Json s = {
      {"normalize_rules", kNormalizeRules},
      {"ingest",
       {{"extensions", o.ingest.extensions},
        {"max_doc_bytes", o.ingest.max_doc_bytes},
        {"max_line_bytes", o.ingest.max_line_bytes},
        {"max_invalid_utf8", o.ingest.max_invalid_utf8},
        {"max_nul", o.ingest.max_nul},
        {"default_domain", o.ingest.default_domain}}},
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
  // Chat keys only for chat datasets, so the settings (and versions) of text datasets stay as they were.
  if (o.ingest.format == "chat") {
    s["ingest"]["format"] = "chat";
    s["ingest"]["max_bad_lines"] = o.ingest.max_bad_lines;
    s["filters"] = {{"applied", false}, {"why", kChatFiltersSkipped}};
    s["chat"] = {{"template", chat_template_json()},
                 {"template_sha256", chat_template_sha256()},
                 {"max_tokens", o.chat.max_tokens},
                 {"truncate", o.chat.drop_long ? "drop" : "truncate"}};
  }
  return s;
}

void check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) fail(ExitCode::kUsage, "no --input given");
  if (o.out.empty()) fail(ExitCode::kUsage, "no --out given");
  if (!(o.valid_fraction >= 0 && o.valid_fraction <= 0.5))
    fail(ExitCode::kUsage, "--valid-fraction {}: must be between 0 and 0.5", o.valid_fraction);
  if (o.shard_tokens == 0) fail(ExitCode::kUsage, "--shard-tokens must be positive");
  if (o.ingest.format != "text" && o.ingest.format != "chat")
    fail(ExitCode::kUsage, "--format {}: must be text or chat", o.ingest.format);
  if (o.chat.max_tokens == 1)
    fail(ExitCode::kUsage,
         "--max-tokens 1: must be 0 (no limit) or at least 2 (one token is end-of-sequence)");
  if (!o.tokenizer_model.empty() && !fs::is_regular_file(o.tokenizer_model))
    fail(ExitCode::kUsage, "--tokenizer {}: no such file", o.tokenizer_model);
  for (const auto& e : o.eval_sets)
    if (!fs::is_regular_file(e)) fail(ExitCode::kUsage, "--eval-set {}: no such file", e);
  std::error_code ec;
  if (fs::exists(o.out, ec) && !(fs::is_directory(o.out, ec) && fs::is_empty(o.out, ec)))
    fail(ExitCode::kUsage,
         "--out {}: already exists and is not an empty directory; remove it or pick another path", o.out);
}

// Encodes every document on `threads` threads; each result ends with the end-of-sequence id.
std::vector<std::vector<uint32_t>> encode_all(const Corpus& corpus, const Tokenizer& tok, int threads) {
  std::vector<std::vector<uint32_t>> out(corpus.docs.size());
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes_done{0};
  std::exception_ptr error;
  std::mutex error_mu;
  const auto work = [&] {
    std::vector<int> ids;
    EncodeCache cache;
    try {
      for (size_t i; (i = next.fetch_add(1)) < corpus.docs.size();) {
        tok.encode(corpus.docs[i].text, ids, cache);
        out[i].assign(ids.begin(), ids.end());
        out[i].push_back(static_cast<uint32_t>(tok.eos_id()));
        bytes_done += corpus.docs[i].text.size();
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

// The loss mask of each encoded conversation, then the --max-tokens policy; conversations left out are
// removed from `corpus` and `encoded` (the returned masks match the survivors). `report` gets the counts
// and the token means of what is kept.
std::vector<std::vector<uint8_t>> chat_masks_and_truncation(Corpus& corpus,
                                                            std::vector<std::vector<uint32_t>>& encoded,
                                                            const ChatMarkerIds& markers, uint32_t eos,
                                                            const ChatPrepareOptions& o, Json& report) {
  std::vector<std::vector<uint8_t>> masks(encoded.size());
  uint64_t truncated = 0, dropped_long = 0, dropped_unscored = 0;
  size_t kept = 0;
  for (size_t i = 0; i < encoded.size(); ++i) {
    auto& ids = encoded[i];
    auto& mask = masks[i];
    chat_loss_mask(ids, markers, mask);
    if (o.max_tokens > 0 && ids.size() > o.max_tokens) {
      if (o.drop_long) {
        ++dropped_long;
        continue;
      }
      // Every document still ends with the end-of-sequence id: the reader does not need it (boundaries
      // come from /doc_offsets), but decoders and `inspect` expect it.
      ids.resize(o.max_tokens - 1);
      mask.resize(o.max_tokens - 1);
      ids.push_back(eos);
      mask.push_back(0);
      if (std::find(mask.begin(), mask.end(), uint8_t{1}) == mask.end()) {
        ++dropped_unscored;
        continue;
      }
      ++truncated;
    }
    if (kept != i) {
      corpus.docs[kept] = std::move(corpus.docs[i]);
      encoded[kept] = std::move(ids);
      masks[kept] = std::move(mask);
    }
    ++kept;
  }
  const uint64_t conversations_encoded = encoded.size();
  corpus.docs.resize(kept);
  encoded.resize(kept);
  masks.resize(kept);
  if (kept == 0)
    fail(ExitCode::kData,
         "no conversation left after --max-tokens {} ({} dropped as too long, {} cut to no scored token); "
         "raise --max-tokens or use --truncate truncate; nothing written",
         o.max_tokens, dropped_long, dropped_unscored);
  uint64_t tokens = 0, scored = 0;
  for (size_t i = 0; i < kept; ++i) {
    tokens += encoded[i].size();
    scored += static_cast<uint64_t>(std::count(masks[i].begin(), masks[i].end(), uint8_t{1}));
  }
  const uint64_t prompt = tokens - scored - kept;  // the rest, less one end-of-sequence id each
  const double n = static_cast<double>(kept);
  report = {{"conversations_encoded", conversations_encoded},
            {"conversations", kept},
            {"truncation",
             {{"max_tokens", o.max_tokens},
              {"policy", o.drop_long ? "drop" : "truncate"},
              {"truncated", truncated},
              {"dropped_too_long", dropped_long},
              {"dropped_no_scored_token_after_cut", dropped_unscored}}},
            {"tokens", tokens},
            {"scored_tokens", scored},
            {"scored_token_share", tokens ? double(scored) / double(tokens) : 0.0},
            {"mean_tokens_per_conversation", double(tokens) / n},
            {"mean_prompt_tokens", double(prompt) / n},
            {"mean_response_tokens", double(scored) / n}};
  return masks;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& o) {
  check_options(o);
  const bool chat = o.ingest.format == "chat";
  // A given tokenizer without the chat markers is a usage error; say so before any work is done.
  if (chat && !o.tokenizer_model.empty())
    chat_marker_ids(Tokenizer::load(o.tokenizer_model), o.tokenizer_model);
  const double t_start = now_s(), cpu_start = cpu_s();
  Json stages = Json::object();
  const auto require_docs = [](const Corpus& c, const char* stage, const Json& counters) {
    if (c.docs.empty())
      fail(ExitCode::kData, "no documents left after {} ({}); nothing written", stage,
           counters.contains("removed") ? counters["removed"].dump() : std::string("no input documents"));
  };

  const NgramIndex eval_index = load_eval_sets(o.eval_sets, o.decontam_ngram);
  std::vector<std::string> eval_hashes;
  for (const auto& e : o.eval_sets) eval_hashes.push_back(sha256_file_hex(e));
  std::sort(eval_hashes.begin(), eval_hashes.end());

  Corpus corpus;
  IngestStats ist;
  double t = now_s(), cpu = cpu_s();
  ingest(o.inputs, o.ingest, corpus, ist);
  stages["ingest"] = ist.to_json();
  stages["ingest"]["seconds"] = now_s() - t;
  stages["ingest"]["mb_per_s"] = ist.bytes_in / 1e6 / std::max(1e-9, now_s() - t);
  add_cpu_rate(stages["ingest"], ist.bytes_in, cpu_s() - cpu);
  if (chat && corpus.docs.empty())
    fail(ExitCode::kData,
         "the inputs hold no usable conversation ({} files, {} lines: {} malformed, degenerate {}, ingest "
         "removed {}); nothing written",
         ist.files, ist.chat.lines, ist.chat.malformed_lines, ist.chat.to_json()["degenerate"].dump(),
         stages["ingest"]["removed"].dump());
  if (ist.documents_in == 0)
    fail(ExitCode::kData,
         "the inputs hold no documents ({} files read, {} skipped by extension); nothing written", ist.files,
         ist.skipped_files);
  require_docs(corpus, "ingest", stages["ingest"]);
  // Each stage records the bytes it was given and its rate, for the report and bench/data_prepare.sh.
  const auto run = [&](const char* name, const auto& stage) {
    uint64_t bytes = 0;
    for (const auto& d : corpus.docs) bytes += d.text.size();
    const double cpu0 = cpu_s();
    Json st = stage();
    st["bytes_in"] = bytes;
    st["mb_per_s"] = bytes / 1e6 / std::max(1e-9, st.value("seconds", 0.0));
    add_cpu_rate(st, bytes, cpu_s() - cpu0);
    stages[name] = st;
  };
  run("normalize", [&] { return normalize(corpus); });
  require_docs(corpus, "normalize", stages["normalize"]);
  run("exact_dedup", [&] { return exact_dedup(corpus); });
  if (o.near_dedup) run("near_dedup", [&] { return near_dedup(corpus, o.minhash); });
  if (chat) {
    stages["filters"] = {{"skipped", kChatFiltersSkipped}, {"removed", Json::object()}};
  } else {
    run("filters", [&] { return apply_filters(corpus, o.filters); });
    require_docs(corpus, "the quality filters", stages["filters"]);
  }
  run("decontam", [&] { return decontaminate(corpus, eval_index, o.eval_sets); });
  require_docs(corpus, "decontamination", stages["decontam"]);

  const fs::path out(o.out);
  const fs::path partial =
      out.parent_path() / (out.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(partial);
  fs::create_directories(partial / "shards");
  try {
    // Tokenizer.
    t = now_s();
    cpu = cpu_s();
    const std::string model_path = (partial / "tokenizer.model").string();
    Tokenizer tok = [&] {
      if (!o.tokenizer_model.empty()) {
        write_file_atomic(model_path, read_file(o.tokenizer_model));
        return Tokenizer::load(model_path);
      }
      return Tokenizer::train(corpus, o.tokenizer, model_path);
    }();
    const double train_seconds = o.tokenizer_model.empty() ? now_s() - t : 0.0;
    const double train_cpu_seconds = o.tokenizer_model.empty() ? cpu_s() - cpu : 0.0;
    stages["tokenizer"] = {{"source", o.tokenizer_model.empty() ? "trained" : o.tokenizer_model},
                           {"vocab_size", tok.vocab_size()},
                           {"sha256", tok.sha256()},
                           {"train_seconds", train_seconds},
                           {"train_cpu_seconds", train_cpu_seconds}};

    // Encode (then, for chat, mask and truncate), then split: the split only looks at the documents'
    // text, so for text datasets the order does not matter, and chat conversations dropped by truncation
    // must not take a place in the validation split.
    t = now_s();
    cpu = cpu_s();
    const int threads =
        o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    auto encoded = encode_all(corpus, tok, threads);
    stages["tokenizer"]["encode_seconds"] = now_s() - t;
    {
      uint64_t bytes = 0;
      for (const auto& d : corpus.docs) bytes += d.text.size();
      stages["tokenizer"]["encode_bytes_in"] = bytes;
      stages["tokenizer"]["encode_mb_per_s"] = bytes / 1e6 / std::max(1e-9, now_s() - t);
      stages["tokenizer"]["encode_cpu_seconds"] = cpu_s() - cpu;
      stages["tokenizer"]["encode_mb_per_cpu_s"] = bytes / 1e6 / std::max(1e-9, cpu_s() - cpu);
    }
    stages["tokenizer"]["encode_threads"] = threads;
    std::vector<std::vector<uint8_t>> masks;
    Json chat_report;
    if (chat) {
      masks = chat_masks_and_truncation(
          corpus, encoded, chat_marker_ids(tok, o.tokenizer_model.empty() ? model_path : o.tokenizer_model),
          static_cast<uint32_t>(tok.eos_id()), o.chat, chat_report);
      chat_report.update(ist.chat.to_json());
      chat_report["malformed_lines"]["max_fraction"] = o.ingest.max_bad_lines;
      chat_report["template"] = kChatTemplateName;
      chat_report["template_sha256"] = chat_template_sha256();
      chat_report["filters"] = kChatFiltersSkipped;
    }
    const std::vector<uint8_t> valid = assign_valid_split(corpus, o.valid_fraction, o.split_seed);

    // Licenses: index 0 is "unknown", the rest sorted so ids do not depend on document order.
    std::set<std::string> license_set;
    for (const auto& d : corpus.docs)
      if (!d.license.empty()) license_set.insert(d.license);
    Manifest m;
    m.licenses = {"unknown"};
    m.licenses.insert(m.licenses.end(), license_set.begin(), license_set.end());
    m.domains = corpus.domains;
    m.tokenizer_file = "tokenizer.model";
    m.tokenizer_sha256 = tok.sha256();
    m.vocab_size = tok.vocab_size();
    m.eos_id = tok.eos_id();
    m.token_bytes = token_bytes_for_vocab(m.vocab_size);
    m.format = chat ? "chat" : "text";

    // Shards: one stream per (split, domain), cut at document boundaries every shard_tokens tokens.
    t = now_s();
    cpu = cpu_s();
    std::vector<uint64_t> unigram(m.vocab_size);
    Json domain_stats = Json::object();
    uint64_t tokens_out = 0;
    for (const std::string split : {"train", "valid"}) {
      for (uint16_t d = 0; d < corpus.domains.size(); ++d) {
        ShardData data;
        int seq = 0;
        const auto flush = [&] {
          if (data.documents() == 0) return;
          const std::string rel = fmt::format("shards/{}-{}-{:05d}.h5", split, corpus.domains[d], seq++);
          const std::string path = (partial / rel).string();
          const ShardAttrs attrs{kShardSchemaVersion, split, corpus.domains[d], tok.sha256(), m.vocab_size};
          write_shard(path, data, attrs, m.token_bytes);
          m.shards.push_back({rel, split, corpus.domains[d], xxh3_file_hex(path), fs::file_size(path),
                              data.tokens.size(), data.documents()});
          data = ShardData{};
        };
        for (size_t i = 0; i < corpus.docs.size(); ++i) {
          const Document& doc = corpus.docs[i];
          if (doc.domain != d || (valid[i] == 1) != (split == "valid")) continue;
          data.tokens.insert(data.tokens.end(), encoded[i].begin(), encoded[i].end());
          if (chat) data.loss_mask.insert(data.loss_mask.end(), masks[i].begin(), masks[i].end());
          data.doc_offsets.push_back(data.tokens.size());
          data.doc_domains.push_back(d);
          const auto lic =
              std::find(m.licenses.begin(), m.licenses.end(), doc.license.empty() ? "unknown" : doc.license);
          data.doc_licenses.push_back(static_cast<uint16_t>(lic - m.licenses.begin()));
          for (uint32_t id : encoded[i]) ++unigram[id];
          Json& ds = domain_stats[corpus.domains[d]];
          if (ds.is_null())
            ds = {{"documents", 0}, {"tokens", 0}, {"valid_documents", 0}, {"valid_tokens", 0}};
          ds["documents"] = ds["documents"].get<uint64_t>() + 1;
          ds["tokens"] = ds["tokens"].get<uint64_t>() + encoded[i].size();
          if (split == "valid") {
            ds["valid_documents"] = ds["valid_documents"].get<uint64_t>() + 1;
            ds["valid_tokens"] = ds["valid_tokens"].get<uint64_t>() + encoded[i].size();
          }
          tokens_out += encoded[i].size();
          if (data.tokens.size() >= o.shard_tokens) flush();
        }
        flush();
      }
    }
    stages["shards"] = {{"shards", m.shards.size()},
                        {"token_dtype", m.token_bytes == 2 ? "uint16" : "uint32"},
                        {"seconds", now_s() - t},
                        {"cpu_seconds", cpu_s() - cpu}};
    m.settings = settings_json(o, eval_hashes, o.tokenizer_model.empty() ? "trained" : "given");
    m.version = m.compute_version();

    // Report, then the manifest last: a directory without manifest.json is not a dataset.
    for (auto& [name, ds] : domain_stats.items()) {
      ds["document_share"] = double(ds["documents"].get<uint64_t>()) / double(corpus.docs.size());
      ds["token_share"] = tokens_out ? double(ds["tokens"].get<uint64_t>()) / double(tokens_out) : 0.0;
    }
    const double total_s = now_s() - t_start, total_cpu_s = cpu_s() - cpu_start;
    Json quality = {{"dataset", o.out}, {"stages", stages}};
    quality["summary"] = {{"version", m.version},
                          {"documents_in", ist.documents_in},
                          {"bytes_in", ist.bytes_in},
                          {"documents_out", corpus.docs.size()},
                          {"tokens_out", tokens_out},
                          {"domains", domain_stats},
                          {"token_distribution", token_distribution(unigram, &tok)},
                          {"seconds", total_s},
                          {"tokenizer_train_seconds", train_seconds},
                          {"mb_per_s_excluding_tokenizer_training",
                           ist.bytes_in / 1e6 / std::max(1e-9, total_s - train_seconds)},
                          {"cpu_seconds", total_cpu_s},
                          {"mb_per_cpu_s_excluding_tokenizer_training",
                           ist.bytes_in / 1e6 / std::max(1e-9, total_cpu_s - train_cpu_seconds)},
                          {"peak_rss_bytes", peak_rss_bytes()}};
    if (chat) quality["chat"] = chat_report;
    quality["inputs"] = Json::array();
    for (const auto& in : o.inputs) quality["inputs"].push_back({{"path", in.path}, {"domain", in.domain}});
    const std::string summary = quality_summary(quality);
    write_json_atomic((partial / "quality.json").string(), quality);
    write_file_atomic((partial / "quality.txt").string(), summary);
    write_manifest(partial.string(), m);

    std::error_code ec;
    if (fs::exists(out, ec)) fs::remove(out);  // an empty directory (checked above)
    fs::rename(partial, out);
    fsync_dir(fs::absolute(out).parent_path().string());
    return {o.out, m.version, summary, quality};
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
}

}  // namespace forge::data
