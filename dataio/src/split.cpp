#include "forge/dataio/split.h"

#include "forge/common/hash.h"

#include <algorithm>
#include <cmath>

namespace forge::data {

std::vector<uint8_t> assign_valid_split(const Corpus& corpus, double valid_fraction, uint64_t seed) {
  std::vector<uint8_t> valid(corpus.docs.size(), 0);
  if (valid_fraction <= 0) return valid;
  std::vector<std::vector<std::pair<uint64_t, size_t>>> by_domain(corpus.domains.size());
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const auto& doc = corpus.docs[i];
    by_domain[doc.domain].emplace_back(xxh3_64(doc.text.data(), doc.text.size(), seed), i);
  }
  for (auto& docs : by_domain) {
    if (docs.size() < 2) continue;
    std::sort(docs.begin(), docs.end());
    auto take = static_cast<size_t>(std::ceil(valid_fraction * static_cast<double>(docs.size())));
    take = std::clamp<size_t>(take, 1, docs.size() - 1);
    for (size_t k = 0; k < take; ++k) valid[docs[k].second] = 1;
  }
  return valid;
}

}  // namespace forge::data
