// Stage 9: quality.json and its readable summary (quality.txt, also printed by `prepare`).
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

// Unigram entropy (bits/token) and the most frequent tokens with their pieces.
Json token_distribution(const std::vector<uint64_t>& unigram, const Tokenizer* tokenizer, size_t top = 20);

// The human-readable summary of a quality.json document.
std::string quality_summary(const Json& quality);

// Peak resident memory of this process, in bytes.
uint64_t peak_rss_bytes();

}  // namespace forge::data
