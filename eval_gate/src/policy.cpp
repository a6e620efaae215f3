#include "forge/eval_gate/policy.h"

#include "forge/common/config.h"

#include <sstream>

namespace forge::gate {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

// The metrics of the policy file, each a section. The DPO figures are better higher: their absolute bound
// is a minimum, and they have no relative check (a relative change of a margin near 0 means nothing).
struct MetricSection {
  const char* name;
  MetricChecks GatePolicy::*checks;
  bool higher_is_better;
};
constexpr MetricSection kSections[] = {{"loss", &GatePolicy::loss, false},
                                       {"bpb", &GatePolicy::bpb, false},
                                       {"kl", &GatePolicy::kl, false},
                                       {"accuracy", &GatePolicy::accuracy, true},
                                       {"reward_margin", &GatePolicy::reward_margin, true}};

void add_metric_keys(ConfigSchema& s, const MetricSection& m) {
  const std::string metric = m.name;
  if (m.higher_is_better) {
    s.add<double>(metric + ".min_absolute", -1, "fail below this value (-1: off)")
        .add<double>(metric + ".max_stderr_regression", -1,
                     "fail below baseline - x standard errors (-1: off)");
  } else {
    s.add<double>(metric + ".max_absolute", -1, "fail above this value (-1: off)")
        .add<double>(metric + ".max_relative_regression", -1, "fail above baseline*(1+x) (-1: off)")
        .add<double>(metric + ".max_stderr_regression", -1,
                     "fail above baseline + x standard errors (-1: off)");
  }
  s.add<double>(metric + ".min_stderr_improvement", -1,
                "fail unless better than baseline by more than x standard errors (-1: off)")
      .add<std::string>(metric + ".domains", "", "comma-separated domains the checks apply to (empty: all)");
}

MetricChecks metric_checks(const Config& c, const MetricSection& m) {
  const std::string metric = m.name;
  const auto get = [&](const char* key) {
    // A key the section does not have (schema above) stays off.
    return c.values().count(metric + "." + key) ? c.get<double>(metric + "." + key) : -1.0;
  };
  MetricChecks checks;
  checks.max_absolute = get("max_absolute");
  checks.min_absolute = get("min_absolute");
  checks.max_relative_regression = get("max_relative_regression");
  checks.max_stderr_regression = get("max_stderr_regression");
  checks.min_stderr_improvement = get("min_stderr_improvement");
  checks.domains = split_list(c.get<std::string>(metric + ".domains"));
  return checks;
}

}  // namespace

bool higher_is_better(const std::string& metric) {
  for (const auto& m : kSections)
    if (metric == m.name) return m.higher_is_better;
  return false;
}

GatePolicy load_policy(const std::string& path) {
  ConfigSchema schema;
  schema.add<std::string>("gate.required_domains", "", "comma-separated domains that must be evaluated")
      .add<int64_t>("gate.min_tokens", 1, "evaluated tokens each domain needs");
  for (const auto& m : kSections) add_metric_keys(schema, m);
  const Config c = load_config(schema, path, {});
  GatePolicy p;
  p.required_domains = split_list(c.get<std::string>("gate.required_domains"));
  p.min_tokens = c.get<int64_t>("gate.min_tokens");
  if (p.min_tokens < 1) c.reject("gate.min_tokens", "must be at least 1");
  for (const auto& m : kSections) {
    p.*m.checks = metric_checks(c, m);
    const std::string key = std::string(m.name) + ".max_relative_regression";
    if (c.values().count(key) && c.get<double>(key) < 0 && c.get<double>(key) != -1)
      c.reject(key, "must be >= 0, or -1 to turn the check off");
  }
  return p;
}

}  // namespace forge::gate
