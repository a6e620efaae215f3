#include "forge/quota/admission.h"
#include "support/paths.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "../support/temp_dir.h"

using forge::Layout;
using forge::ModelDims;
using namespace forge::quota;

namespace {

const Policy& policy() {
  static const Policy p = load_policy(forge::test::source_path("configs/quota.example.ini"));
  return p;
}

UsageSnapshot snapshot(double used_a, double reserved_a) {
  UsageSnapshot s;
  s.teams["team-a"] = {used_a, reserved_a, 0};
  return s;
}

Decision submit(const Choices& c, const UsageSnapshot& s, const std::string& user = "root") {
  return admit_submission(policy(), c, {user, {}}, UsageView{&s, "", SnapshotFailure::kClosed});
}

}  // namespace

TEST_CASE("topology rules: TP inside a node, whole nodes, aligned pipeline stages") {
  const Topology& t = policy().topology;
  CHECK_FALSE(topology_violation({.tp = 8, .dp = 1, .pp = 2}, t));
  CHECK_FALSE(topology_violation({.tp = 2, .dp = 2, .pp = 2}, t));
  CHECK_FALSE(topology_violation({.tp = 4, .dp = 2, .pp = 4}, t));
  CHECK_THAT(*topology_violation({.tp = 16}, t), Catch::Contains("TP=16 does not fit inside one node of 8"));
  CHECK_THAT(*topology_violation({.tp = 3}, t), Catch::Contains("TP=3"));
  CHECK_THAT(*topology_violation({.tp = 2, .dp = 5}, t), Catch::Contains("multiple of 8"));
  CHECK_THAT(*topology_violation({.tp = 1, .dp = 3, .pp = 8}, t),
             Catch::Contains("pipeline stage of 3 GPUs"));
  CHECK(nodes_for({.tp = 2, .dp = 2, .pp = 2}, t) == 1);
  CHECK(nodes_for({.tp = 8, .dp = 2, .pp = 2}, t) == 4);
}

TEST_CASE("an allowed submission carries team, tier and layout") {
  const Decision d = submit({"team-a", "pretrain", "tp2,pp2,dp2", {}}, snapshot(0, 0));
  REQUIRE(d.allowed);
  CHECK(d.team->name == "team-a");
  CHECK(d.tier->qos == "pretrain");
  CHECK(d.layout == Layout{.tp = 2, .dp = 2, .pp = 2});
  CHECK(d.warnings.empty());
}

TEST_CASE("each rejection says what is wrong and what to change") {
  const UsageSnapshot s = snapshot(0, 0);
  CHECK_THAT(submit({"team-z", "pretrain", "tp1,pp1,dp1", {}}, s).message,
             Catch::Contains("unknown team 'team-z'") && Catch::Contains("team-a, team-b"));
  CHECK_THAT(submit({"team-b", "finetune", "tp1,pp1,dp1", {}}, s).message,
             Catch::Contains("user 'root' is not a member of team 'team-b'") && Catch::Contains("(team-a)"));
  CHECK(submit({"team-b", "finetune", "tp1,pp1,dp1", {}}, s, "bob").allowed);
  CHECK_THAT(submit({"team-b", "pretrain", "tp1,pp1,dp1", {}}, s, "bob").message,
             Catch::Contains("team 'team-b' may not use tier 'pretrain'; its tiers are: finetune, explore"));
  CHECK_THAT(submit({"team-a", "bogus", "tp1,pp1,dp1", {}}, s).message,
             Catch::Contains("unknown tier 'bogus'"));
  CHECK_THAT(submit({"team-a", "finetune", "tp1,pp1,dp1", {}}, s).message,
             Catch::Contains("team 'team-a' may not use tier 'finetune'; its tiers are: pretrain, explore"));
  CHECK_THAT(submit({"team-a", "pretrain", "tp16,pp1,dp1", {}}, s).message,
             Catch::Contains("--train-layout=tp16,pp1,dp1: TP=16"));
  CHECK_THAT(submit({"team-a", "pretrain", "tp8,pp1,dp8", {}}, s).message,
             Catch::Contains("needs 64 GPUs but team 'team-a' may hold at most 32"));
  CHECK_THAT(submit({"team-a", "", "tp1,pp1,dp1", {}}, s).message, Catch::Contains("missing --train-tier"));
  CHECK_THAT(
      submit({"team-a", "pretrain", "tp2,pp1,dp2", SpecLayout{.layout = {.tp = 2, .dp = 4}, .run_dir = {}}},
             s)
          .message,
      Catch::Contains("disagrees with the job spec's [parallel] (tp2,pp1,dp4)"));
}

TEST_CASE("a job spec's model must suit the layout: the trainer's check, made in sbatch") {
  const UsageSnapshot s = snapshot(0, 0);
  const auto spec = [](Layout l, ModelDims m) { return SpecLayout{l, m, {}}; };
  const ModelDims model{.layers = 6, .heads = 6, .vocab = 8192};
  CHECK(submit({"team-a", "pretrain", "tp2,pp2,dp2", spec({.tp = 2, .dp = 2, .pp = 2}, model)}, s).allowed);
  CHECK_THAT(submit({"team-a", "pretrain", "tp4,pp1,dp2", spec({.tp = 4, .dp = 2}, model)}, s).message,
             Catch::Equals("--train-layout=tp4,pp1,dp2 does not suit the job spec: parallel.tp: must divide "
                           "model.heads = 6 (each rank holds whole heads)"));
  CHECK_THAT(submit({"team-a", "pretrain", "tp1,pp8,dp1", spec({.pp = 8}, model)}, s).message,
             Catch::Contains("parallel.pp: 8 stages need at least one block each but model.layers is 6"));
  CHECK(submit({"team-a", "pretrain", "tp1,pp1,dp2,cp2", spec({.cp = 2, .dp = 2}, model)}, s).allowed);
  CHECK_THAT(
      submit({"team-a", "pretrain", "tp1,pp1,dp1,cp4",
              spec({.cp = 4}, {.layers = 6, .heads = 6, .vocab = 8192, .seq_len = 100})},
             s)
          .message,
      Catch::Contains("parallel.cp: must cut model.seq_len = 100 into 2 x 4 equal chunks (cp = 2 would)"));
  // Without a spec there is no model to check against.
  CHECK(submit({"team-a", "pretrain", "tp4,pp1,dp2", {}}, s).allowed);
}

TEST_CASE("read_spec_layout: [parallel] and [model] in one read, with the trainer's defaults") {
  forge::test::TempDir dir;
  auto spec = read_spec_layout(
      dir.write("a.ini", "[run]\nname = x\n[model]\nheads = 12\n[parallel]\ntp = 4\ndp = 2\ncp = 2\n"),
      nullptr);
  REQUIRE(spec);
  CHECK(spec->layout == Layout{.tp = 4, .cp = 2, .dp = 2});
  CHECK((spec->model.layers == 6 && spec->model.heads == 12 && spec->model.vocab == 8192));
  spec = read_spec_layout(dir.write("b.ini", "[model]\nlayers = 2\nvocab = 50257\n"), nullptr);
  REQUIRE(spec);
  CHECK(spec->layout == Layout{});
  CHECK((spec->model.layers == 2 && spec->model.heads == 6 && spec->model.vocab == 50257));

  std::string why;
  CHECK_FALSE(read_spec_layout(dir.write("c.ini", "[parallel]\ntp = 2\npp = 0\n"), &why));
  CHECK(why == dir / "c.ini" + ":3: parallel.pp = 0: expected a whole number from 1 to 65536");
  CHECK_FALSE(read_spec_layout(dir.write("d.ini", "[model]\nheads = six\n"), &why));
  CHECK(why == dir / "d.ini" + ":2: model.heads = six: expected a whole number from 1 to 2147483647");
  CHECK_FALSE(read_spec_layout(dir.write("e.ini", "[parallel]\ntp = 2\n[parallel]\n"), &why));
  CHECK_THAT(why, Catch::Contains("e.ini:3: section [parallel] already appears on line 1"));
  CHECK_FALSE(read_spec_layout(dir / "missing.ini", &why));
  CHECK_THAT(why, Catch::StartsWith("cannot read '" + dir / "missing.ini" + "'"));
}

TEST_CASE("hostile option values are rejected without echoing raw bytes") {
  const UsageSnapshot s = snapshot(0, 0);
  for (const std::string& bad :
       {std::string(4096, 'A'), std::string("%n%s%n%s"), std::string("a;rm -rf /`id`$(id)"),
        std::string("\xff\xfe\x80team"), std::string("team\nnewline")}) {
    for (const Choices& c :
         {Choices{bad, "pretrain", "tp1,pp1,dp1", {}}, Choices{"team-a", bad, "tp1,pp1,dp1", {}},
          Choices{"team-a", "pretrain", bad, {}}}) {
      const Decision d = submit(c, s);
      CHECK_FALSE(d.allowed);
      CHECK(d.message.size() < 400);
      CHECK(d.message.find('\n') == std::string::npos);
      CHECK(d.message.find('\xff') == std::string::npos);
    }
  }
}

TEST_CASE("quota: used + reserved + GPUs x max wall x charge must fit the budget") {
  // team-a: budget 20000. pretrain 8 GPUs x 48 h = 384.
  CHECK(submit({"team-a", "pretrain", "tp8,pp1,dp1", {}}, snapshot(19000, 616)).allowed);  // exactly 384 left
  const Decision over = submit({"team-a", "pretrain", "tp8,pp1,dp1", {}}, snapshot(19000, 700));
  REQUIRE_FALSE(over.allowed);
  CHECK_THAT(over.message, Catch::Contains("over quota: team 'team-a' has 300.0 GPU-hours left this month") &&
                               Catch::Contains("this job may use 384.0 (8 GPUs x 2-00:00:00 max wall") &&
                               Catch::Contains("over by 84.0") && Catch::Contains("use at most 6 GPUs") &&
                               Catch::Contains("tier 'explore'"));
  // explore is charged half: 8 x 4 h x 0.5 = 16 fits in 300.
  CHECK(submit({"team-a", "explore", "tp8,pp1,dp1", {}}, snapshot(19000, 700)).allowed);
}

TEST_CASE("a missing or stale snapshot: fail-open warns, fail-closed rejects") {
  const Choices c{"team-a", "pretrain", "tp1,pp1,dp1", {}};
  const Decision open =
      admit_submission(policy(), c, {"root", {}}, {nullptr, "no snapshot", SnapshotFailure::kOpen});
  CHECK(open.allowed);
  REQUIRE(open.warnings.size() == 1);
  CHECK_THAT(open.warnings[0], Catch::Contains("no snapshot; quota not checked (fail-open)"));
  const Decision closed =
      admit_submission(policy(), c, {"root", {}}, {nullptr, "no snapshot", SnapshotFailure::kClosed});
  CHECK_FALSE(closed.allowed);
  CHECK_THAT(closed.message, Catch::Contains("fail-closed") && Catch::Contains("forge-quota sync"));
  // Membership is still checked when the snapshot is missing.
  CHECK_FALSE(admit_submission(policy(), {"team-b", "explore", "tp1,pp1,dp1", {}}, {"root", {}},
                               {nullptr, "x", SnapshotFailure::kOpen})
                  .allowed);
}

TEST_CASE("snapshot staleness: age and period") {
  Policy p = policy();
  const int64_t now = 1771000000;
  UsageSnapshot s;
  s.period = p.period;
  s.period_start = period_bounds(p.period, now).first;
  s.generated_at = now - 60;
  CHECK_FALSE(snapshot_staleness(s, p, now));
  s.generated_at = now - 3600;
  CHECK_THAT(*snapshot_staleness(s, p, now), Catch::Contains("written 1h 00m ago, older than the 15m"));
  s.generated_at = now;
  s.period_start -= 86400 * 31;
  CHECK_THAT(*snapshot_staleness(s, p, now), Catch::Contains("another budget period"));
}

TEST_CASE("at job start the real allocation must match the declared layout and tier") {
  const UsageSnapshot s = snapshot(0, 0);
  const UsageView u{&s, "", SnapshotFailure::kClosed};
  const Choices c{"team-a", "pretrain", "tp4,pp2,dp2", {}};  // 16 GPUs on 2 nodes, one switch
  const Allocation good{2, 16, "pretrain", "team-a", 1, 3600, "", false};
  CHECK(check_allocation(policy(), c, {"root", {}}, good, u).allowed);
  auto with = [&](auto change) {
    Allocation a = good;
    change(a);
    return check_allocation(policy(), c, {"root", {}}, a, u).message;
  };
  CHECK_THAT(with([](Allocation& a) { a.gpus = 8; }),
             Catch::Contains("given 8 GPUs but --train-layout=tp4,pp2,dp2 needs"));
  CHECK_THAT(with([](Allocation& a) {
               a.nodes = 4;
               a.gpus = 16;
             }),
             Catch::Contains("runs on 4 nodes"));
  CHECK_THAT(with([](Allocation& a) { a.qos = "explore"; }),
             Catch::Contains("QOS 'explore' but tier 'pretrain' uses QOS 'pretrain'"));
  CHECK_THAT(with([](Allocation& a) { a.account = "team-b"; }), Catch::Contains("account 'team-b'"));
  CHECK_THAT(with([](Allocation& a) { a.req_switches = 0; }), Catch::Contains("--switches=1"));
  CHECK_THAT(with([](Allocation& a) { a.time_limit_s = 49 * 3600; }), Catch::Contains("--time=2-00:00:00"));
  // Moved into another pool after submission (scontrol update Partition=...).
  CHECK_THAT(
      with([](Allocation& a) { a.partition = "eval"; }),
      Catch::Contains("partition 'eval' (pool eval) does not take tier 'pretrain' jobs; submit to train"));
  CHECK(with([](Allocation& a) { a.partition = "train"; }).empty());
  const UsageSnapshot spent = snapshot(20000, 0);
  CHECK_THAT(
      check_allocation(policy(), c, {"root", {}}, good, {&spent, "", SnapshotFailure::kClosed}).message,
      Catch::Contains("has used 20000.0 of its 20000.0"));
  // The declared values are re-validated too: a user-edited option variable is not trusted.
  CHECK_FALSE(
      check_allocation(policy(), {"team-b", "finetune", "tp4,pp2,dp2", {}}, {"root", {}}, good, u).allowed);
}

TEST_CASE("approval_needed: each rule and its boundary") {
  const Tier& pretrain = *policy().tier("pretrain");  // example: gpus = 16, gpu_hours = 300
  CHECK_FALSE(approval_needed(policy(), pretrain, 16, 3600));
  CHECK(approval_needed(policy(), pretrain, 17, 3600) ==
        "17 GPUs is more than the 16 a job may take without approval");
  // GPU-hours: GPUs x the time limit, more than 300 needs one; exactly 300 does not.
  CHECK_FALSE(approval_needed(policy(), pretrain, 10, 30 * 3600));
  CHECK(approval_needed(policy(), pretrain, 10, 30 * 3600 + 36) ==
        "an estimated 300.1 GPU-hours (10 GPUs x 30:00:36) is more than 300");
  // Both at once: both reasons.
  CHECK(approval_needed(policy(), pretrain, 24, 40 * 3600) ==
        "24 GPUs is more than the 16 a job may take without approval; an estimated 960 GPU-hours (24 GPUs x "
        "40:00:00) is more than 300");
  // An unknown time limit skips the GPU-hour rule.
  CHECK_FALSE(approval_needed(policy(), pretrain, 16, std::nullopt));
  CHECK(approval_needed(policy(), pretrain, 17, std::nullopt));

  Policy p = policy();
  p.approval.tiers = {"pretrain"};
  CHECK(approval_needed(p, pretrain, 1, 60) == "tier 'pretrain' always needs approval");
  CHECK_FALSE(approval_needed(p, *p.tier("explore"), 1, 60));
  // Thresholds of 0 are rules that are off.
  p.approval = {};
  CHECK_FALSE(approval_needed(p, pretrain, 100000, 48 * 3600));
}

TEST_CASE("approval_request_command: the exact command, with the job's time or the tier's max wall") {
  const Team& a = *policy().team("team-a");
  CHECK(approval_request_command(a, *policy().tier("explore"), 24, 4 * 3600) ==
        "forge-quota request --team team-a --tier explore --gpus 24 --time 4:00:00 --reason \"...\"");
  CHECK(approval_request_command(a, *policy().tier("pretrain"), 32, std::nullopt) ==
        "forge-quota request --team team-a --tier pretrain --gpus 32 --time 48:00:00 --reason \"...\"");
}

TEST_CASE("run_dir_violation: the team's directory, prefix tricks, symlinks and admins") {
  namespace fs = std::filesystem;
  forge::test::TempDir dir;
  const std::string base = fs::canonical(dir.path()).string();
  fs::create_directories(base + "/team-a/runs");
  fs::create_directories(base + "/team-ab/runs");
  fs::create_directories(base + "/elsewhere");
  Policy p = policy();
  Team& a = p.teams.at("team-a");
  a.root = base + "/team-a";
  const Identity alice{"alice", {}};

  CHECK_FALSE(run_dir_violation(p, a, alice, base + "/team-a/runs/r1"));
  CHECK_FALSE(run_dir_violation(p, a, alice, base + "/team-a/runs/new/deeper"));  // need not exist yet
  CHECK_FALSE(run_dir_violation(p, a, alice, base + "/team-a/runs/../runs/r2/"));
  const auto outside = run_dir_violation(p, a, alice, "/tmp/x");
  REQUIRE(outside);
  CHECK(*outside == fmt::format("run.dir '/tmp/x' is outside team team-a's directory {0}/team-a; put the run "
                                "under {0}/team-a/runs",
                                base));
  // A sibling whose name starts with the root's is not inside it.
  CHECK(run_dir_violation(p, a, alice, base + "/team-ab/runs/r1"));
  // Dot-dot out of the root.
  CHECK(run_dir_violation(p, a, alice, base + "/team-a/runs/../../elsewhere/r"));
  // A symlink inside the root that points out of it: where the files land is outside.
  fs::create_directory_symlink(base + "/elsewhere", base + "/team-a/runs/escape");
  CHECK(run_dir_violation(p, a, alice, base + "/team-a/runs/escape/r1"));
  // ... also when its target cannot be reached (missing here; for a user, a directory they cannot enter):
  // the link itself says where it goes.
  fs::create_directory_symlink(base + "/elsewhere/not-yet", base + "/team-a/runs/dangling");
  CHECK(run_dir_violation(p, a, alice, base + "/team-a/runs/dangling/r1"));
  fs::create_directory_symlink("../../elsewhere/not-yet", base + "/team-a/runs/relative");
  CHECK(run_dir_violation(p, a, alice, base + "/team-a/runs/relative/r1"));
  // '..' after a link leaves the link's target, as the kernel walks it, not the link's directory.
  fs::create_directories(base + "/elsewhere/sub");
  fs::create_directory_symlink(base + "/elsewhere/sub", base + "/team-a/runs/deep");
  CHECK(run_dir_violation(p, a, alice, base + "/team-a/runs/deep/../r1"));
  // A link inside the root to inside the root is inside; a loop ends (taken as written) instead of hanging.
  fs::create_directory_symlink(base + "/team-a/runs", base + "/team-a/runs/self");
  CHECK_FALSE(run_dir_violation(p, a, alice, base + "/team-a/runs/self/r1"));
  fs::create_directory_symlink("loop", base + "/team-a/runs/loop");
  CHECK_FALSE(run_dir_violation(p, a, alice, base + "/team-a/runs/loop/r1"));
  // A relative run.dir is taken from the working directory.
  const auto cwd = fs::current_path();
  fs::current_path(base + "/team-a");
  CHECK_FALSE(run_dir_violation(p, a, alice, "runs/r3"));
  fs::current_path(base + "/elsewhere");
  CHECK(run_dir_violation(p, a, alice, "runs/r3"));
  fs::current_path(cwd);
  // Admins may keep runs anywhere; a team without a root is not restricted.
  CHECK_FALSE(run_dir_violation(p, a, {"dave", {}}, "/tmp/x"));
  CHECK(run_dir_violation(p, *p.team("team-b"), {"bob", {}}, "/tmp/x"));
  Team no_root = a;
  no_root.root.clear();
  CHECK_FALSE(run_dir_violation(p, no_root, alice, "/tmp/x"));
  // A hostile run.dir is shown escaped.
  const auto hostile = run_dir_violation(p, a, alice, "/tmp/\n%n%s");
  REQUIRE(hostile);
  CHECK(hostile->find('\n') == std::string::npos);
}
