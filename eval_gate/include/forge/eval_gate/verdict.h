// Judging a candidate's per-domain results against a baseline's under a gate policy.
#pragma once

#include "forge/common/json.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/stats.h"
#include "forge/eval_gate/tasks.h"

#include <cmath>
#include <map>

#include <string>
#include <vector>

namespace forge::gate {

struct Check {
  std::string metric;  // "loss", "bpb", "kl", "accuracy", "reward_margin" or "tokens"
  std::string domain;
  std::string kind;  // a MetricChecks field ("max_absolute", "min_stderr_improvement", ...) or "min_tokens"
  double value = 0;  // the candidate's
  double baseline = 0;  // what the candidate was compared with (NaN: a fixed bound)
  double limit = 0;     // the value the candidate had to stay within
  bool pass = false;
  bool higher_is_better = false;  // pass means value >= limit (an improvement check: >), else value <= limit
  // A suite's regression check: value is the difference candidate - baseline and [lo, hi] its confidence
  // interval, which must reach the limit (hi >= limit, or lo <= limit for a lower-is-better metric).
  // min_lower_bound: value is the candidate's and [lo, hi] its interval, whose lo must reach the limit.
  double lo = NAN, hi = NAN;
  Json to_json() const;
};

struct Judgement {
  bool pass = true;
  std::vector<Check> checks;
};

// Every check the policy asks for, on every domain it applies to. `baseline` may be null (no baseline:
// only absolute bounds and token minimums apply). Required domains must be present in `candidate`
// (the caller turns a domain missing from the dataset into an error before evaluating). The DPO figures
// have a floor, what a model with no preference scores: chance (accuracy 0.5) and the reference's own
// margin (0). A baseline below it, or none, is replaced by it, so a DPO candidate must beat chance and
// its reference whatever the baseline, and the baseline too when that is better. Against a baseline the
// standard error of a difference is the two combined (hypot); against a floor the candidate's, but not
// less than chance's own on as many pairs, 0.5 / sqrt(pairs).
Judgement judge(const GatePolicy& policy, const DomainResults& candidate, const DomainResults* baseline);

// forge::Error(kUsage) naming the key when the policy's [suite.NAME] checks a metric a suite of `type` with
// `metrics` does not have.
void check_suite_policy(const SuitePolicy& policy, const std::string& suite, const std::string& type,
                        const std::vector<std::string>& metrics);

// Adds the checks of the task suites: per suite the policy requires of this candidate, and per metric
// with checks in its [suite.NAME] section, on `candidate`'s results and, for regressions, the baseline's
// of the same suite version (the caller has refused other versions). A metric the suite does not have is
// check_suite_policy's error. Domain of a suite check: "suite:NAME".
void judge_suites(const SuitePolicy& policy, const std::vector<std::string>& required,
                  const std::map<std::string, SuiteResult>& candidate,
                  const std::map<std::string, SuiteResult>* baseline, Judgement& out);

// A few lines a person reads: per-domain metrics, each check, and the verdict.
std::string summary_text(const Json& verdict);

}  // namespace forge::gate
