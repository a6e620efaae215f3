#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/dedup.h"
#include "forge/dataio/text.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace forge::data {
namespace {

struct UnionFind {
  std::vector<uint32_t> parent;
  explicit UnionFind(size_t n) : parent(n) {
    for (size_t i = 0; i < n; ++i) parent[i] = static_cast<uint32_t>(i);
  }
  uint32_t find(uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
};

// Folds one shingle hash into the running minima. The clone for the CPU is picked at load time: AVX-512
// (x86-64-v4) has 64-bit vector multiplies (vpmullq), AVX2 emulates them.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void fold_min(
    const uint64_t* __restrict a, const uint64_t* __restrict b, uint32_t* __restrict s, int k, uint64_t x) {
  for (int i = 0; i < k; ++i) {
    const auto h = static_cast<uint32_t>((a[i] * x + b[i]) >> 32);
    s[i] = s[i] < h ? s[i] : h;
  }
}

}  // namespace

std::vector<uint64_t> shingles(std::string_view text, int ngram) {
  const std::vector<uint64_t> words = word_hashes(text);
  std::vector<uint64_t> out;
  if (words.empty()) return out;
  const int n = std::min<int>(ngram, static_cast<int>(words.size()));
  out.reserve(words.size() - n + 1);
  for (size_t i = 0; i + n <= words.size(); ++i) out.push_back(ngram_hash(&words[i], n));
  return out;
}

MinHasher::MinHasher(const MinHashOptions& options) : options_(options) {
  if (options.bands < 1 || options.rows < 1 || options.ngram < 1)
    fail(ExitCode::kUsage, "near_dedup: ngram, bands and rows must be at least 1");
  const int k = options.bands * options.rows;
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

Json near_dedup(Corpus& corpus, const MinHashOptions& options) {
  const MinHasher hasher(options);
  ProgressLine progress("prepare near-dedup", "docs");
  const size_t n = corpus.docs.size();
  // Memory: one signature per document plus one bucket entry per band and document; nothing scales
  // with document length.
  std::vector<std::vector<uint32_t>> sigs(n);
  std::vector<std::unordered_map<uint64_t, uint32_t>> buckets(options.bands);
  for (auto& b : buckets) b.reserve(n);
  UnionFind clusters(n);
  std::vector<bool> removed(n, false);
  Json examples = Json::array();
  for (size_t i = 0; i < n; ++i) {
    progress.add(1, corpus.docs[i].text.size());
    sigs[i] = hasher.signature(corpus.docs[i].text);
    for (int band = 0; band < options.bands; ++band) {
      const uint64_t key =
          xxh3_64(sigs[i].data() + band * options.rows, options.rows * sizeof(uint32_t), band);
      const auto [it, inserted] = buckets[band].emplace(key, static_cast<uint32_t>(i));
      if (inserted || removed[i]) continue;
      const uint32_t j = it->second;  // earlier document in the same bucket
      const double similarity = estimated_jaccard(sigs[i], sigs[j]);
      if (similarity < options.threshold) continue;
      removed[i] = true;
      const uint32_t root = clusters.find(j);
      clusters.parent[i] = root;
      if (examples.size() < 5)
        examples.push_back({{"removed", corpus.docs[i].source},
                            {"kept", corpus.docs[root].source},
                            {"estimated_jaccard", similarity}});
    }
  }
  progress.finish();
  std::unordered_map<uint32_t, uint64_t> cluster_sizes;
  std::vector<uint64_t> docs_by_domain(corpus.domains.size()), removed_by_domain(corpus.domains.size());
  for (size_t i = 0; i < n; ++i) {
    ++docs_by_domain[corpus.docs[i].domain];
    if (!removed[i]) continue;
    ++removed_by_domain[corpus.docs[i].domain];
    ++cluster_sizes[clusters.find(static_cast<uint32_t>(i))];
  }
  std::vector<std::pair<uint64_t, uint32_t>> largest;
  for (const auto& [root, extra] : cluster_sizes) largest.emplace_back(extra + 1, root);
  std::sort(largest.begin(), largest.end(),
            [](auto x, auto y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  Json top = Json::array();
  for (size_t i = 0; i < std::min<size_t>(5, largest.size()); ++i)
    top.push_back({{"size", largest[i].first}, {"kept", corpus.docs[largest[i].second].source}});
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
    if (!removed[i]) kept.push_back(std::move(corpus.docs[i]));
  corpus.docs = std::move(kept);
  return {{"method", "minhash-lsh"},
          {"ngram", options.ngram},
          {"bands", options.bands},
          {"rows", options.rows},
          {"threshold", options.threshold},
          {"documents_in", n},
          {"removed", {{"near_duplicate", total_removed}}},
          {"duplicate_rate", n ? double(total_removed) / double(n) : 0.0},
          {"clusters", cluster_sizes.size()},
          {"largest_clusters", top},
          {"per_domain", per_domain},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
