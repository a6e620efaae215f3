#include "forge/eval_gate/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace forge::gate {

Json Check::to_json() const {
  return {{"metric", metric},     {"domain", domain}, {"kind", kind}, {"value", value},
          {"baseline", baseline}, {"limit", limit},   {"pass", pass}};
}

namespace {

double metric_of(const DomainStats& s, const std::string& metric) {
  return metric == "loss" ? s.mean_loss() : s.bits_per_byte();
}
double stderr_of(const DomainStats& s, const std::string& metric) {
  return metric == "loss" ? s.loss_stderr() : s.bpb_stderr();
}

void add_metric_checks(const std::string& metric, const MetricChecks& m, const DomainResults& cand,
                       const DomainResults* base, Judgement& out) {
  for (const auto& [domain, stats] : cand) {
    if (!m.domains.empty() && std::find(m.domains.begin(), m.domains.end(), domain) == m.domains.end())
      continue;
    const double value = metric_of(stats, metric);
    const auto add = [&](const char* kind, double baseline, double limit) {
      // NaN never passes: a comparison with NaN is false.
      out.checks.push_back({metric, domain, kind, value, baseline, limit, value <= limit});
    };
    if (m.max_absolute >= 0) add("max_absolute", NAN, m.max_absolute);
    const auto b = base ? base->find(domain) : DomainResults::const_iterator{};
    if (!base || b == base->end()) continue;
    const double bv = metric_of(b->second, metric);
    if (m.max_relative_regression >= 0)
      add("max_relative_regression", bv, bv * (1 + m.max_relative_regression));
    if (m.max_stderr_regression >= 0) {
      const double se = std::hypot(stderr_of(stats, metric), stderr_of(b->second, metric));
      add("max_stderr_regression", bv, bv + m.max_stderr_regression * se);
    }
  }
}

}  // namespace

Judgement judge(const GatePolicy& policy, const DomainResults& candidate, const DomainResults* baseline) {
  Judgement j;
  std::vector<std::string> domains = policy.required_domains;
  for (const auto& [d, _] : candidate)
    if (std::find(domains.begin(), domains.end(), d) == domains.end()) domains.push_back(d);
  for (const auto& d : domains) {
    const auto it = candidate.find(d);
    const double tokens = it == candidate.end() ? 0 : static_cast<double>(it->second.tokens);
    // The one check where more is better: it passes when tokens >= limit.
    j.checks.push_back({"tokens", d, "min_tokens", tokens, NAN, static_cast<double>(policy.min_tokens),
                        tokens >= static_cast<double>(policy.min_tokens)});
  }
  add_metric_checks("loss", policy.loss, candidate, baseline, j);
  add_metric_checks("bpb", policy.bpb, candidate, baseline, j);
  j.pass = std::all_of(j.checks.begin(), j.checks.end(), [](const Check& c) { return c.pass; });
  return j;
}

std::string summary_text(const Json& v) {
  std::string out =
      fmt::format("gate verdict: {}\ncandidate: {}\nbaseline:  {}\ndataset:   {}\n\n",
                  v.at("pass").get<bool>() ? "PASS" : "FAIL", v.at("candidate").value("path", "?"),
                  v.at("baseline").is_null() ? "none" : v.at("baseline").value("path", "?"),
                  v.value("dataset_version", "?"));
  out +=
      fmt::format("{:<12} {:>9} {:>9} {:>8} {:>9} {:>7}\n", "domain", "tokens", "loss", "±se", "ppl", "bpb");
  for (const auto& [domain, s] : v.at("domains").items())
    out += fmt::format("{:<12} {:>9} {:>9.4f} {:>8.4f} {:>9.2f} {:>7.4f}\n", domain,
                       s.at("tokens").get<int64_t>(), s.at("loss").get<double>(),
                       s.at("loss_se").get<double>(), s.at("ppl").get<double>(), s.at("bpb").get<double>());
  out += "\n";
  for (const auto& c : v.at("checks")) {
    const double base = c.at("baseline").is_number() ? c.at("baseline").get<double>() : NAN;
    out += fmt::format("{} {:<6} {:<10} {:<24} value {:.4f} limit {:.4f}{}\n",
                       c.at("pass").get<bool>() ? "pass" : "FAIL", c.at("metric").get<std::string>(),
                       c.at("domain").get<std::string>(), c.at("kind").get<std::string>(),
                       c.at("value").is_number() ? c.at("value").get<double>() : NAN,
                       c.at("limit").is_number() ? c.at("limit").get<double>() : NAN,
                       std::isnan(base) ? std::string() : fmt::format(" (baseline {:.4f})", base));
  }
  return out;
}

}  // namespace forge::gate
