#include "forge/eval_gate/cider.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace forge::gate {
namespace {

// An n-gram's words joined by a space (no word holds one) -> its count, per n - 1.
using Counts = std::vector<std::unordered_map<std::string, double>>;

Counts ngram_counts(const Words& words, int max_n) {
  Counts out(static_cast<size_t>(max_n));
  for (int n = 1; n <= max_n; ++n)
    for (size_t i = 0; i + size_t(n) <= words.size(); ++i) {
      std::string gram = words[i];
      for (size_t k = 1; k < size_t(n); ++k) gram += ' ' + words[i + k];
      out[size_t(n - 1)][gram] += 1;
    }
  return out;
}

}  // namespace

Words caption_words(std::string_view text) {
  Words out;
  std::string word;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (letter || (c >= '0' && c <= '9') || c >= 0x80) {
      word.push_back(c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : ch);
    } else if (!word.empty()) {
      out.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) out.push_back(std::move(word));
  return out;
}

CiderD::CiderD(const std::vector<std::vector<Words>>& corpus, int max_n, double sigma)
    : max_n_(max_n), sigma_(sigma), log_pictures_(std::log(double(corpus.size()))) {
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i].empty()) throw std::invalid_argument(fmt::format("CiderD: picture {} has no reference", i));
    std::unordered_set<std::string> seen;
    for (const Words& r : corpus[i])
      for (const auto& grams : ngram_counts(r, max_n))
        for (const auto& [gram, _] : grams) seen.insert(gram);
    for (const std::string& gram : seen) df_[gram] += 1;
  }
}

double CiderD::score(const Words& candidate, const std::vector<Words>& references) const {
  if (references.empty()) throw std::invalid_argument("CiderD::score: no reference");
  // A sentence's TF-IDF vectors, their norms per n, and its length as the COCO code counts it (bigrams).
  struct Weighted {
    Counts g;
    std::vector<double> norm;
    double length = 0;
  };
  const auto weigh = [&](const Words& words) {
    Weighted w{ngram_counts(words, max_n_), std::vector<double>(size_t(max_n_), 0.0), 0};
    for (size_t n = 0; n < w.g.size(); ++n) {
      for (auto& [gram, v] : w.g[n]) {
        if (n == 1) w.length += v;
        const auto it = df_.find(gram);
        v *= log_pictures_ - std::log(std::max(1.0, it == df_.end() ? 0.0 : it->second));
        w.norm[n] += v * v;
      }
      w.norm[n] = std::sqrt(w.norm[n]);
    }
    return w;
  };
  const Weighted c = weigh(candidate);
  double total = 0;
  for (const Words& reference : references) {
    const Weighted r = weigh(reference);
    const double delta = c.length - r.length;
    const double penalty = std::exp(-(delta * delta) / (2 * sigma_ * sigma_));
    for (size_t n = 0; n < size_t(max_n_); ++n) {
      double dot = 0;
      for (const auto& [gram, v] : c.g[n])
        if (const auto it = r.g[n].find(gram); it != r.g[n].end())
          dot += std::min(v, it->second) * it->second;
      if (c.norm[n] != 0 && r.norm[n] != 0) dot /= c.norm[n] * r.norm[n];
      total += dot * penalty;
    }
  }
  return 10.0 * total / double(max_n_) / double(references.size());
}

}  // namespace forge::gate
