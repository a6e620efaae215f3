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
  // True when `text` is, whole, an added text (compared in exact_text_form): what catches an eval prompt
  // shorter than n words ("What is 7 + 12?"), which no n-gram holds. Prompt sets use it besides
  // contains_any; the token formats do not (their documents are not prompts). `match` receives the form.
  bool equals_any(std::string_view text, std::string* match = nullptr) const;
  size_t size() const { return grams_.size(); }
  size_t texts() const { return texts_.size(); }  // distinct added texts, for equals_any
  int n() const { return n_; }

 private:
  int n_;
  std::unordered_set<uint64_t> grams_;
  std::unordered_set<uint64_t> texts_;  // xxh3-64 of each added text's exact_text_form
};

// The form equals_any compares: ASCII letters lower-cased, runs of whitespace one space, none at either
// end. Punctuation and digits are kept ("7 + 12" is not "7 - 12").
std::string exact_text_form(std::string_view text);

// Eval-set files are read like inputs (plain text: one document per file; .jsonl: one per record). A JSONL
// record without a string "text" but with a string "prompt" (a task of the gate's suites, tasks.jsonl)
// gives its prompt. Throws forge::Error naming a missing or unreadable file.
NgramIndex load_eval_sets(const std::vector<std::string>& files, int n);

Json decontaminate(Corpus& corpus, const NgramIndex& index, const std::vector<std::string>& eval_files);

}  // namespace forge::data
