// `forge-data compare A B`: drift between two dataset versions.
#pragma once

#include "forge/common/json.h"

#include <map>
#include <string>
#include <vector>

namespace forge::data {

// Jensen-Shannon divergence (base 2, in [0, 1]) of two count distributions over the same keys.
double jensen_shannon(const std::vector<double>& p, const std::vector<double>& q);

// What changed and what it did. settings_changed: every pipeline setting that differs (dotted key, both
// values, the stage it belongs to) and the tokenizers; stages: per stage, documents removed in A and in B
// in total, per domain and per reason, with the settings of that stage that changed; explanation: one
// sentence per such stage naming the changed settings (or saying none did, so its input changed) and what
// it removed or now keeps. Distributions: domain_mix and language_mix (token shares and their total
// variation distances), tokens (JS divergence of the unigram distributions, over token pieces when the
// tokenizers differ); drift: any of the three exceeds threshold.
Json compare_datasets(const std::string& a, const std::string& b, double threshold);

// The comparison as the CLI prints it.
std::string compare_summary(const Json& comparison);

}  // namespace forge::data
