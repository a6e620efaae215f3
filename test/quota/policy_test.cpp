#include "forge/quota/policy.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <string>

using namespace forge::quota;

namespace {

const std::string kExample = std::string(FORGE_SOURCE_DIR) + "/configs/quota.example.ini";

const char* kMinimal = R"([policy]
cluster = c
[tier.big]
qos = big
priority = 100
max_wall = 2-00:00:00
[tier.small]
qos = small
priority = 10
preemptible = true
max_wall = 60
charge = 0.5
grace_s = 30
[team.t]
members = alice, @ml
account = acct-t
budget_gpu_hours = 100
max_gpus = 16
tiers = big, small
)";

// Parses kMinimal with `line` appended to (or replacing a key in) it and returns the error message.
std::string error_of(const std::string& text) {
  try {
    parse_policy(text, "p.ini");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    return e.what();
  }
  return "";
}

std::string with(const std::string& from, const std::string& to) {
  std::string t = kMinimal;
  const auto pos = t.find(from);
  REQUIRE(pos != std::string::npos);
  return t.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("the example policy loads with its teams, tiers, prices and topology") {
  const Policy p = load_policy(kExample);
  REQUIRE(p.teams.size() == 2);
  REQUIRE(p.tiers.size() == 3);
  CHECK(p.cluster == "forge");
  CHECK(p.default_wall_s == 3600);
  CHECK(p.tier("pretrain")->max_wall_s == 48 * 3600);
  CHECK(p.tier("explore")->preemptible);
  CHECK(p.tier("explore")->charge == 0.5);
  CHECK(p.team("team-a")->has_member("root", {}));
  CHECK(p.team("team-b")->has_member("someone", {"forge-b"}));
  CHECK_FALSE(p.team("team-b")->has_member("root", {"root"}));
  CHECK_FALSE(p.team("team-b")->allows_tier("pretrain"));
  CHECK(p.prices.per_gpu_hour("gpu", "") == 2.5);
  CHECK(p.prices.per_gpu_hour("gpu", "h100") == 4.0);
  CHECK(p.prices.per_gpu_hour("other", "a100") == 2.0);
  CHECK(p.topology.switches_for(8) == 1);
  CHECK(p.topology.switches_for(32) == 2);
  CHECK(p.topology.switches_for(64) == 0);
  CHECK(p.tier_by_qos("finetune")->name == "finetune");
  CHECK(p.team_by_account("team-b")->name == "team-b");
}

TEST_CASE("a minimal policy gets defaults") {
  const Policy p = parse_policy(kMinimal, "p.ini");
  CHECK(p.period == Period::kMonth);
  CHECK(p.snapshot_path == "/var/lib/forge-quota/usage.json");
  CHECK(p.topology.gpus_per_node == 8);
  CHECK(p.default_wall_s == 0);
  CHECK(p.tier("small")->max_wall_s == 3600);  // a bare number is minutes, as in Slurm
  CHECK(p.team("t")->groups == std::vector<std::string>{"ml"});
}

TEST_CASE("policy errors name file:line, the key and what is allowed") {
  CHECK_THAT(error_of(with("priority = 100", "priority = 1e2")),
             Catch::Contains("p.ini:5: priority = 1e2: expected a whole number"));
  CHECK_THAT(error_of(with("priority = 100", "prio = 100")),
             Catch::Contains("p.ini:5: unknown key 'prio' in [tier.big]; allowed: qos, priority"));
  CHECK_THAT(
      error_of(with("tiers = big, small", "tiers = big, medium")),
      Catch::Contains("p.ini:19: tiers = big, medium: unknown tier 'medium'; defined tiers: big, small"));
  CHECK_THAT(error_of(with("max_wall = 60", "max_wall = 1:xx")),
             Catch::Contains("p.ini:11: max_wall = 1:xx"));
  CHECK_THAT(error_of(with("qos = small", "qos = big")), Catch::Contains("tier 'big' already uses that QOS"));
  CHECK_THAT(error_of(with("charge = 0.5", "charge = -1")), Catch::Contains("p.ini:12: charge = -1"));
  CHECK_THAT(error_of(with("preemptible = true", "preemptible = maybe")),
             Catch::Contains("expected true or false"));
  CHECK_THAT(error_of(with("max_gpus = 16", "max_gpus = 16\nmax_gpus = 8")),
             Catch::Contains("p.ini:19: team.t.max_gpus is already set on line 18"));
  CHECK_THAT(error_of(with("[policy]\ncluster = c", "[policy]")),
             Catch::Contains("[policy] needs 'cluster = ...'"));
  CHECK_THAT(error_of(with("[team.t]", "[teams.t]")), Catch::Contains("p.ini:14: unknown section [teams.t]"));
  CHECK_THAT(error_of(with("members = alice, @ml", "members = al ice")),
             Catch::Contains("'al ice' is not a user"));
  CHECK_THAT(error_of(with("account = acct-t", "account = $(rm -rf)")),
             Catch::Contains("p.ini:16: account = $(rm -rf): must be 1-64 letters"));
  CHECK_THAT(error_of(std::string(kMinimal) + "[topology]\ngpus_per_node = 8\nmax_switches = 32:2, 16:1\n"),
             Catch::Contains("increasing GPU count"));
  CHECK_THAT(error_of(std::string(kMinimal) + "key = value\n[x"),
             Catch::Contains("malformed section header"));
  CHECK_THAT(error_of("[policy]\ncluster = c\n[tier.a]\nqos=a\nmax_wall=1\n"),
             Catch::Contains("no [team.<name>]"));
}

TEST_CASE("a missing policy file is a usage error naming it") {
  try {
    load_policy("/nonexistent/policy.ini");
    FAIL("no error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent/policy.ini"));
  }
}

TEST_CASE("wall times read and print like Slurm's") {
  CHECK(parse_wall_time("48:00:00") == 48 * 3600);
  CHECK(parse_wall_time("2-00:00:00") == 48 * 3600);
  CHECK(parse_wall_time("1-12") == 36 * 3600);
  CHECK(parse_wall_time("90") == 90 * 60);
  CHECK(parse_wall_time("2:30") == 150);
  CHECK_FALSE(parse_wall_time(""));
  CHECK_FALSE(parse_wall_time("1:2:3:4"));
  CHECK_FALSE(parse_wall_time("-5"));
  CHECK_FALSE(parse_wall_time("1::2"));
  CHECK(format_wall_time(48 * 3600) == "2-00:00:00");
  CHECK(format_wall_time(4 * 3600 + 61) == "04:01:01");
}

TEST_CASE("budget periods are calendar months, quarters and years in UTC") {
  const int64_t t = 1771000000;  // 2026-02-13T16:26:40Z
  CHECK(period_bounds(Period::kMonth, t) == std::pair<int64_t, int64_t>{1769904000, 1772323200});
  CHECK(period_bounds(Period::kQuarter, t).first == 1767225600);   // 2026-01-01
  CHECK(period_bounds(Period::kQuarter, t).second == 1775001600);  // 2026-04-01
  CHECK(period_bounds(Period::kYear, t).second == 1798761600);     // 2027-01-01
  const int64_t dec = 1796083200;                                  // 2026-12-01
  CHECK(period_bounds(Period::kMonth, dec).second == 1798761600);  // rolls into the next year
}
