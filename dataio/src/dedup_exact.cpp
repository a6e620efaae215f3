#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/dedup.h"

#include <unordered_map>

namespace forge::data {

Json exact_dedup(Corpus& corpus) {
  ProgressLine progress("prepare exact-dedup", "docs");
  // Keyed by the 128-bit content hash; the value is the index (in the output) of the kept document.
  std::unordered_map<std::string, size_t> seen;
  std::vector<uint64_t> cluster_size;  // by kept index
  std::vector<uint64_t> removed_by_domain(corpus.domains.size()), docs_by_domain(corpus.domains.size());
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  Json examples = Json::array();
  for (auto& doc : corpus.docs) {
    progress.add(1, doc.text.size());
    ++docs_by_domain[doc.domain];
    const auto [it, inserted] = seen.emplace(xxh3_128_hex(doc.text), kept.size());
    if (inserted) {
      kept.push_back(std::move(doc));
      cluster_size.push_back(1);
      continue;
    }
    ++cluster_size[it->second];
    ++removed_by_domain[doc.domain];
    if (examples.size() < 5) examples.push_back({{"removed", doc.source}, {"kept", kept[it->second].source}});
  }
  progress.finish();
  uint64_t clusters = 0, largest = 0, removed = 0;
  for (uint64_t s : cluster_size) {
    if (s > 1) ++clusters;
    largest = std::max(largest, s);
    removed += s - 1;
  }
  Json per_domain = Json::object();
  for (size_t d = 0; d < corpus.domains.size(); ++d) {
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
