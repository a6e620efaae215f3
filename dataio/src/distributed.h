// What the stages of a distributed prepare share (forge/dataio/ranks.h): the rank holding a global index,
// fetching a few documents' sources for a report, and merging the ranks' stage reports.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"
#include "forge/dataio/ranks.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

// This rank's place in the current corpus: global indices [first, first + local) of `total`, and where
// every rank's part starts (size() + 1 entries).
struct Placement {
  uint64_t first = 0, total = 0;
  std::vector<uint64_t> starts;
  int rank_of(uint64_t global) const;  // the rank holding document `global`
};
Placement place(Ranks& ranks, uint64_t local);

// The sources of documents `wanted` (global indices, any rank's), in the same order. Collective.
std::vector<std::string> sources_of(Ranks& ranks, const Corpus& corpus, const Placement& at,
                                    const std::vector<uint64_t>& wanted);

// One stage report from the ranks' reports of their parts (docs/DATA.md, "Distributed prepare"): counts
// add up; settings, plans and identical lists are taken once; wall seconds and largest figures are the
// maximum; examples are the first five in input order; rates are recomputed from the merged counts.
Json merge_reports(const std::vector<Json>& parts);

// Everyone's report of one stage, merged on every rank.
Json merged(Ranks& ranks, const Json& local);

}  // namespace forge::data
