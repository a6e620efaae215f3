// The gate's figures of the post-training objectives: preference accuracy and reward margin (DPO) and the
// KL to a teacher (distillation): their statistics, the decision rules, the policy sections, and the
// per-token KL.
#include "forge/common/error.h"
#include "forge/eval_gate/evaluate.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/verdict.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace forge::gate;

namespace {

// A domain of preference pairs with these reward margins (chosen replies of 10 tokens, 40 bytes).
DomainStats pairs(const std::vector<double>& margins) {
  DomainStats s;
  for (double m : margins) {
    s.add_sequence(2.0, 10, 40);
    s.margin.add(m);
    s.correct.add(m > 0 ? 1 : 0);
  }
  return s;
}

// A domain whose sequences (100 tokens, 400 bytes each) have these mean KLs to the teacher.
DomainStats kl_domain(const std::vector<double>& seq_kls) {
  DomainStats s;
  for (double k : seq_kls) {
    s.add_sequence(3.0, 100, 400);
    s.kl_sum += k * 100;
    s.kl_seq.add(k);
  }
  return s;
}

const Check* find(const Judgement& j, const std::string& metric, const std::string& kind) {
  for (const auto& c : j.checks)
    if (c.metric == metric && c.kind == kind) return &c;
  return nullptr;
}

// The sample standard deviation of `xs` over sqrt(n), computed directly.
double stderr_of(const std::vector<double>& xs) {
  double mean = 0, ss = 0;
  for (double x : xs) mean += x / double(xs.size());
  for (double x : xs) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / double(xs.size() - 1) / double(xs.size()));
}

}  // namespace

TEST_CASE("pair statistics: accuracy and reward margin with standard errors, merged and packed") {
  const std::vector<double> margins{1.0, 0.5, -0.5, 2.0};
  const DomainStats s = pairs(margins);
  CHECK(s.correct.mean() == Approx(0.75));
  CHECK(s.correct.se() == Approx(stderr_of({1, 1, 0, 1})));
  CHECK(s.margin.mean() == Approx(0.75));
  CHECK(s.margin.se() == Approx(stderr_of(margins)));
  CHECK(std::isnan(s.kl()));  // not measured

  DomainStats merged = pairs({1.0, 0.5});
  merged.merge(pairs({-0.5, 2.0}));
  CHECK(merged.margin.se() == Approx(s.margin.se()));
  const std::vector<std::string> names{"pref"};
  const DomainStats back = unpack(pack({{"pref", s}}, names), names).at("pref");
  CHECK(back.correct.mean() == Approx(0.75));
  CHECK(back.margin.se() == Approx(s.margin.se()));

  const forge::Json j = s.to_json();
  CHECK(j.at("pairs") == 4);
  CHECK(j.at("accuracy").get<double>() == Approx(0.75));
  CHECK(j.at("reward_margin_se").get<double>() == Approx(s.margin.se()));
  CHECK_FALSE(j.contains("kl"));
  CHECK(DomainStats::from_json(j).margin.mean() == Approx(0.75));
  CHECK_FALSE(pairs({}).to_json().contains("accuracy"));
}

TEST_CASE("KL statistics: mean per token, standard error from the sequences") {
  const std::vector<double> kls{0.1, 0.2, 0.3};
  const DomainStats s = kl_domain(kls);
  CHECK(s.kl() == Approx(0.2));
  CHECK(s.kl_stderr() == Approx(stderr_of(kls)));
  const forge::Json j = s.to_json();
  CHECK(j.at("kl").get<double>() == Approx(0.2));
  CHECK(DomainStats::from_json(j).kl_stderr() == Approx(s.kl_stderr()));
  const std::vector<std::string> names{"code"};
  CHECK(unpack(pack({{"code", s}}, names), names).at("code").kl() == Approx(0.2));
  // A model equal to its teacher: 0 with no spread.
  CHECK(kl_domain({0, 0, 0}).kl() == 0);
  CHECK_FALSE(DomainStats{}.to_json().contains("kl"));
}

TEST_CASE("DPO decision: chance and the reference's margin stand in for a baseline below them or none") {
  GatePolicy p;
  p.accuracy.min_stderr_improvement = 2;
  p.reward_margin.min_stderr_improvement = 2;
  // 7 of 8 pairs ranked right: accuracy 0.875 with se 0.125; chance's se on 8 pairs is 0.177, so
  // 0.875 > 0.5 + 2 x 0.177.
  const DomainResults candidate{{"pref", pairs({1.0, 0.8, 1.2, 0.9, 1.1, -0.2, 1.0, 0.7})}};
  // The parent as baseline is the reference itself: every margin exactly 0, no pair ranked right.
  const DomainResults reference{{"pref", pairs(std::vector<double>(8, 0.0))}};

  for (const DomainResults* baseline : {&reference, static_cast<const DomainResults*>(nullptr)}) {
    const Judgement j = judge(p, candidate, baseline);
    CHECK(j.pass);
    const Check* acc = find(j, "accuracy", "min_stderr_improvement");
    REQUIRE(acc);
    CHECK(acc->higher_is_better);
    CHECK(acc->value == Approx(0.875));
    CHECK(acc->baseline == 0.5);
    CHECK(acc->limit == Approx(0.5 + 2 * 0.5 / std::sqrt(8.0)));
    const Check* margin = find(j, "reward_margin", "min_stderr_improvement");
    REQUIRE(margin);
    CHECK(margin->baseline == 0);
    CHECK(margin->limit == Approx(2 * candidate.at("pref").margin.se()));
  }

  // The reference judged as a candidate has improved on nothing: accuracy 0, margin 0 with no spread.
  const Judgement same = judge(p, reference, &reference);
  CHECK_FALSE(same.pass);
  CHECK_FALSE(find(same, "accuracy", "min_stderr_improvement")->pass);
  CHECK_FALSE(find(same, "reward_margin", "min_stderr_improvement")->pass);

  // Every one of 3 pairs right has standard error 0, but chance's on 3 pairs is 0.29: no confidence.
  const Judgement few = judge(p, {{"pref", pairs({1.0, 1.0, 1.0})}}, &reference);
  CHECK(find(few, "accuracy", "min_stderr_improvement")->value == 1.0);
  CHECK(find(few, "accuracy", "min_stderr_improvement")->limit == Approx(0.5 + 2 * 0.5 / std::sqrt(3.0)));
  CHECK_FALSE(few.pass);

  // Near chance: 5 of 8 is not above 0.5 with confidence.
  const DomainResults weak{{"pref", pairs({1.0, 1.0, 1.0, 1.0, 1.0, -0.1, -0.1, -0.1})}};
  CHECK_FALSE(find(judge(p, weak, &reference), "accuracy", "min_stderr_improvement")->pass);
  CHECK(find(judge(p, weak, &reference), "reward_margin", "min_stderr_improvement")->pass);
}

TEST_CASE("DPO decision against a better baseline: its own figures and standard errors count") {
  std::vector<double> strong(20, 1.5);
  strong[0] = -1.0;  // 19 of 20
  const DomainResults baseline{{"pref", pairs(strong)}};
  const DomainResults candidate{{"pref", pairs({1.0, 0.8, 1.2, 0.9, 1.1, -0.2, 1.0, 0.7})}};
  GatePolicy improve;
  improve.accuracy.min_stderr_improvement = 2;
  const Judgement judgement = judge(improve, candidate, &baseline);  // find() points into it
  const Check* c = find(judgement, "accuracy", "min_stderr_improvement");
  REQUIRE(c);
  CHECK(c->baseline == Approx(0.95));
  CHECK_FALSE(c->pass);

  // No worse than the baseline by more than 2 combined standard errors: 0.875 >= 0.95 - 2 x 0.135.
  GatePolicy hold;
  hold.accuracy.max_stderr_regression = 2;
  hold.accuracy.min_absolute = 0.8;
  const Judgement j = judge(hold, candidate, &baseline);
  CHECK(j.pass);
  const Check* r = find(j, "accuracy", "max_stderr_regression");
  REQUIRE(r);
  CHECK(r->limit ==
        Approx(0.95 - 2 * std::hypot(candidate.at("pref").correct.se(), baseline.at("pref").correct.se())));
  CHECK(find(j, "accuracy", "min_absolute")->limit == 0.8);
}

TEST_CASE("distillation decision: the KL to the teacher must fall below the baseline's with confidence") {
  GatePolicy p;
  p.kl.min_stderr_improvement = 2;
  p.kl.max_absolute = 1.0;
  const DomainResults parent{{"code", kl_domain({0.50, 0.55, 0.45, 0.52})}};
  const DomainResults distilled{{"code", kl_domain({0.10, 0.12, 0.11, 0.09})}};

  const Judgement ok = judge(p, distilled, &parent);
  CHECK(ok.pass);
  const Check* c = find(ok, "kl", "min_stderr_improvement");
  REQUIRE(c);
  CHECK_FALSE(c->higher_is_better);
  CHECK(c->value == Approx(0.105));
  CHECK(c->baseline == Approx(0.505));
  CHECK(c->limit ==
        Approx(0.505 - 2 * std::hypot(distilled.at("code").kl_stderr(), parent.at("code").kl_stderr())));

  CHECK_FALSE(judge(p, parent, &distilled).pass);
  CHECK_FALSE(judge(p, parent, &parent).pass);                      // equal is not better
  CHECK(judge(p, {{"code", kl_domain({0, 0, 0})}}, &parent).pass);  // the teacher itself

  // No baseline: no floor for the KL, only its absolute bound.
  const Judgement alone = judge(p, distilled, nullptr);
  CHECK(alone.pass);
  CHECK(find(alone, "kl", "min_stderr_improvement") == nullptr);
  CHECK(find(alone, "kl", "max_absolute")->pass);

  // A candidate whose KL was not measured (not a distillation run) never passes a KL check.
  DomainStats lm;
  lm.add_sequence(3.0, 100, 400);
  CHECK_FALSE(judge(p, {{"code", lm}}, nullptr).pass);
}

TEST_CASE("policy sections kl, accuracy and reward_margin; keys of the other direction are refused") {
  forge::test::TempDir dir;
  const GatePolicy p =
      load_policy(dir.write("dpo.ini",
                            "[accuracy]\nmin_stderr_improvement = 2\nmin_absolute = 0.6\n"
                            "[reward_margin]\nmax_stderr_regression = 1.5\ndomains = pref\n"
                            "[kl]\nmin_stderr_improvement = 3\nmax_relative_regression = 0.1\n"));
  CHECK(p.accuracy.min_stderr_improvement == 2);
  CHECK(p.accuracy.min_absolute == Approx(0.6));
  CHECK(p.accuracy.max_absolute < 0);
  CHECK(p.reward_margin.max_stderr_regression == Approx(1.5));
  CHECK(p.reward_margin.domains == std::vector<std::string>{"pref"});
  CHECK(p.kl.min_stderr_improvement == 3);
  CHECK(p.kl.max_relative_regression == Approx(0.1));
  CHECK(p.loss.min_stderr_improvement < 0);
  CHECK(higher_is_better("accuracy"));
  CHECK_FALSE(higher_is_better("kl"));

  for (const char* text : {"[accuracy]\nmax_absolute = 0.9\n",
                           "[reward_margin]\nmax_relative_regression = 0\n", "[kl]\nmin_absolute = 0\n"}) {
    const auto bad = dir.write("bad.ini", text);
    try {
      load_policy(bad);
      FAIL("expected an error for " << text);
    } catch (const forge::Error& e) {
      CHECK(e.code() == forge::ExitCode::kUsage);
    }
  }
  const auto negative = dir.write("neg.ini", "[kl]\nmax_relative_regression = -0.5\n");
  try {
    load_policy(negative);
    FAIL("expected an error");
  } catch (const forge::Error& e) {
    CHECK(std::string(e.what()) ==
          negative + ":2: kl.max_relative_regression = -0.5: must be >= 0, or -1 to turn the check off");
  }
}

TEST_CASE("per-token KL to the teacher and cross-entropy from logits") {
  const std::vector<float> model{0.0f, std::log(3.0f)}, teacher{0.0f, 0.0f};
  // p = (1/2, 1/2), q = (1/4, 3/4).
  const TokenScores s = score_token(model, teacher, 1);
  CHECK(s.kl == Approx(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)));
  CHECK(s.loss == Approx(-std::log(0.75)));
  const std::vector<float> logits{1.5f, -2.0f, 0.25f, 3.0f, -0.5f};
  CHECK(score_token(logits, logits, 3).kl == 0.0);  // exactly: the same model
  std::vector<float> shifted = logits;
  for (float& x : shifted) x += 7.0f;  // the same distribution
  CHECK(std::abs(score_token(logits, shifted, 0).kl) < 1e-12);
  CHECK(score_token(logits, std::vector<float>(5, 0.0f), 0).kl > 0);  // a uniform teacher
}
