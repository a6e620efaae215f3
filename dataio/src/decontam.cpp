#include "forge/dataio/decontam.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/ingest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/text.h"

#include <cctype>
#include <filesystem>

namespace forge::data {

std::string exact_text_form(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : ch);
  }
  return out;
}

void NgramIndex::add(std::string_view text) {
  const auto words = word_hashes(text);
  for (size_t i = 0; i + n_ <= words.size(); ++i) grams_.insert(ngram_hash(&words[i], n_));
  const std::string form = exact_text_form(text);
  if (!form.empty()) texts_.insert(xxh3_64(form.data(), form.size()));
}

bool NgramIndex::equals_any(std::string_view text, std::string* match) const {
  if (texts_.empty()) return false;
  std::string form = exact_text_form(text);
  if (form.empty() || !texts_.count(xxh3_64(form.data(), form.size()))) return false;
  if (match) *match = std::move(form);
  return true;
}

bool NgramIndex::contains_any(std::string_view text, std::string* match) const {
  if (grams_.empty()) return false;
  std::vector<std::string_view> words;
  std::vector<uint64_t> hashes;
  for_each_word(text, [&](std::string_view w) {
    words.push_back(w);
    hashes.push_back(word_hash(w));
  });
  for (size_t i = 0; i + n_ <= hashes.size(); ++i) {
    if (!grams_.count(ngram_hash(&hashes[i], n_))) continue;
    if (match) {
      match->clear();
      for (int k = 0; k < n_; ++k) {
        if (k) match->push_back(' ');
        match->append(words[i + k]);
      }
    }
    return true;
  }
  return false;
}

NgramIndex load_eval_sets(const std::vector<std::string>& files, int n) {
  NgramIndex index(n);
  if (files.empty()) return index;
  std::vector<InputSpec> specs;
  for (const auto& f : files) specs.push_back({f, "eval"});
  IngestOptions options;
  options.extensions = {"txt", "jsonl", "md", ""};
  Corpus corpus;
  IngestStats stats;
  ingest(specs, options, corpus, stats);
  for (const auto& doc : corpus.docs) index.add(normalize_text(doc.text));
  // The gate's task files ({"id", "prompt", ...}, no "text"): ingest skipped their records; their prompts
  // are what a model must not have trained on.
  for (const auto& f : files) {
    std::string ext = std::filesystem::path(f).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext != ".jsonl") continue;
    const std::string data = read_file(f);
    size_t start = 0;
    while (start < data.size()) {
      size_t nl = data.find('\n', start);
      if (nl == std::string::npos) nl = data.size();
      const std::string line = repair_utf8(std::string_view(data).substr(start, nl - start), nullptr);
      start = nl + 1;
      const Json rec = Json::parse(line, nullptr, false);
      if (rec.is_discarded() || !rec.is_object()) continue;
      const auto text = rec.find("text");
      const auto prompt = rec.find("prompt");
      if ((text == rec.end() || !text->is_string()) && prompt != rec.end() && prompt->is_string())
        index.add(normalize_text(prompt->get<std::string>()));
    }
  }
  return index;
}

Json decontaminate(Corpus& corpus, const NgramIndex& index, const std::vector<std::string>& eval_files) {
  ProgressLine progress("prepare decontam", "docs");
  const uint64_t in = corpus.docs.size();
  std::vector<uint64_t> removed_by_domain(corpus.domains.size());
  Json examples = Json::array();
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  std::string match;
  for (auto& doc : corpus.docs) {
    progress.add(1, doc.text.size());
    if (!index.contains_any(doc.text, &match)) {
      kept.push_back(std::move(doc));
      continue;
    }
    ++removed_by_domain[doc.domain];
    if (examples.size() < 5) examples.push_back({{"removed", doc.source}, {"ngram", match}});
  }
  progress.finish();
  corpus.docs = std::move(kept);
  Json per_domain = Json::object();
  uint64_t removed = 0;
  for (size_t d = 0; d < corpus.domains.size(); ++d) {
    per_domain[corpus.domains[d]] = removed_by_domain[d];
    removed += removed_by_domain[d];
  }
  return {{"ngram", index.n()},
          {"eval_sets", eval_files},
          {"eval_ngrams", index.size()},
          {"documents_in", in},
          {"removed", {{"contaminated", removed}}},
          {"removed_per_domain", per_domain},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
