#include "forge/common/error.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/verdict.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <cmath>

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
