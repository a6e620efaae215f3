#include "forge/quota/policy.h"
#include "forge/common/error.h"
#include "support/paths.h"

#include <catch2/catch.hpp>

#include <string>

using namespace forge::quota;

namespace {

static std::string example_policy() {
  return forge::test::source_path("configs/quota.example.ini");
}

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
  const Policy p = load_policy(example_policy());
  REQUIRE(p.teams.size() == 2);
  REQUIRE(p.tiers.size() == 4);
  CHECK(p.cluster == "forge");
  CHECK(p.default_wall_s == 3600);
  CHECK(p.tier("pretrain")->max_wall_s == 48 * 3600);
  CHECK(p.tier("explore")->preemptible);
  CHECK(p.tier("explore")->charge == 0.5);
  CHECK(p.team("team-a")->has_member("root", {}));
  CHECK(p.team("team-b")->has_member("someone", {"forge-b"}));
  CHECK_FALSE(p.team("team-b")->has_member("root", {"root"}));
  CHECK_FALSE(p.team("team-b")->allows_tier("pretrain"));
  CHECK(p.prices.per_gpu_hour("train", "") == 2.5);
  CHECK(p.prices.per_gpu_hour("train", "h100") == 4.0);
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
  CHECK(p.team("t")->members.groups == std::vector<std::string>{"ml"});
  CHECK(p.team("t")->members.users == std::vector<std::string>{"alice"});
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

TEST_CASE("the example policy has admins, approval rules, approvers, team roots and pools") {
  const Policy p = load_policy(example_policy());
  CHECK(p.admins.users == std::vector<std::string>{"root", "dave"});
  CHECK(p.is_admin({"dave", {}}));
  CHECK_FALSE(p.is_admin({"carol", {"forge-a"}}));
  CHECK(p.approval.gpus == 16);
  CHECK(p.approval.gpu_hours == 300);
  CHECK(p.approval.tiers.empty());
  CHECK(p.approval.ttl_s == 7 * 86400);
  CHECK(p.approval.checker == "/usr/local/bin/forge-quota");
  const Team& a = *p.team("team-a");
  CHECK(a.approvers.users == std::vector<std::string>{"carol"});
  CHECK(a.has_approver("carol", {}));
  CHECK_FALSE(a.has_approver("alice", {"forge-a"}));
  CHECK(a.root == "/var/lib/forge-teams/team-a");
  CHECK(a.group == "forge-a");
  CHECK(p.team("team-b")->root == "/var/lib/forge-teams/team-b");
  REQUIRE(p.pools.size() == 3);
  CHECK(p.pools[0].name == "train");
  CHECK(p.pool_for_tier("explore")->partition == "train");
  CHECK(p.pool_by_partition("eval")->name == "eval");
  CHECK(p.pool_by_partition("eval")->tiers == std::vector<std::string>{"eval"});
  CHECK(p.pool_by_partition("gpu") == nullptr);
  // Visibility: members and approvers see their teams, admins every team.
  CHECK(p.sees_team({"alice", {}}, a));
  CHECK_FALSE(p.sees_team({"bob", {}}, a));
  CHECK(p.sees_team({"carol", {}}, *p.team("team-b")));
  CHECK(p.sees_team({"dave", {}}, *p.team("team-b")));
}

TEST_CASE("every user and group the policy names is kept with its line for check-policy") {
  const Policy p = load_policy(example_policy());
  const auto named = [&](const std::string& name, const std::string& role, const std::string& team) {
    for (const auto& n : p.names)
      if (n.name == name && n.role == role && n.team == team) return n.line;
    return 0;
  };
  CHECK(named("dave", "admin", "") == 20);
  CHECK(named("carol", "approver", "team-a") == 84);
  CHECK(named("carol", "approver", "team-b") == 94);
  CHECK(named("forge-a", "group", "team-a") == 86);
  CHECK(named("forge-b", "member", "team-b") > 0);
  for (const auto& n : p.names)
    if (n.name == "forge-a" || n.name == "forge-b") CHECK(n.group);
}

TEST_CASE("a policy without the new keys behaves as before: no approvals, pools or team roots") {
  const Policy p = parse_policy(kMinimal, "p.ini");
  CHECK(p.approval.gpus == 0);
  CHECK(p.approval.gpu_hours == 0);
  CHECK(p.approval.tiers.empty());
  CHECK(p.pools.empty());
  CHECK(p.admins.empty());
  CHECK(p.team("t")->root.empty());
  CHECK(p.team("t")->approvers.empty());
  CHECK_FALSE(p.is_admin({"root", {"root"}}));
  CHECK(p.pool_for_tier("big") == nullptr);
}

TEST_CASE("approval rules: empty or 0 turns a rule off; tiers and ttl are read") {
  const Policy off =
      parse_policy(std::string(kMinimal) + "[approval]\ngpus =\ngpu_hours = 0\ntiers =\n", "p.ini");
  CHECK(off.approval.gpus == 0);
  CHECK(off.approval.gpu_hours == 0);
  const Policy on = parse_policy(
      std::string(kMinimal) + "[approval]\ngpus = 8\ngpu_hours = 12.5\ntiers = big\nttl = 12:00:00\n",
      "p.ini");
  CHECK(on.approval.gpus == 8);
  CHECK(on.approval.gpu_hours == 12.5);
  CHECK(on.approval.tiers == std::vector<std::string>{"big"});
  CHECK(on.approval.ttl_s == 12 * 3600);
}

TEST_CASE("errors in the approval, pool, admin and team-directory keys name file:line") {
  const std::string m = kMinimal;  // 19 lines; an appended section header is line 20
  CHECK_THAT(
      error_of(m + "[approval]\ngpu = 4\n"),
      Catch::Contains("p.ini:21: unknown key 'gpu' in [approval]; allowed: gpus, gpu_hours, tiers, ttl"));
  CHECK_THAT(error_of(m + "[approval]\ngpus = -1\n"),
             Catch::Contains("p.ini:21: gpus = -1: expected a whole number from 0 to 1048576"));
  CHECK_THAT(error_of(m + "[approval]\ngpu_hours = -5\n"),
             Catch::Contains("p.ini:21: gpu_hours = -5: expected a number from 0"));
  CHECK_THAT(
      error_of(m + "[approval]\ntiers = big, medium\n"),
      Catch::Contains("p.ini:21: tiers = big, medium: unknown tier 'medium'; defined tiers: big, small"));
  CHECK_THAT(error_of(m + "[approval]\nttl = 7 days\n"),
             Catch::Contains("p.ini:21: ttl = 7 days: expected a duration"));
  CHECK_THAT(error_of(m + "[approval]\nttl = 0\n"),
             Catch::Contains("p.ini:21: ttl = 0: expected a duration"));
  CHECK_THAT(error_of(m + "[approval]\nchecker = forge-quota\n"),
             Catch::Contains("p.ini:21: checker = forge-quota: must be an absolute path"));
  CHECK_THAT(error_of(m + "[pool.a]\npartition = train\ntiers = medium\n"),
             Catch::Contains("p.ini:22: tiers = medium: unknown tier 'medium'"));
  CHECK_THAT(error_of(m + "[pool.a]\npartition = train\n[pool.b]\npartition = train\n"),
             Catch::Contains("p.ini:23: partition = train: pool 'a' already uses that partition"));
  CHECK_THAT(error_of(m + "[pool.a]\ntiers = big\n"),
             Catch::Contains("p.ini:20: [pool.a] needs 'partition = ...'"));
  CHECK_THAT(error_of(m + "[pool.a]\npartition = train\nqos = x\n"),
             Catch::Contains("p.ini:22: unknown key 'qos' in [pool.a]"));
  CHECK_THAT(error_of(m + "[pool.a b]\npartition = x\n"),
             Catch::Contains("p.ini:20: [pool.a b]: a pool name"));
  CHECK_THAT(error_of(with("cluster = c", "cluster = c\nadmins = root, bad name")),
             Catch::Contains("p.ini:3: admins = root, bad name: 'bad name' is not a user or @group name"));
  CHECK_THAT(error_of(with("tiers = big, small", "tiers = big, small\napprovers = @")),
             Catch::Contains("p.ini:20: approvers = @: '@' is not a user or @group name"));
  CHECK_THAT(error_of(with("tiers = big, small", "tiers = big, small\nroot = teams/t")),
             Catch::Contains("p.ini:20: root = teams/t: must be an absolute path"));
  CHECK_THAT(error_of(with("tiers = big, small", "tiers = big, small\nroot = /")),
             Catch::Contains("p.ini:20: root = /: must be a directory below /"));
  CHECK_THAT(error_of(with("tiers = big, small", "tiers = big, small\ngroup = @ml")),
             Catch::Contains("p.ini:20: group = @ml: must be 1-64 letters"));
  CHECK_THAT(error_of(with("tiers = big, small", "tiers = big, small\nrooot = /x")),
             Catch::Contains("p.ini:20: unknown key 'rooot' in [team.t]"));
  // Nested team roots would let one team's jobs write into the other's directory.
  const std::string two = with("tiers = big, small", "tiers = big, small\nroot = /srv/teams/t/") +
                          "[team.u]\nmembers = bob\naccount = acct-u\nbudget_gpu_hours = 1\nmax_gpus = 1\n"
                          "tiers = big\nroot = /srv/teams/t/u\n";
  CHECK_THAT(error_of(two),
             Catch::Contains("p.ini:27: root = /srv/teams/t/u: overlaps team 't''s root /srv/teams/t"));
  // ... but a sibling whose name merely starts the same is fine.
  std::string sibling = two;
  sibling.replace(sibling.find("/srv/teams/t/u"), 14, "/srv/teams/tu");
  const Policy p = parse_policy(sibling, "p.ini");
  CHECK(p.team("t")->root == "/srv/teams/t");  // normalised: no trailing '/'
  CHECK(p.team("u")->root == "/srv/teams/tu");
}

TEST_CASE("path_within compares whole components") {
  CHECK(path_within("/srv/t/runs/x", "/srv/t"));
  CHECK(path_within("/srv/t", "/srv/t"));
  CHECK_FALSE(path_within("/srv/tu", "/srv/t"));
  CHECK_FALSE(path_within("/srv", "/srv/t"));
  CHECK_FALSE(path_within("/other/t", "/srv/t"));
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
