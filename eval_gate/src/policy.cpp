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

void add_metric_keys(ConfigSchema& s, const std::string& metric) {
  s.add<double>(metric + ".max_absolute", -1, "fail above this value (-1: off)")
      .add<double>(metric + ".max_relative_regression", -1, "fail above baseline*(1+x) (-1: off)")
      .add<double>(metric + ".max_stderr_regression", -1, "fail above baseline + x standard errors (-1: off)")
      .add<std::string>(metric + ".domains", "", "comma-separated domains the checks apply to (empty: all)");
}

MetricChecks metric_checks(const Config& c, const std::string& metric) {
  MetricChecks m;
  m.max_absolute = c.get<double>(metric + ".max_absolute");
  m.max_relative_regression = c.get<double>(metric + ".max_relative_regression");
  m.max_stderr_regression = c.get<double>(metric + ".max_stderr_regression");
  m.domains = split_list(c.get<std::string>(metric + ".domains"));
  return m;
}

}  // namespace

GatePolicy load_policy(const std::string& path) {
  ConfigSchema schema;
  schema.add<std::string>("gate.required_domains", "", "comma-separated domains that must be evaluated")
      .add<int64_t>("gate.min_tokens", 1, "evaluated tokens each domain needs");
  add_metric_keys(schema, "loss");
  add_metric_keys(schema, "bpb");
  const Config c = load_config(schema, path, {});
  GatePolicy p;
  p.required_domains = split_list(c.get<std::string>("gate.required_domains"));
  p.min_tokens = c.get<int64_t>("gate.min_tokens");
  if (p.min_tokens < 1) c.reject("gate.min_tokens", "must be at least 1");
  p.loss = metric_checks(c, "loss");
  p.bpb = metric_checks(c, "bpb");
  for (const char* metric : {"loss", "bpb"}) {
    const std::string key = std::string(metric) + ".max_relative_regression";
    const double v = c.get<double>(key);
    if (v < 0 && v != -1) c.reject(key, "must be >= 0, or -1 to turn the check off");
  }
  return p;
}

}  // namespace forge::gate
