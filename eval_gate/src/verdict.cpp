#include "forge/eval_gate/verdict.h"

#include "forge/common/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <ranges>

namespace forge::gate {

Json Check::to_json() const {
  Json j = {
      {"metric", metric},     {"domain", domain}, {"kind", kind}, {"value", value},
      {"baseline", baseline}, {"limit", limit},   {"pass", pass}, {"higher_is_better", higher_is_better}};
  if (!std::isnan(lo)) j["interval"] = {lo, hi};
  return j;
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

void check_suite_policy(const SuitePolicy& policy, const std::string& suite, const std::string& type,
                        const std::vector<std::string>& metrics) {
  const auto checks = policy.checks.find(suite);
  if (checks == policy.checks.end()) return;
  for (const auto& [metric, _] : checks->second)
    if (std::find(metrics.begin(), metrics.end(), metric) == metrics.end())
      fail(ExitCode::kUsage, "gate policy: [suite.{}] checks {}, which a {} suite does not have (it has: {})",
           suite, metric, type, fmt::join(metrics, ", "));
}

void judge_suites(const SuitePolicy& policy, const std::vector<std::string>& required,
                  const std::map<std::string, SuiteResult>& candidate,
                  const std::map<std::string, SuiteResult>* baseline, Judgement& out) {
  for (const std::string& name : required) {
    const auto c = candidate.find(name);
    if (c == candidate.end()) {
      out.checks.push_back({"tasks", "suite:" + name, "evaluated", 0, NAN, 1, false, true});
      continue;
    }
    const auto checks = policy.checks.find(name);
    if (checks == policy.checks.end()) continue;
    for (const auto& [metric, m] : checks->second) {
      const auto keys = c->second.metrics | std::views::keys;
      check_suite_policy(policy, name, c->second.type, {keys.begin(), keys.end()});
      const SuiteMetric& cand = c->second.metrics.at(metric);
      const bool higher = higher_is_better(metric);
      const double value = cand.value();
      // NaN (no task scored) never passes.
      if (higher && m.min_absolute >= 0)
        out.checks.push_back({metric, "suite:" + name, "min_absolute", value, NAN, m.min_absolute,
                              value >= m.min_absolute, true});
      if (higher && m.min_lower_bound >= 0) {
        const Interval ci = cand.interval(policy.confidence);
        Check check{metric, "suite:" + name,   "min_lower_bound",          value,
                    NAN,    m.min_lower_bound, ci.lo >= m.min_lower_bound, true};  // NaN never passes
        check.lo = ci.lo;
        check.hi = ci.hi;
        out.checks.push_back(check);
      }
      if (!higher && m.max_absolute >= 0)
        out.checks.push_back({metric, "suite:" + name, "max_absolute", value, NAN, m.max_absolute,
                              value <= m.max_absolute, false});
      const SuiteResult* base = nullptr;
      if (baseline) {
        const auto b = baseline->find(name);
        if (b != baseline->end() && b->second.metrics.count(metric)) base = &b->second;
      }
      if (m.max_regression < 0 || base == nullptr) continue;
      // The tasks both were scored on (the same suite version: all of them).
      const SuiteMetric& bm = base->metrics.at(metric);
      std::vector<double> a, b;
      for (const auto& [id, v] : cand.per_task) {
        const auto it = bm.per_task.find(id);
        if (it == bm.per_task.end()) continue;
        a.push_back(v);
        b.push_back(it->second);
      }
      Interval ci{NAN, NAN};
      if (cand.rate && bm.rate) {
        double sa = 0, sb = 0;
        for (size_t i = 0; i < a.size(); ++i) sa += a[i], sb += b[i];
        ci = newcombe_difference(sa, double(a.size()), sb, double(b.size()), policy.confidence);
      } else if (!a.empty()) {
        ci = bootstrap_paired_difference(a, b, policy.confidence, kBootstrapResamples, kBootstrapSeed);
      }
      double diff = 0;
      for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) / double(a.size());
      const double limit = higher ? -m.max_regression : m.max_regression;
      // NaN (no common task) never passes.
      const bool pass = higher ? ci.hi >= limit : ci.lo <= limit;
      Check check{metric, "suite:" + name, "max_regression", diff, bm.value(), limit, pass, higher};
      check.lo = ci.lo;
      check.hi = ci.hi;
      out.checks.push_back(check);
    }
  }
  out.pass = std::all_of(out.checks.begin(), out.checks.end(), [](const Check& c) { return c.pass; });
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
  // The task suites: each metric with its interval, and the baseline's beside it.
  const Json suites = v.value("suites", Json::object()),
             base_suites = v.value("baseline_suites", Json::object());
  if (!suites.empty()) {
    // A metric no task was scored on (a refusal suite without benign prompts) has no value: null.
    const auto num = [](const Json& x) { return x.is_number() ? x.get<double>() : NAN; };
    const auto ci = [&](const Json& m) {
      return fmt::format("{:.3f} [{:.3f}, {:.3f}]", num(m.at("value")), num(m.at("lo")), num(m.at("hi")));
    };
    out += fmt::format("\n{:<10} {:<16} {:>5}  {:<18} {:<24} {}\n", "suite", "type", "tasks", "metric",
                       "value [interval]", "baseline");
    for (const auto& [name, s] : suites.items()) {
      for (const auto& [metric, m] : s.at("metrics").items()) {
        const Json b =
            base_suites.contains(name) ? base_suites.at(name).at("metrics").value(metric, Json()) : Json();
        out += fmt::format("{:<10} {:<16} {:>5}  {:<18} {:<24} {}\n", name, s.at("type").get<std::string>(),
                           s.at("tasks").get<int64_t>(), metric, ci(m), b.is_object() ? ci(b) : "-");
      }
      if (s.at("generation").at("new_tokens").get<int64_t>() > 0)
        out += fmt::format("{:<10} generated {} tokens at {:.0f} tokens/s (rank 0), suite version {}\n", name,
                           s.at("generation").at("new_tokens").get<int64_t>(),
                           s.at("generation").at("tokens_per_second").get<double>(),
                           s.at("version").get<std::string>());
    }
  }
  out += "\n";
  for (const auto& c : v.at("checks")) {
    const double base = c.at("baseline").is_number() ? c.at("baseline").get<double>() : NAN;
    // A regression judged on an interval shows it.
    const std::string interval =
        c.contains("interval") ? fmt::format(" interval [{:.4f}, {:.4f}]", c.at("interval")[0].get<double>(),
                                             c.at("interval")[1].get<double>())
                               : std::string();
    out += fmt::format("{} {:<13} {:<10} {:<24} value {:.4f}{} limit {:.4f}{}\n",
                       c.at("pass").get<bool>() ? "pass" : "FAIL", c.at("metric").get<std::string>(),
                       c.at("domain").get<std::string>(), c.at("kind").get<std::string>(),
                       c.at("value").is_number() ? c.at("value").get<double>() : NAN, interval,
                       c.at("limit").is_number() ? c.at("limit").get<double>() : NAN,
                       std::isnan(base) ? std::string() : fmt::format(" (baseline {:.4f})", base));
  }
  return out;
}

}  // namespace forge::gate
