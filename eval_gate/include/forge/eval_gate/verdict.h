// Judging a candidate's per-domain results against a baseline's under a gate policy.
#pragma once

#include "forge/common/json.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/stats.h"

#include <string>
#include <vector>

namespace forge::gate {

struct Check {
  std::string metric;  // "loss", "bpb" or "tokens"
  std::string domain;
  std::string kind;  // "max_absolute", "max_relative_regression", "max_stderr_regression", "min_tokens"
  double value = 0;  // the candidate's
  double baseline = 0;
  double limit = 0;  // the value the candidate had to stay within
  bool pass = false;
  Json to_json() const;
};

struct Judgement {
  bool pass = true;
  std::vector<Check> checks;
};

// Every check the policy asks for, on every domain it applies to. `baseline` may be null (no baseline:
// only absolute bounds and token minimums apply). Required domains must be present in `candidate`
// (the caller turns a domain missing from the dataset into an error before evaluating).
Judgement judge(const GatePolicy& policy, const DomainResults& candidate, const DomainResults* baseline);

// A few lines a person reads: per-domain metrics, each check, and the verdict.
std::string summary_text(const Json& verdict);

}  // namespace forge::gate
