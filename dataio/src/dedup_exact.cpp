#include "distributed.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/dedup.h"
#include "wire.h"

#include <unordered_map>

namespace forge::data {
namespace {

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const {
    return static_cast<size_t>(h.low ^ (h.high * 0x9E3779B97F4A7C15ull));
  }
};

}  // namespace

Json exact_dedup(Corpus& corpus, Ranks& ranks) {
  ProgressLine progress("prepare exact-dedup", "docs");
  const Placement at = place(ranks, corpus.docs.size());
  const auto R = static_cast<uint64_t>(ranks.size());
  // Each document's 128-bit hash goes to the rank that owns it (its low bits modulo the ranks); blocks
  // arrive in rank order, so the owner sees a hash's copies in input order and keeps the first.
  Outbox hashes(ranks.size());
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    progress.add(1, corpus.docs[i].text.size());
    const Hash128 h = xxh3_128(corpus.docs[i].text);
    hashes.to[h.low % R].put(h).put<uint64_t>(at.first + i);
  }
  const auto owned = ranks.exchange(hashes.blocks());
  std::unordered_map<Hash128, std::pair<uint64_t, uint64_t>, Hash128Hasher> first;  // -> (kept, copies)
  Outbox verdicts(ranks.size());
  for (size_t r = 0; r < owned.size(); ++r)
    for (Unpacker in(owned[r]); !in.done();) {
      const auto h = in.get<Hash128>();
      const auto g = in.get<uint64_t>();
      const auto [it, fresh] = first.emplace(h, std::make_pair(g, uint64_t{1}));
      if (fresh) continue;
      ++it->second.second;
      verdicts.to[r].put(g).put(it->second.first);  // g repeats it->second.first
    }
  uint64_t clusters = 0, largest = 0;
  for (const auto& [_, kept] : first) {
    clusters += kept.second > 1;
    largest = std::max(largest, kept.second);
  }
  std::vector<uint64_t> kept_as(corpus.docs.size(), UINT64_MAX);  // the document each removed one repeats
  for (const auto& block : ranks.exchange(verdicts.blocks()))
    for (Unpacker in(block); !in.done();) {
      const auto g = in.get<uint64_t>();
      kept_as[g - at.first] = in.get<uint64_t>();
    }
  std::vector<uint64_t> removed_by_domain(corpus.domains.size()), docs_by_domain(corpus.domains.size());
  std::vector<uint64_t> example_kept;
  Json examples = Json::array();
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    ++docs_by_domain[corpus.docs[i].domain];
    if (kept_as[i] == UINT64_MAX) continue;
    ++removed_by_domain[corpus.docs[i].domain];
    if (examples.size() < 5) {
      examples.push_back({{"removed", corpus.docs[i].source}});
      example_kept.push_back(kept_as[i]);
    }
  }
  // The kept copies' sources, which may live on other ranks (collective: before any document moves).
  const auto kept_sources = sources_of(ranks, corpus, at, example_kept);
  for (size_t k = 0; k < kept_sources.size(); ++k) examples[k]["kept"] = kept_sources[k];
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  for (size_t i = 0; i < corpus.docs.size(); ++i)
    if (kept_as[i] == UINT64_MAX) kept.push_back(std::move(corpus.docs[i]));
  progress.finish();
  uint64_t removed = 0;
  Json per_domain = Json::object();
  for (size_t d = 0; d < corpus.domains.size(); ++d) {
    removed += removed_by_domain[d];
    per_domain[corpus.domains[d]] = {
        {"documents", docs_by_domain[d]},
        {"removed", removed_by_domain[d]},
        {"rate", docs_by_domain[d] ? double(removed_by_domain[d]) / double(docs_by_domain[d]) : 0.0}};
  }
  const uint64_t in = corpus.docs.size();
  corpus.docs = std::move(kept);
  return {{"hash", "xxh3-128"},
          {"documents_in", in},
          {"removed", {{"exact_duplicate", removed}}},
          {"duplicate_rate", in ? double(removed) / double(in) : 0.0},
          {"clusters", clusters},
          {"largest_cluster", largest},
          {"per_domain", per_domain},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
