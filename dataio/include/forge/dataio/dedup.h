// Stage 3: exact dedup (xxh3-128 of the normalized text) and near dedup (MinHash over word n-gram
// shingles, with LSH banding and a confirmation by estimated Jaccard). The first document of a cluster, in
// input order, is the one kept. Both run on one rank's part of a distributed corpus too (ranks.h): hashes
// and band buckets are partitioned by owner and exchanged, with the same result as one process.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"
#include "forge/dataio/ranks.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace forge::data {

Json exact_dedup(Corpus& corpus, Ranks& ranks = single_rank());

struct MinHashOptions {
  int ngram = 5;  // words per shingle
  // LSH banding: `bands` bands of `rows` hashes each. Both 0 (the default): chosen from the threshold by
  // plan_minhash; both at least 1: used as given.
  int bands = 0;
  int rows = 0;
  double threshold = 0.7;  // the true Jaccard similarity from which a pair is a near duplicate
  uint64_t seed = 1;
};

// Most hashes per signature (bands * rows), automatic or explicit.
inline constexpr int kMaxMinHashes = 512;

// Design targets of the automatic banding (docs/DATA.md, Dedup). A pair at the threshold is found
// by the banding with probability >= kCandidateRecall and then confirmed with probability >=
// kConfirmRecall, so recall at the threshold is >= 0.99 * 0.99 > 0.98 (and higher above it). Pairs at or
// below threshold - kGreyZone are removed with probability <= kGreyZoneRemoval.
inline constexpr double kCandidateRecall = 0.99;
inline constexpr double kConfirmRecall = 0.99;
inline constexpr double kGreyZone = 0.1;
inline constexpr double kGreyZoneRemoval = 0.05;
// Among plans that meet the targets with at most this fraction more hashes than the smallest, the one
// with the most rows is taken: more selective bands make fewer unrelated pairs share a bucket (fewer
// comparisons, and fewer buckets taken first by an unrelated document), for a small extra signature cost.
inline constexpr double kRowsSlack = 0.05;

// The banding and the confirmation rule near_dedup runs with. A band collision makes a candidate pair;
// it is a duplicate if at least `confirm_matches` of the bands * rows hash positions agree.
struct MinHashPlan {
  int bands = 0;
  int rows = 0;
  int confirm_matches = 0;
  bool automatic = false;  // chosen from the threshold (else given)
  int hashes() const { return bands * rows; }
  // The estimated Jaccard at or above which a candidate is confirmed: below the threshold by a margin
  // that covers the estimate's binomial noise.
  double confirm_threshold() const { return hashes() ? double(confirm_matches) / double(hashes()) : 0.0; }
};

// P(a pair of true Jaccard s shares at least one band) = 1 - (1 - s^rows)^bands.
double candidate_probability(int bands, int rows, double s);

// P(a pair of true Jaccard s is removed): it shares a band and at least plan.confirm_matches positions
// agree. Exact: each position agrees independently with probability s.
double removal_probability(const MinHashPlan& plan, double s);

// The plan for `options`. Explicit bands and rows are kept; confirm_matches is the largest count that
// confirms >= kConfirmRecall of the candidates at the threshold. Automatic (bands = rows = 0): of the
// plans that meet kCandidateRecall at the threshold and kGreyZoneRemoval at threshold - kGreyZone with at
// most (1 + kRowsSlack) times the fewest hashes any of them needs, the one with the most rows, then the
// fewest hashes. Throws forge::Error(kUsage) on invalid options.
MinHashPlan plan_minhash(const MinHashOptions& options);

class MinHasher {
 public:
  explicit MinHasher(const MinHashOptions& options);
  // bands*rows minimum hash values over the document's shingles (a document shorter than one shingle
  // is one shingle of all its words).
  std::vector<uint32_t> signature(std::string_view text) const;
  int size() const { return static_cast<int>(a_.size()); }
  const MinHashPlan& plan() const { return plan_; }

 private:
  MinHashOptions options_;
  MinHashPlan plan_;
  std::vector<uint64_t> a_, b_;
};

// The fraction of equal positions: an unbiased estimate of the shingle sets' Jaccard similarity.
double estimated_jaccard(const std::vector<uint32_t>& x, const std::vector<uint32_t>& y);

// Shingle hashes of `text` (exposed so tests can compute exact Jaccard similarities).
std::vector<uint64_t> shingles(std::string_view text, int ngram);

// Removes near duplicates; the returned report includes the plan and its expected S-curve (P(candidate)
// and P(removed) by true Jaccard).
Json near_dedup(Corpus& corpus, const MinHashOptions& options, Ranks& ranks = single_rank());

}  // namespace forge::data
