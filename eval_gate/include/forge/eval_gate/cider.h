// CIDEr-D, the caption score of Vedantam, Zitnick and Parikh, "CIDEr: Consensus-based Image Description
// Evaluation" (CVPR 2015), as the COCO caption evaluation computes it (the scale every caption paper
// reports). For a candidate c of picture i with references S_i:
//   g_n(s)    the TF-IDF vector of sentence s's n-grams: for n-gram w, h_w(s) (its count in s) times
//             log(|pictures|) - log(max(1, df(w))), df(w) the number of pictures whose references hold w
//             (the IDF is the corpus's: every picture's references of the evaluation, candidates never);
//   CIDEr-D_n = 1/m sum_j e^(-(l(c) - l(s_j))^2 / (2 sigma^2)) *
//               sum_w min(g_n,w(c), g_n,w(s_j)) g_n,w(s_j) / (|g_n(c)| |g_n(s_j)|)
//             (the candidate's weights clipped by the reference's; a zero norm leaves the sum undivided);
//   CIDEr-D   = 10 * mean over n = 1..4 of CIDEr-D_n, with sigma = 6.
// l(s) is what the COCO code counts: s's bigrams (its words less one). A candidate equal to its only
// reference scores 10 when its n-grams are rare in the corpus; one sharing no n-gram with its references 0.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace forge::gate {

using Words = std::vector<std::string>;

// The words a caption is scored on: maximal runs of ASCII letters and digits (and bytes outside ASCII, kept
// as they are), letters lowercased; everything else separates ("A red-circle." is "a", "red", "circle").
Words caption_words(std::string_view text);

// The scorer of one corpus: the document frequencies of every picture's references (`corpus[i]`, at least
// one each; std::invalid_argument otherwise), then score() of any candidate against its picture's.
class CiderD {
 public:
  explicit CiderD(const std::vector<std::vector<Words>>& corpus, int max_n = 4, double sigma = 6.0);
  double score(const Words& candidate, const std::vector<Words>& references) const;

 private:
  int max_n_;
  double sigma_, log_pictures_;
  std::unordered_map<std::string, double> df_;  // an n-gram (words joined by ' ') -> its pictures
};

}  // namespace forge::gate
