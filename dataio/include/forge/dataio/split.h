// Stage 7: the held-out validation split, chosen per domain by hash. A unit goes whole: a document (keyed
// by the xxh3 of its text), or all files of a repository family (keyed by the family's name; its domain is
// that of its first file, and its files in other domains follow it). Per domain, units in key order go to
// validation until they hold ceil(f * n) of its n documents (at least one unit when the domain has two or
// more, never all of them). Without repositories: the ceil(f * n) documents with the lowest hashes.
// Depends only on the documents, so it is deterministic and disjoint from train.
#pragma once

#include "forge/dataio/document.h"
#include "forge/dataio/ranks.h"

#include <cstdint>
#include <vector>

namespace forge::data {

// 1 = validation, 0 = train, per document.
// On one rank's part of a distributed corpus: that part's sides (rank 0 decides for all).
std::vector<uint8_t> assign_valid_split(const Corpus& corpus, double valid_fraction, uint64_t seed,
                                        Ranks& ranks = single_rank());

}  // namespace forge::data
