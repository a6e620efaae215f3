#include "distributed.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/dedup.h"
#include "forge/dataio/text.h"
#include "wire.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <unordered_map>

namespace forge::data {
namespace {

// Folds one shingle hash into the running minima. The clone for the CPU is picked at load time: AVX-512
// (x86-64-v4) has 64-bit vector multiplies (vpmullq), AVX2 emulates them.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void fold_min(
    const uint64_t* __restrict a, const uint64_t* __restrict b, uint32_t* __restrict s, int k, uint64_t x) {
  for (int i = 0; i < k; ++i) {
    const auto h = static_cast<uint32_t>((a[i] * x + b[i]) >> 32);
    s[i] = s[i] < h ? s[i] : h;
  }
}

// P(X = i) for X ~ Binomial(n, p), i = 0..n; in log space so large n does not overflow the coefficients.
std::vector<double> binomial_pmf(int n, double p) {
  std::vector<double> pmf(n + 1, 0.0);
  if (p <= 0 || p >= 1) {
    pmf[p <= 0 ? 0 : n] = 1.0;
    return pmf;
  }
  const double lp = std::log(p), lq = std::log1p(-p), ln = std::lgamma(n + 1.0);
  for (int i = 0; i <= n; ++i)
    pmf[i] = std::exp(ln - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) + i * lp + (n - i) * lq);
  return pmf;
}

// tail[m] = P(X >= m), m = 0..pmf.size(), for the distribution `pmf`.
std::vector<double> upper_tail(const std::vector<double>& pmf) {
  std::vector<double> tail(pmf.size() + 1, 0.0);
  for (size_t m = pmf.size(); m-- > 0;) tail[m] = tail[m + 1] + pmf[m];
  return tail;
}

// tail[m] = P(some band agrees fully and at least m of the bands*rows positions agree), m = 0..bands*rows+1,
// for a pair of true Jaccard s. Positions agree independently with probability s, so this is P(M >= m)
// minus the same with every band short of full agreement, whose distribution is the bands-fold
// convolution of Binomial(rows, s) cut at rows - 1.
std::vector<double> removal_tail(int bands, int rows, double s) {
  const std::vector<double> band = binomial_pmf(rows, s);
  std::vector<double> none_full{1.0};
  for (int i = 0; i < bands; ++i) {
    std::vector<double> next(none_full.size() + rows - 1, 0.0);
    for (size_t x = 0; x < none_full.size(); ++x)
      for (int y = 0; y < rows; ++y) next[x + y] += none_full[x] * band[y];
    none_full = std::move(next);
  }
  std::vector<double> tail = upper_tail(binomial_pmf(bands * rows, s));
  const std::vector<double> short_tail = upper_tail(none_full);
  for (size_t m = 0; m < tail.size(); ++m)
    tail[m] = std::clamp(tail[m] - (m < short_tail.size() ? short_tail[m] : 0.0), 0.0, 1.0);
  return tail;
}

// The largest count that confirms at least kConfirmRecall of the candidates at true Jaccard t (0 when no
// pair at t can be a candidate, as at t = 0: then every candidate is confirmed).
int confirm_count(int bands, int rows, double t) {
  const std::vector<double> tail = removal_tail(bands, rows, t);
  const double need = kConfirmRecall * candidate_probability(bands, rows, t);
  for (int m = bands * rows; m > 0; --m)
    if (tail[m] > 0 && tail[m] >= need) return m;
  return 0;
}

// Whether a plan of `bands` x `rows` meets the automatic targets at threshold t (low = t - kGreyZone;
// at_t, at_low: the Binomial(bands * rows) upper tails at t and low). A cheap necessary condition skips
// most plans before the exact convolution: confirming kConfirmRecall of the candidates at t needs
// P(M >= m | t) >= that much, which bounds m from above, and P(removed | low) >= P(M >= m | low) -
// P(no candidate | low).
bool meets_targets(const MinHashPlan& plan, double t, double low, const std::vector<double>& at_t,
                   const std::vector<double>& at_low) {
  if (low <= 0) return true;  // no pair is that far below: nothing to bound
  int m_max = plan.hashes();
  const double found = candidate_probability(plan.bands, plan.rows, t);
  while (m_max > 0 && at_t[m_max] < kConfirmRecall * found) --m_max;
  if (at_low[m_max] - (1 - candidate_probability(plan.bands, plan.rows, low)) > kGreyZoneRemoval)
    return false;
  return removal_probability(plan, low) <= kGreyZoneRemoval;
}

// Automatic banding: see plan_minhash in dedup.h.
MinHashPlan automatic_plan(double t) {
  const double low = t - kGreyZone;
  MinHashPlan best;
  int last_k = kMaxMinHashes;  // lowered to the size window once a first plan is found
  for (int k = 1; k <= last_k; ++k) {
    const std::vector<double> at_t = upper_tail(binomial_pmf(k, t));
    const std::vector<double> at_low = low > 0 ? upper_tail(binomial_pmf(k, low)) : std::vector<double>();
    for (int rows = k; rows > best.rows; --rows) {
      if (k % rows) continue;
      const int bands = k / rows;
      if (candidate_probability(bands, rows, t) < kCandidateRecall) continue;
      const MinHashPlan plan{bands, rows, confirm_count(bands, rows, t), true};
      if (!meets_targets(plan, t, low, at_t, at_low)) continue;
      if (!best.bands) last_k = std::min(kMaxMinHashes, static_cast<int>(k * (1 + kRowsSlack)));
      best = plan;
      break;
    }
  }
  // No plan only for thresholds below about 0.009: none within the cap finds 99% of the pairs at t, and
  // single-hash bands find the most.
  return best.bands ? best : MinHashPlan{kMaxMinHashes, 1, confirm_count(kMaxMinHashes, 1, t), true};
}

}  // namespace

double candidate_probability(int bands, int rows, double s) {
  return 1 - std::pow(1 - std::pow(s, rows), bands);
}

double removal_probability(const MinHashPlan& plan, double s) {
  return removal_tail(plan.bands, plan.rows, s)[plan.confirm_matches];
}

MinHashPlan plan_minhash(const MinHashOptions& o) {
  if (o.ngram < 1) fail(ExitCode::kUsage, "near_dedup: ngram must be at least 1");
  if (!(o.threshold >= 0 && o.threshold <= 1))
    fail(ExitCode::kUsage, "near_dedup: threshold must be in [0, 1]");
  if (o.bands == 0 && o.rows == 0) return automatic_plan(o.threshold);
  if (o.bands < 1 || o.rows < 1 || int64_t(o.bands) * o.rows > kMaxMinHashes)
    fail(ExitCode::kUsage,
         "near_dedup: bands and rows must both be 0 (automatic) or both at least 1 with "
         "bands * rows at most {}",
         kMaxMinHashes);
  return {o.bands, o.rows, confirm_count(o.bands, o.rows, o.threshold), false};
}

std::vector<uint64_t> shingles(std::string_view text, int ngram) {
  const std::vector<uint64_t> words = word_hashes(text);
  std::vector<uint64_t> out;
  if (words.empty()) return out;
  const int n = std::min<int>(ngram, static_cast<int>(words.size()));
  out.reserve(words.size() - n + 1);
  for (size_t i = 0; i + n <= words.size(); ++i) out.push_back(ngram_hash(&words[i], n));
  return out;
}

MinHasher::MinHasher(const MinHashOptions& options) : options_(options), plan_(plan_minhash(options)) {
  const int k = plan_.hashes();
  a_.resize(k);
  b_.resize(k);
  for (int i = 0; i < k; ++i) {
    a_[i] = splitmix64(options.seed * 1000003 + 2 * i) | 1;  // odd multipliers
    b_[i] = splitmix64(options.seed * 1000003 + 2 * i + 1);
  }
}

std::vector<uint32_t> MinHasher::signature(std::string_view text) const {
  const int k = size();
  // Multiply-shift hashing: h_i(x) = high 32 bits of (a_i * x + b_i), a universal family that the
  // compiler vectorizes across i, unlike a modular prime.
  std::vector<uint32_t> sig(k, std::numeric_limits<uint32_t>::max());
  const uint64_t* a = a_.data();
  const uint64_t* b = b_.data();
  uint32_t* s = sig.data();
  for (uint64_t x : shingles(text, options_.ngram)) fold_min(a, b, s, k, x);
  return sig;
}

double estimated_jaccard(const std::vector<uint32_t>& x, const std::vector<uint32_t>& y) {
  if (x.empty() || x.size() != y.size()) return 0.0;
  size_t equal = 0;
  for (size_t i = 0; i < x.size(); ++i) equal += x[i] == y[i];
  return double(equal) / double(x.size());
}

Json near_dedup(Corpus& corpus, const MinHashOptions& options, Ranks& ranks) {
  const MinHasher hasher(options);
  const MinHashPlan& plan = hasher.plan();
  const double confirm = plan.confirm_threshold();
  ProgressLine progress("prepare near-dedup", "docs");
  const size_t n = corpus.docs.size();
  const Placement at = place(ranks, n);
  const auto R = static_cast<uint64_t>(ranks.size());
  // A document is removed when, in some band, the first document in input order with the same band key
  // (its bucket's first) is an earlier one whose signature agrees enough. So: signatures here; each band
  // key to the rank that owns the bucket; the owner names each bucket's first to the holders of the
  // others; they fetch the firsts' signatures and decide, bands in order. Memory: one signature per
  // document plus one bucket entry per band and document; nothing scales with document length.
  std::vector<std::vector<uint32_t>> sigs(n);
  Outbox keys(ranks.size());
  for (size_t i = 0; i < n; ++i) {
    progress.add(1, corpus.docs[i].text.size());
    sigs[i] = hasher.signature(corpus.docs[i].text);
    for (uint32_t band = 0; band < uint32_t(plan.bands); ++band) {
      const uint64_t key = xxh3_64(sigs[i].data() + band * plan.rows, plan.rows * sizeof(uint32_t), band);
      keys.to[(key ^ (uint64_t{band} * 0x9E3779B97F4A7C15ull)) % R]
          .put(static_cast<uint16_t>(band))  // bands <= kMaxMinHashes
          .put(key)
          .put<uint64_t>(at.first + i);
    }
  }
  std::vector<std::unordered_map<uint64_t, uint64_t>> first(static_cast<size_t>(plan.bands));
  Outbox firsts(ranks.size());
  {
    const auto owned = ranks.exchange(keys.blocks());
    for (size_t r = 0; r < owned.size(); ++r)  // rank order is input order
      for (Unpacker in(owned[r]); !in.done();) {
        const auto band = in.get<uint16_t>();
        const auto key = in.get<uint64_t>();
        const auto g = in.get<uint64_t>();
        const auto [it, inserted] = first[band].emplace(key, g);
        if (!inserted) firsts.to[r].put(g).put(band).put(it->second);
      }
  }
  first.clear();
  struct Candidate {
    uint64_t doc;  // local index
    uint32_t band;
    uint64_t earlier;  // global index of the bucket's first
    bool operator<(const Candidate& o) const { return std::tie(doc, band) < std::tie(o.doc, o.band); }
  };
  std::vector<Candidate> candidates;
  for (const auto& block : ranks.exchange(firsts.blocks()))
    for (Unpacker in(block); !in.done();) {
      const auto g = in.get<uint64_t>();
      const auto band = in.get<uint16_t>();
      candidates.push_back({g - at.first, band, in.get<uint64_t>()});
    }
  std::sort(candidates.begin(), candidates.end());
  // Signatures of firsts held by other ranks.
  std::unordered_map<uint64_t, std::vector<uint32_t>> remote;
  {
    Outbox ask(ranks.size());
    for (const auto& c : candidates)
      if ((c.earlier < at.first || c.earlier >= at.first + n) &&
          remote.emplace(c.earlier, std::vector<uint32_t>()).second)
        ask.to[static_cast<size_t>(at.rank_of(c.earlier))].put(c.earlier);
    const auto asked = ranks.exchange(ask.blocks());
    Outbox answer(ranks.size());
    for (size_t r = 0; r < asked.size(); ++r)
      for (Unpacker in(asked[r]); !in.done();) {
        const auto g = in.get<uint64_t>();
        answer.to[r].put(g);
        for (uint32_t v : sigs[g - at.first]) answer.to[r].put(v);
      }
    for (const auto& block : ranks.exchange(answer.blocks()))
      for (Unpacker in(block); !in.done();) {
        auto& sig = remote[in.get<uint64_t>()];
        sig.resize(static_cast<size_t>(plan.hashes()));
        for (auto& v : sig) v = in.get<uint32_t>();
      }
  }
  // Decide, bands in order; the first earlier document that confirms is the one this repeats.
  std::vector<uint64_t> repeats(n, UINT64_MAX);
  std::vector<double> similarity(n, 0.0);
  for (const auto& c : candidates) {
    if (repeats[c.doc] != UINT64_MAX) continue;
    const auto& other =
        c.earlier >= at.first && c.earlier < at.first + n ? sigs[c.earlier - at.first] : remote.at(c.earlier);
    const double sim = estimated_jaccard(sigs[c.doc], other);
    if (sim < confirm) continue;
    repeats[c.doc] = c.earlier;
    similarity[c.doc] = sim;
  }
  progress.finish();
  // Clusters: rank 0 links every removed document to the root of what it repeats, in input order.
  Outbox edges(ranks.size());
  for (size_t i = 0; i < n; ++i)
    if (repeats[i] != UINT64_MAX) edges.to[0].put<uint64_t>(at.first + i).put(repeats[i]).put(similarity[i]);
  const auto all_edges = ranks.exchange(edges.blocks());
  std::unordered_map<uint64_t, uint64_t> root;  // removed document -> the kept document of its cluster
  std::unordered_map<uint64_t, uint64_t> cluster_sizes;
  std::vector<uint64_t> wanted;  // sources for the report: examples (removed, kept), then the largest
  std::vector<double> example_similarity;
  if (ranks.rank() == 0) {
    for (const auto& block : all_edges)
      for (Unpacker in(block); !in.done();) {
        const auto g = in.get<uint64_t>(), j = in.get<uint64_t>();
        const auto sim = in.get<double>();
        const auto it = root.find(j);
        const uint64_t r = it == root.end() ? j : it->second;
        root[g] = r;
        ++cluster_sizes[r];
        if (example_similarity.size() < 5) {
          wanted.insert(wanted.end(), {g, r});
          example_similarity.push_back(sim);
        }
      }
  }
  std::vector<std::pair<uint64_t, uint64_t>> largest;
  for (const auto& [r, extra] : cluster_sizes) largest.emplace_back(extra + 1, r);
  std::sort(largest.begin(), largest.end(),
            [](auto x, auto y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  largest.resize(std::min<size_t>(5, largest.size()));
  for (const auto& [_, r] : largest) wanted.push_back(r);
  const auto sources = sources_of(ranks, corpus, at, wanted);
  Json examples = Json::array(), top = Json::array();
  for (size_t k = 0; k < example_similarity.size(); ++k)
    examples.push_back({{"removed", sources[2 * k]},
                        {"kept", sources[2 * k + 1]},
                        {"estimated_jaccard", example_similarity[k]}});
  for (size_t k = 0; k < largest.size(); ++k)
    top.push_back({{"size", largest[k].first}, {"kept", sources[2 * example_similarity.size() + k]}});
  std::vector<uint64_t> docs_by_domain(corpus.domains.size()), removed_by_domain(corpus.domains.size());
  for (size_t i = 0; i < n; ++i) {
    ++docs_by_domain[corpus.docs[i].domain];
    if (repeats[i] != UINT64_MAX) ++removed_by_domain[corpus.docs[i].domain];
  }
  Json per_domain = Json::object();
  uint64_t total_removed = 0;
  for (size_t d = 0; d < corpus.domains.size(); ++d) {
    total_removed += removed_by_domain[d];
    per_domain[corpus.domains[d]] = {
        {"documents", docs_by_domain[d]},
        {"removed", removed_by_domain[d]},
        {"rate", docs_by_domain[d] ? double(removed_by_domain[d]) / double(docs_by_domain[d]) : 0.0}};
  }
  std::vector<Document> kept;
  kept.reserve(n - total_removed);
  for (size_t i = 0; i < n; ++i)
    if (repeats[i] == UINT64_MAX) kept.push_back(std::move(corpus.docs[i]));
  corpus.docs = std::move(kept);
  // The expected S-curve of this plan, for a pair in isolation (a pair whose band bucket an unrelated
  // earlier document took first is compared with that one instead).
  std::vector<double> curve_at = {0.5, 0.6, 0.7, 0.8, 0.9, 1.0, options.threshold};
  std::sort(curve_at.begin(), curve_at.end());
  curve_at.erase(std::unique(curve_at.begin(), curve_at.end()), curve_at.end());
  Json curve = Json::array();
  for (double s : curve_at)
    curve.push_back({{"jaccard", s},
                     {"p_candidate", candidate_probability(plan.bands, plan.rows, s)},
                     {"p_removed", removal_probability(plan, s)}});
  return {{"method", "minhash-lsh"},
          {"ngram", options.ngram},
          {"bands", plan.bands},
          {"rows", plan.rows},
          {"hashes", plan.hashes()},
          {"banding", plan.automatic ? "automatic" : "configured"},
          {"threshold", options.threshold},
          {"confirm_threshold", confirm},
          {"expected_recall_at_threshold", removal_probability(plan, options.threshold)},
          {"s_curve", curve},
          {"documents_in", n},
          {"removed", {{"near_duplicate", total_removed}}},
          {"duplicate_rate", n ? double(total_removed) / double(n) : 0.0},
          {"clusters", cluster_sizes.size()},  // counted on rank 0, which sees every cluster
          {"largest_clusters", top},
          {"per_domain", per_domain},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
