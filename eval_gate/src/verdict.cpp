#include "forge/eval_gate/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace forge::gate {

Json Check::to_json() const {
  return {{"metric", metric},     {"domain", domain}, {"kind", kind}, {"value", value},
          {"baseline", baseline}, {"limit", limit},   {"pass", pass}, {"higher_is_better", higher_is_better}};
}

namespace {

// A metric of a domain's results, its standard error, its floor (NaN: none; judge's comment in verdict.h)
// and the standard error of a model at the floor measured on the candidate's pairs.
struct Metric {
  const char* name;
  MetricChecks GatePolicy::*checks;
  double (*value)(const DomainStats&);
  double (*se)(const DomainStats&);
  double floor;
  double (*floor_se)(const DomainStats&);
};
const Metric kMetrics[] = {
    {"loss", &GatePolicy::loss, [](const DomainStats& s) { return s.mean_loss(); },
     [](const DomainStats& s) { return s.loss_stderr(); }, NAN, nullptr},
    {"bpb", &GatePolicy::bpb, [](const DomainStats& s) { return s.bits_per_byte(); },
     [](const DomainStats& s) { return s.bpb_stderr(); }, NAN, nullptr},
    {"kl", &GatePolicy::kl, [](const DomainStats& s) { return s.kl(); },
     [](const DomainStats& s) { return s.kl_stderr(); }, NAN, nullptr},
    // Chance ranks each pair by a fair coin: standard deviation 0.5 per pair.
    {"accuracy", &GatePolicy::accuracy, [](const DomainStats& s) { return s.correct.mean(); },
     [](const DomainStats& s) { return s.correct.se(); }, 0.5,
     [](const DomainStats& s) { return 0.5 / std::sqrt(s.correct.n); }},
    // The reference's margin is exactly 0 on every pair.
    {"reward_margin", &GatePolicy::reward_margin, [](const DomainStats& s) { return s.margin.mean(); },
     [](const DomainStats& s) { return s.margin.se(); }, 0.0, [](const DomainStats&) { return 0.0; }},
};

void add_metric_checks(const Metric& metric, const MetricChecks& m, const DomainResults& cand,
                       const DomainResults* base, Judgement& out) {
  const bool higher = higher_is_better(metric.name);
  const double worse = higher ? -1 : 1;  // the direction in which the metric gets worse
  for (const auto& [domain, stats] : cand) {
    if (!m.domains.empty() && std::find(m.domains.begin(), m.domains.end(), domain) == m.domains.end())
      continue;
    const double value = metric.value(stats);
    const auto add = [&](const char* kind, double baseline, double limit, bool strict) {
      // NaN never passes: a comparison with NaN is false.
      const bool pass =
          higher ? (strict ? value > limit : value >= limit) : (strict ? value < limit : value <= limit);
      out.checks.push_back({metric.name, domain, kind, value, baseline, limit, pass, higher});
    };
    if (!higher && m.max_absolute >= 0) add("max_absolute", NAN, m.max_absolute, false);
    if (higher && m.min_absolute >= 0) add("min_absolute", NAN, m.min_absolute, false);
    const auto b = base ? base->find(domain) : DomainResults::const_iterator{};
    double bv = NAN, bse = 0;
    if (base && b != base->end()) {
      bv = metric.value(b->second);
      bse = metric.se(b->second);
    }
    const bool floored = !std::isnan(metric.floor) && !(bv >= metric.floor);
    if (floored) bv = metric.floor;
    if (std::isnan(bv)) continue;  // no baseline
    // A floor is a fixed value, not an estimate: the candidate's standard error alone counts, but never
    // less than a model at the floor would show on as many pairs (against chance, the z-test of a
    // proportion), so that every one of a few pairs ranked right (standard error 0) is no confidence.
    const double se =
        floored ? std::max(metric.se(stats), metric.floor_se(stats)) : std::hypot(metric.se(stats), bse);
    if (m.max_relative_regression >= 0)
      add("max_relative_regression", bv, bv * (1 + worse * m.max_relative_regression), false);
    if (m.max_stderr_regression >= 0)
      add("max_stderr_regression", bv, bv + worse * m.max_stderr_regression * se, false);
    // Strictly better: a candidate equal to its baseline (the reference itself, margin 0 with no spread)
    // has not improved.
    if (m.min_stderr_improvement >= 0)
      add("min_stderr_improvement", bv, bv - worse * m.min_stderr_improvement * se, true);
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
    // More is better: it passes when tokens >= limit.
    j.checks.push_back({"tokens", d, "min_tokens", tokens, NAN, static_cast<double>(policy.min_tokens),
                        tokens >= static_cast<double>(policy.min_tokens), true});
  }
  for (const Metric& metric : kMetrics)
    add_metric_checks(metric, policy.*metric.checks, candidate, baseline, j);
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
  // The objective's own figures, where measured: candidate (and baseline).
  const Json baselines = v.value("baseline_domains", Json::object());
  for (const auto& [domain, s] : v.at("domains").items())
    for (const char* metric : {"kl", "accuracy", "reward_margin"}) {
      if (!s.contains(metric)) continue;
      const std::string se = std::string(metric) + "_se";
      const Json b = baselines.contains(domain) ? baselines.at(domain) : Json::object();
      out += fmt::format("{:<12} {:<13} {:>9.4f} ±{:.4f}{}\n", domain, metric, s.at(metric).get<double>(),
                         s.at(se).get<double>(),
                         b.contains(metric) ? fmt::format("  (baseline {:.4f} ±{:.4f})",
                                                          b.at(metric).get<double>(), b.at(se).get<double>())
                                            : std::string());
    }
  out += "\n";
  for (const auto& c : v.at("checks")) {
    const double base = c.at("baseline").is_number() ? c.at("baseline").get<double>() : NAN;
    out += fmt::format("{} {:<13} {:<10} {:<24} value {:.4f} limit {:.4f}{}\n",
                       c.at("pass").get<bool>() ? "pass" : "FAIL", c.at("metric").get<std::string>(),
                       c.at("domain").get<std::string>(), c.at("kind").get<std::string>(),
                       c.at("value").is_number() ? c.at("value").get<double>() : NAN,
                       c.at("limit").is_number() ? c.at("limit").get<double>() : NAN,
                       std::isnan(base) ? std::string() : fmt::format(" (baseline {:.4f})", base));
  }
  return out;
}

}  // namespace forge::gate
