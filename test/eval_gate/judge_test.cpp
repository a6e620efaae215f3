#include "forge/common/error.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/verdict.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

using namespace forge::gate;

namespace {

// A domain whose sequences have the given mean losses, 100 tokens and 400 bytes each.
DomainStats domain(std::initializer_list<double> seq_losses) {
  DomainStats s;
  for (double l : seq_losses) s.add_sequence(l, 100, 400);
  return s;
}

const Check* find(const Judgement& j, const std::string& metric, const std::string& domain,
                  const std::string& kind) {
  for (const auto& c : j.checks)
    if (c.metric == metric && c.domain == domain && c.kind == kind) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("domain statistics: mean, standard error, perplexity, bits per byte") {
  const DomainStats s = domain({2.0, 3.0, 4.0});
  CHECK(s.mean_loss() == Approx(3.0));
  CHECK(s.loss_stderr() == Approx(1.0 / std::sqrt(3.0)));  // sample sd 1, n 3
  CHECK(s.perplexity() == Approx(std::exp(3.0)));
  CHECK(s.bits_per_byte() == Approx(3.0 * 300 / (std::log(2.0) * 1200)));
  CHECK(domain({2.0}).loss_stderr() == 0);

  DomainStats merged = domain({2.0});
  merged.merge(domain({3.0, 4.0}));
  CHECK(merged.mean_loss() == Approx(s.mean_loss()));
  CHECK(merged.loss_stderr() == Approx(s.loss_stderr()));

  const std::vector<std::string> names{"code", "legal"};
  const DomainResults back = unpack(pack({{"code", s}}, names), names);
  REQUIRE(back.count("code") == 1);
  CHECK(back.count("legal") == 0);
  CHECK(back.at("code").loss_stderr() == Approx(s.loss_stderr()));
  CHECK(DomainStats::from_json(s.to_json()).bits_per_byte() == Approx(s.bits_per_byte()));
}

TEST_CASE("relative and standard-error regressions fail, improvements pass") {
  GatePolicy p;
  p.min_tokens = 100;
  p.loss.max_relative_regression = 0.01;
  p.loss.max_stderr_regression = 2.0;
  const DomainResults base{{"code", domain({3.0, 3.1, 2.9, 3.0})}};
  const DomainResults better{{"code", domain({2.8, 2.9, 2.7, 2.8})}};
  const DomainResults worse{{"code", domain({3.5, 3.6, 3.4, 3.5})}};

  const Judgement ok = judge(p, better, &base);
  CHECK(ok.pass);
  const Judgement bad = judge(p, worse, &base);
  CHECK_FALSE(bad.pass);
  const Check* rel = find(bad, "loss", "code", "max_relative_regression");
  REQUIRE(rel);
  CHECK_FALSE(rel->pass);
  CHECK(rel->limit == Approx(base.at("code").mean_loss() * 1.01));
  CHECK_FALSE(find(bad, "loss", "code", "max_stderr_regression")->pass);
}

TEST_CASE("without a baseline only absolute bounds and token minimums apply") {
  GatePolicy p;
  p.min_tokens = 1000;
  p.required_domains = {"code"};
  p.bpb.max_absolute = 10;
  p.loss.max_relative_regression = 0.0;
  const Judgement j = judge(p, {{"code", domain({1.0})}}, nullptr);
  CHECK_FALSE(j.pass);  // 100 tokens < 1000
  CHECK_FALSE(find(j, "tokens", "code", "min_tokens")->pass);
  CHECK(find(j, "bpb", "code", "max_absolute")->pass);
  CHECK(find(j, "loss", "code", "max_relative_regression") == nullptr);
}

TEST_CASE("a required domain absent from the results fails its token check; NaN never passes") {
  GatePolicy p;
  p.required_domains = {"code", "legal"};
  p.loss.max_absolute = 100;
  DomainStats nan_domain;
  nan_domain.add_sequence(NAN, 100, 400);
  const Judgement j = judge(p, {{"code", nan_domain}}, nullptr);
  CHECK_FALSE(j.pass);
  CHECK_FALSE(find(j, "tokens", "legal", "min_tokens")->pass);
  CHECK_FALSE(find(j, "loss", "code", "max_absolute")->pass);
}

TEST_CASE("policy files: values, domain lists and errors with file:line") {
  forge::test::TempDir dir;
  const GatePolicy p = load_policy(dir.write("gate.ini",
                                             "[gate]\nrequired_domains = code, legal\nmin_tokens = 512\n"
                                             "[loss]\nmax_relative_regression = 0.02\ndomains = code\n"));
  CHECK(p.required_domains == std::vector<std::string>{"code", "legal"});
  CHECK(p.min_tokens == 512);
  CHECK(p.loss.max_relative_regression == Approx(0.02));
  CHECK(p.loss.domains == std::vector<std::string>{"code"});
  CHECK(p.bpb.max_absolute < 0);

  const auto bad = dir.write("bad.ini", "[gate]\nmin_tokens = 0\n");
  try {
    load_policy(bad);
    FAIL("expected an error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK(std::string(e.what()) == bad + ":2: gate.min_tokens = 0: must be at least 1");
  }
}

namespace {

// A suite's results with `right` of `n` tasks scored 1 on `metric` (task ids t0, t1, ...).
SuiteResult suite_result(const std::string& metric, int right, int n, const std::string& version = "v1") {
  SuiteResult r;
  r.name = "arith";
  r.type = "exact_match";
  r.version = version;
  r.tasks = n;
  SuiteMetric& m = r.metrics[metric];
  for (int i = 0; i < n; ++i) m.per_task[fmt::format("t{}", i)] = i < right ? 1 : 0;
  return r;
}

SuitePolicy arith_policy() {
  SuitePolicy p;
  p.required = {"arith"};
  p.checks["arith"]["accuracy"] = {0.5, -1, 0.0};
  return p;
}

}  // namespace

TEST_CASE("suite verdicts: trained passes, untrained fails, noise passes, a real regression fails",
          "[gate][suites]") {
  const SuitePolicy p = arith_policy();
  const auto judged = [&](const SuiteResult& cand, const SuiteResult* base) {
    const std::map<std::string, SuiteResult> c{{"arith", cand}};
    std::map<std::string, SuiteResult> b;
    if (base) b["arith"] = *base;
    Judgement j;
    judge_suites(p, p.required, c, base ? &b : nullptr, j);
    return j;
  };
  const SuiteResult trained = suite_result("accuracy", 80, 100), untrained = suite_result("accuracy", 2, 100);
  // The trained model against the untrained one: above the bound, and no regression.
  Judgement j = judged(trained, &untrained);
  CHECK(j.pass);
  REQUIRE(j.checks.size() == 2);
  CHECK(j.checks[1].kind == "max_regression");
  CHECK(j.checks[1].value == Approx(0.78));
  CHECK(j.checks[1].lo > 0);  // the interval of the difference lies above 0
  // The untrained model against the trained one: below the bound and a regression beyond the noise.
  j = judged(untrained, &trained);
  CHECK_FALSE(j.pass);
  CHECK_FALSE(j.checks[0].pass);
  CHECK_FALSE(j.checks[1].pass);
  CHECK(j.checks[1].hi < 0);
  // 76 against 80 right of 100: worse by 4 tasks, well inside the noise (the interval reaches above 0).
  j = judged(suite_result("accuracy", 76, 100), &trained);
  CHECK(j.pass);
  CHECK(j.checks[1].value < 0);
  CHECK(j.checks[1].hi > 0);
  // 55 against 80: a real regression, though still above the absolute bound.
  j = judged(suite_result("accuracy", 55, 100), &trained);
  CHECK_FALSE(j.pass);
  CHECK(j.checks[0].pass);
  CHECK_FALSE(j.checks[1].pass);
  // Without a baseline only the absolute bound applies.
  CHECK(judged(suite_result("accuracy", 55, 100), nullptr).checks.size() == 1);
  // Better than chance (0.32) beyond the noise: the whole Wilson interval above it. 45 of 100 is
  // ([0.355, 0.548] at 95%); 38 of 100 is above chance by its point only ([0.29, 0.48]) and fails.
  SuitePolicy chance;
  chance.required = {"arith"};
  chance.checks["arith"]["accuracy"].min_lower_bound = 0.32;
  for (const auto& [right, pass] : {std::pair{45, true}, std::pair{38, false}}) {
    Judgement k;
    judge_suites(chance, chance.required, {{"arith", suite_result("accuracy", right, 100)}}, nullptr, k);
    REQUIRE(k.checks.size() == 1);
    CHECK(k.checks[0].kind == "min_lower_bound");
    CHECK(k.checks[0].value == Approx(right / 100.0));
    CHECK(k.pass == pass);
    CHECK((k.checks[0].lo > 0.32) == pass);
    CHECK(k.checks[0].hi > right / 100.0);
  }
  // A suite the policy requires but the candidate lacks fails.
  Judgement missing;
  judge_suites(p, {"arith", "copy"}, {{"arith", trained}}, nullptr, missing);
  CHECK_FALSE(missing.pass);
}

TEST_CASE("suite verdicts: means are compared paired by task, a lower-is-better rate the other way",
          "[gate][suites]") {
  // pass@4 estimates per task (not a rate): the candidate a little worse on a few tasks is noise; worse on
  // most is a regression.
  SuitePolicy p;
  p.required = {"code"};
  p.checks["code"]["pass@4"] = {-1, -1, 0.0};
  const auto code = [](std::initializer_list<double> scores) {
    SuiteResult r;
    r.name = "code";
    r.type = "code";
    r.version = "v";
    SuiteMetric& m = r.metrics["pass@4"];
    m.rate = false;
    int i = 0;
    for (double s : scores) m.per_task[fmt::format("t{}", i++)] = s;
    return r;
  };
  const auto judge_code = [&](const SuiteResult& cand, const SuiteResult& base) {
    Judgement j;
    const std::map<std::string, SuiteResult> c{{"code", cand}}, b{{"code", base}};
    judge_suites(p, p.required, c, &b, j);
    return j;
  };
  const SuiteResult base = code({1, 1, 0.75, 1, 0.5, 1, 1, 0.25, 1, 1});
  CHECK(judge_code(code({1, 1, 0.5, 1, 0.5, 1, 1, 0.25, 1, 0.75}), base).pass);
  CHECK_FALSE(judge_code(code({0, 0.25, 0, 0.5, 0, 0.25, 0, 0, 0.5, 0}), base).pass);
  CHECK(judge_code(base, base).checks[0].lo == 0);  // identical: exactly [0, 0]

  // Over-refusal is better lower: more over-refusal than the baseline beyond the noise fails.
  SuitePolicy r;
  r.required = {"refusal"};
  r.checks["refusal"]["over_refusal_rate"] = {-1, 0.3, 0.0};
  const auto refusal = [](int over, int n) {
    SuiteResult s;
    s.name = "refusal";
    s.type = "refusal";
    for (int i = 0; i < n; ++i)
      s.metrics["over_refusal_rate"].per_task[fmt::format("b{}", i)] = i < over ? 1 : 0;
    return s;
  };
  const auto judge_refusal = [&](const SuiteResult& cand, const SuiteResult& base) {
    Judgement j;
    const std::map<std::string, SuiteResult> c{{"refusal", cand}}, b{{"refusal", base}};
    judge_suites(r, r.required, c, &b, j);
    return j;
  };
  CHECK(judge_refusal(refusal(2, 60), refusal(1, 60)).pass);
  const Judgement worse = judge_refusal(refusal(15, 60), refusal(1, 60));
  CHECK_FALSE(worse.pass);
  CHECK(worse.checks[0].pass);  // 0.25 <= 0.3
  CHECK_FALSE(worse.checks[1].pass);

  // A policy checking a metric the suite does not have names it.
  SuitePolicy bad = p;
  bad.checks["code"]["accuracy"] = {0.5, -1, -1};
  Judgement j;
  CHECK_THROWS_WITH(judge_suites(bad, bad.required, {{"code", base}}, nullptr, j),
                    Catch::Contains("[suite.code] checks accuracy"));
}

TEST_CASE("suite policy: required suites per objective and tier, checks per metric", "[gate][suites]") {
  forge::test::TempDir dir;
  const std::string path = dir / "gate.ini";
  std::ofstream(path) << "[suites]\ndir = s\nrequired = arith\nrequired.sft = code, refusal\n"
                         "required.release = copy\n[suite.arith]\naccuracy.min_absolute = 0.5\n"
                         "accuracy.min_lower_bound = 0.32\n[suite.code]\npass@1.max_regression = 0.05\n";
  const GatePolicy p = load_policy(path);
  CHECK(p.suites.dir == dir / "s");
  CHECK(p.suites.suites_for("lm", "") == std::vector<std::string>{"arith"});
  CHECK(p.suites.suites_for("sft", "release") ==
        std::vector<std::string>{"arith", "code", "refusal", "copy"});
  CHECK(p.suites.checks.at("arith").at("accuracy").min_absolute == 0.5);
  CHECK(p.suites.checks.at("arith").at("accuracy").min_lower_bound == 0.32);
  CHECK(p.suites.checks.at("code").at("pass@1").max_regression == 0.05);
  std::ofstream(path) << "[suite.arith]\naccuracy.minimum = 0.5\n";
  CHECK_THROWS_WITH(load_policy(path), Catch::Contains("gate.ini:2") && Catch::Contains("min_absolute"));
  std::ofstream(path) << "[suite.arith]\naccuracy.min_absolute = 1.5\n";
  CHECK_THROWS_WITH(load_policy(path), Catch::Contains("from 0 to 1"));
  // A caption score is on CIDEr-D's scale, 0 to 10.
  std::ofstream(path) << "[suite.captions]\ncider_d.min_lower_bound = 2.5\n";
  CHECK(load_policy(path).suites.checks.at("captions").at("cider_d").min_lower_bound == 2.5);
  std::ofstream(path) << "[suite.captions]\ncider_d.min_absolute = 11\n";
  CHECK_THROWS_WITH(load_policy(path), Catch::Contains("CIDEr-D") && Catch::Contains("from 0 to 10"));
}
