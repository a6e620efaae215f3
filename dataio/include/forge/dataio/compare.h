// `forge-data compare A B`: drift between two dataset versions.
#pragma once

#include "forge/common/json.h"

#include <map>
#include <string>
#include <vector>

namespace forge::data {

// Jensen-Shannon divergence (base 2, in [0, 1]) of two count distributions over the same keys.
double jensen_shannon(const std::vector<double>& p, const std::vector<double>& q);

// domain_mix: per-domain token shares and their total variation distance; tokens: JS divergence of the
// unigram distributions (over token pieces when the tokenizers differ); drift: either exceeds threshold.
Json compare_datasets(const std::string& a, const std::string& b, double threshold);

}  // namespace forge::data
