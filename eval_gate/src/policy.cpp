#include "forge/eval_gate/policy.h"

#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/ini.h"

#include <algorithm>
#include <filesystem>
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
  // A suite metric is a share of tasks done right (or a caption score); over-refusal is the share done
  // wrong.
  return metric != "over_refusal_rate";
}

std::vector<std::string> SuitePolicy::suites_for(const std::string& objective,
                                                 const std::string& tier) const {
  std::vector<std::string> out = required;
  for (const std::string& key : {objective, tier}) {
    const auto it = required_for.find(key);
    if (key.empty() || it == required_for.end()) continue;
    for (const auto& s : it->second)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

GatePolicy load_policy(const std::string& path) {
  ConfigSchema schema;
  schema.add<std::string>("gate.required_domains", "", "comma-separated domains that must be evaluated")
      .add<int64_t>("gate.min_tokens", 1, "evaluated tokens each domain needs")
      .add<std::string>("suites.dir", "suites", "where the suites are: DIR/NAME/suite.json")
      .add<double>("suites.confidence", 0.95, "confidence level of every interval")
      .add<std::string>("suites.required", "", "comma-separated suites every candidate needs");
  for (const auto& m : kSections) add_metric_keys(schema, m);
  // The keys named by what the file holds: required.<objective or tier> in [suites], and per [suite.NAME]
  // METRIC.KIND (a metric the suite does not have is an error once the suite is loaded).
  std::vector<std::string> suite_names, required_keys;
  std::vector<std::string> suite_keys;
  for (const IniSection& section : read_ini(path)) {
    if (section.name == "suites") {
      for (const IniEntry& e : section.entries)
        if (e.key.rfind("required.", 0) == 0) {
          required_keys.push_back(e.key);
          schema.add<std::string>("suites." + e.key, "", "suites candidates of this objective or tier need");
        }
    } else if (section.name.rfind("suite.", 0) == 0) {
      suite_names.push_back(section.name.substr(6));
      for (const IniEntry& e : section.entries) {
        const auto dot = e.key.rfind('.');
        const std::string kind = dot == std::string::npos ? "" : e.key.substr(dot + 1);
        if (kind != "min_absolute" && kind != "min_lower_bound" && kind != "max_absolute" &&
            kind != "max_regression")
          fail(ExitCode::kUsage,
               "{}:{}: [{}] {}: a suite's keys are METRIC.min_absolute, METRIC.min_lower_bound, "
               "METRIC.max_absolute or METRIC.max_regression (e.g. accuracy.min_absolute = 0.5)",
               path, e.line, section.name, e.key);
        schema.add<double>(section.name + "." + e.key, -1, "a check on a suite metric");
        suite_keys.push_back(section.name + "." + e.key);
      }
    }
  }
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
  SuitePolicy& sp = p.suites;
  sp.dir = c.get<std::string>("suites.dir");
  if (!sp.dir.empty() && sp.dir.front() != '/')
    sp.dir = (std::filesystem::path(path).parent_path() / sp.dir).lexically_normal().string();
  sp.confidence = c.get<double>("suites.confidence");
  if (!(sp.confidence > 0 && sp.confidence < 1)) c.reject("suites.confidence", "must be between 0 and 1");
  sp.required = split_list(c.get<std::string>("suites.required"));
  for (const auto& key : required_keys)
    sp.required_for[key.substr(9)] = split_list(c.get<std::string>("suites." + key));
  for (const auto& name : suite_names) sp.checks[name];  // a section without keys still names a suite
  for (const auto& key : suite_keys) {
    // suite.NAME.METRIC.KIND (suite names hold no dot).
    const std::string rest = key.substr(6);
    const auto first = rest.find('.'), last = rest.rfind('.');
    const std::string suite = rest.substr(0, first), metric = rest.substr(first + 1, last - first - 1),
                      kind = rest.substr(last + 1);
    const double v = c.get<double>(key);
    // CIDEr-D is on the COCO scale, 0 to 10; every other suite metric is a share.
    const double top = metric == "cider_d" ? 10 : 1;
    if ((v < 0 && v != -1) || v > top)
      c.reject(key, fmt::format("{} is {}: give a value from 0 to {}, or -1 to turn the check off", metric,
                                metric == "cider_d" ? "a CIDEr-D score" : "a share", top));
    SuiteMetricChecks& checks = sp.checks[suite][metric];
    (kind == "min_absolute"      ? checks.min_absolute
     : kind == "min_lower_bound" ? checks.min_lower_bound
     : kind == "max_absolute"    ? checks.max_absolute
                                 : checks.max_regression) = v;
  }
  return p;
}

}  // namespace forge::gate
