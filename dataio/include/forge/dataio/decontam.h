// Stage 5: decontamination. A document sharing any word n-gram (13 by default, as in the GPT-3 paper)
// with an evaluation document is removed, so a model trained on the dataset never saw test text.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace forge::data {

class NgramIndex {
 public:
  explicit NgramIndex(int n = 13) : n_(n) {}
  void add(std::string_view text);
  // True when `text` shares an n-gram with an added text; `match` receives that n-gram's words.
  bool contains_any(std::string_view text, std::string* match = nullptr) const;
  size_t size() const { return grams_.size(); }
  int n() const { return n_; }

 private:
  int n_;
  std::unordered_set<uint64_t> grams_;
};

// Eval-set files are read like inputs (plain text: one document per file; .jsonl: one per record).
// Throws forge::Error naming a missing or unreadable file.
NgramIndex load_eval_sets(const std::vector<std::string>& files, int n);

Json decontaminate(Corpus& corpus, const NgramIndex& index, const std::vector<std::string>& eval_files);

}  // namespace forge::data
