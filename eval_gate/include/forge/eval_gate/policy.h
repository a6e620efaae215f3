// The gate's policy file (configs/gate.example.ini): which domains must be evaluated, how many tokens
// make an evaluation count, and per metric the checks a candidate must pass against its baseline.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::gate {

// Checks on one metric, in the metric's direction: loss, bpb and kl are better lower, accuracy and
// reward_margin higher ("worse" and "better" below follow that). A value < 0 turns a check off.
// `domains` lists where it applies; empty means every evaluated domain.
struct MetricChecks {
  double max_absolute = -1;             // lower-is-better metrics: candidate <= max_absolute
  double min_absolute = -1;             // higher-is-better metrics: candidate >= min_absolute
  double max_relative_regression = -1;  // candidate no worse than baseline * (1 + x)
  double max_stderr_regression = -1;    // candidate no worse than baseline by more than x combined se
  double min_stderr_improvement = -1;   // candidate better than baseline by more than x combined se
  std::vector<std::string> domains;
};

// Checks on one metric of a task suite (the policy's [suite.NAME] section, keys METRIC.KIND). Absolute
// bounds are on the point estimate; a regression is judged on the confidence interval of the difference
// candidate - baseline (paired over the same tasks), so a difference inside the noise never fails.
struct SuiteMetricChecks {
  double min_absolute = -1;     // higher-is-better metrics: candidate >= x
  double max_absolute = -1;     // lower-is-better metrics (over_refusal_rate): candidate <= x
  double max_regression = -1;   // fail when the whole interval of the difference is worse than x
  double min_lower_bound = -1;  // higher-is-better metrics: the candidate's whole interval >= x (chance)
};

// Which task suites a candidate must be evaluated on ([suites]) and the checks on their metrics.
struct SuitePolicy {
  std::string dir;           // suites live at DIR/NAME/suite.json; relative to the policy file's directory
  double confidence = 0.95;  // of every interval
  std::vector<std::string> required;  // for every candidate
  // required.<objective or tier> = ...: added for candidates of that run.objective (lm, sft, dpo,
  // distill) or gated at that quota tier (forge-gate --tier).
  std::map<std::string, std::vector<std::string>> required_for;
  std::map<std::string, std::map<std::string, SuiteMetricChecks>> checks;  // suite -> metric -> checks

  // The suites a candidate of `objective` gated at `tier` ("" : none given) needs, in policy order.
  std::vector<std::string> suites_for(const std::string& objective, const std::string& tier) const;
};

struct GatePolicy {
  std::vector<std::string> required_domains;  // each must be present with >= min_tokens
  int64_t min_tokens = 1;                     // evaluated tokens per domain
  MetricChecks loss;                          // mean token cross-entropy (nats)
  MetricChecks bpb;                           // bits per byte
  MetricChecks kl;                            // distillation: mean token KL(teacher || model) (nats)
  MetricChecks accuracy;                      // DPO: share of held-out pairs ranked right
  MetricChecks reward_margin;                 // DPO: mean implicit reward margin
  SuitePolicy suites;
};

// Whether a larger value of `metric` is better: false for loss, bpb, kl and a suite's over_refusal_rate;
// true for accuracy, reward_margin and the other suite metrics.
bool higher_is_better(const std::string& metric);

// Throws forge::Error(kUsage) naming file:line for unknown keys and bad values.
GatePolicy load_policy(const std::string& path);

}  // namespace forge::gate
