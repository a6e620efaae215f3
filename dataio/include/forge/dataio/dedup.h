// Stage 3: exact dedup (xxh3-128 of the normalized text) and near dedup (MinHash over word n-gram
// shingles, with LSH banding). The first document of a cluster, in input order, is the one kept.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace forge::data {

Json exact_dedup(Corpus& corpus);

struct MinHashOptions {
  int ngram = 5;           // words per shingle
  int bands = 14;          // LSH bands
  int rows = 8;            // hashes per band
  double threshold = 0.7;  // a band collision counts only if the signatures agree on this fraction
  uint64_t seed = 1;
};

class MinHasher {
 public:
  explicit MinHasher(const MinHashOptions& options);
  // bands*rows minimum hash values over the document's shingles (a document shorter than one shingle
  // is one shingle of all its words).
  std::vector<uint32_t> signature(std::string_view text) const;
  int size() const { return static_cast<int>(a_.size()); }

 private:
  MinHashOptions options_;
  std::vector<uint64_t> a_, b_;
};

// The fraction of equal positions: an unbiased estimate of the shingle sets' Jaccard similarity.
double estimated_jaccard(const std::vector<uint32_t>& x, const std::vector<uint32_t>& y);

// Shingle hashes of `text` (exposed so tests can compute exact Jaccard similarities).
std::vector<uint64_t> shingles(std::string_view text, int ngram);

Json near_dedup(Corpus& corpus, const MinHashOptions& options);

}  // namespace forge::data
