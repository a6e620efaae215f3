// Stage 7: the held-out validation split, chosen per domain by document hash: the ceil(f * n) documents
// of a domain with the lowest xxh3 of their text go to validation (at least one when the domain has two
// or more, never all). Depends only on the documents, so it is deterministic and disjoint from train.
#pragma once

#include "forge/dataio/document.h"

#include <cstdint>
#include <vector>

namespace forge::data {

// 1 = validation, 0 = train, per document.
std::vector<uint8_t> assign_valid_split(const Corpus& corpus, double valid_fraction, uint64_t seed);

}  // namespace forge::data
