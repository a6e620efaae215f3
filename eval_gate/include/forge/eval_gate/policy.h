// The gate's policy file (configs/gate.example.ini): which domains must be evaluated, how many tokens
// make an evaluation count, and per metric the checks a candidate must pass against its baseline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::gate {

// Checks on one metric (lower is better for every metric the gate computes). A value < 0 turns a check
// off. `domains` lists where it applies; empty means every evaluated domain.
struct MetricChecks {
  double max_absolute = -1;             // candidate <= max_absolute
  double max_relative_regression = -1;  // candidate <= baseline * (1 + x)
  double max_stderr_regression = -1;    // candidate - baseline <= x * combined standard error
  std::vector<std::string> domains;
};

struct GatePolicy {
  std::vector<std::string> required_domains;  // each must be present with >= min_tokens
  int64_t min_tokens = 1;                     // evaluated tokens per domain
  MetricChecks loss;                          // mean token cross-entropy (nats)
  MetricChecks bpb;                           // bits per byte
};

// Throws forge::Error(kUsage) naming file:line for unknown keys and bad values.
GatePolicy load_policy(const std::string& path);

}  // namespace forge::gate
