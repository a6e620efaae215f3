// forge_spank.so loaded the way Slurm loads it (dlopen, symbols by name) into a fake host: options,
// plugstack arguments, the sbatch-time decision, the slurmstepd re-check, and hostile values.
#include "fake_slurm.h"
#include "support/paths.h"

#include "forge/quota/policy.h"
#include "forge/quota/snapshot.h"

#include <dlfcn.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <ctime>

#include "../support/temp_dir.h"

namespace {

using Callback = int (*)(spank_t, int, char**);

struct Plugin {
  void* handle = nullptr;
  Callback init = nullptr, post_opt = nullptr, user_init = nullptr, task_priv = nullptr;
  Plugin() {
    handle = dlopen(forge::test::env_path("FORGE_SPANK_SO").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) FAIL(dlerror());
    init = reinterpret_cast<Callback>(dlsym(handle, "slurm_spank_init"));
    post_opt = reinterpret_cast<Callback>(dlsym(handle, "slurm_spank_init_post_opt"));
    user_init = reinterpret_cast<Callback>(dlsym(handle, "slurm_spank_user_init"));
    task_priv = reinterpret_cast<Callback>(dlsym(handle, "slurm_spank_task_init_privileged"));
  }
};

Plugin& plugin() {
  static Plugin p;
  return p;
}

std::string me() {
  return getpwuid(getuid())->pw_name;
}

// A policy in which the test's own user belongs to team-a only, and a fresh snapshot.
struct Fixture {
  forge::test::TempDir dir;
  std::string policy, snapshot;
  // team_root: team-a keeps its runs in a directory of its own (docs/ADMISSION.md, "Team isolation").
  Fixture(double used_a = 0, bool team_root = false) {
    policy =
        dir.write("policy.ini", "[policy]\ncluster = forge\nsnapshot = " + (dir / "usage.json") +
                                    "\n[tier.pretrain]\nqos = pretrain\npriority = 100\nmax_wall = 48:00:00\n"
                                    "[tier.explore]\nqos = explore\npriority = 10\npreemptible = true\n"
                                    "max_wall = 4:00:00\ncharge = 0.5\n"
                                    "[team.team-a]\nmembers = " +
                                    me() +
                                    "\naccount = team-a\n"
                                    "budget_gpu_hours = 1000\nmax_gpus = 32\ntiers = pretrain, explore\n" +
                                    (team_root ? "root = " + (dir / "team-a") + "\n" : std::string()) +
                                    "[team.team-b]\nmembers = nobody-here\naccount = team-b\n"
                                    "budget_gpu_hours = 1000\nmax_gpus = 32\ntiers = explore\n"
                                    "[topology]\ngpus_per_node = 8\nmax_switches = 16:1\n"
                                    "[approval]\ngpus = 16\n");
    snapshot = dir / "usage.json";
    const auto p = forge::quota::load_policy(policy);
    forge::quota::UsageSnapshot s;
    s.generated_at = time(nullptr);
    std::tie(s.period_start, s.period_end) = forge::quota::period_bounds(p.period, s.generated_at);
    s.teams["team-a"] = {used_a, 0, 0};
    forge::quota::write_snapshot(snapshot, s);
  }
  // Runs slurm_spank_init with plugstack arguments, then the given option values.
  int start(spank_context_t ctx, std::vector<std::string> args, const std::string& team,
            const std::string& tier, const std::string& layout, const std::string& spec = "",
            const std::string& approval = "") {
    fake::reset(ctx);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    const int rc = plugin().init(nullptr, static_cast<int>(argv.size()), argv.data());
    const std::string values[] = {team, tier, layout, spec, approval};
    for (size_t i = 0; i < 5 && i < fake::host().options.size(); ++i)
      fake::host().options[i].cb(fake::host().options[i].val, values[i].c_str(), ctx == S_CTX_REMOTE);
    return rc;
  }
  std::vector<std::string> args(const std::string& extra = "") const {
    std::vector<std::string> a = {"policy=" + policy};
    if (!extra.empty()) a.push_back(extra);
    return a;
  }
  int sbatch(const std::string& team, const std::string& tier, const std::string& layout,
             const std::string& extra = "", const std::string& spec = "", const std::string& approval = "") {
    REQUIRE(start(S_CTX_ALLOCATOR, args(extra), team, tier, layout, spec, approval) == 0);
    return plugin().post_opt(nullptr, 0, nullptr);
  }
  // The slurmstepd sequence: user_init decides, task_init_privileged reports. Returns the latter.
  int stepd(const std::string& team, const std::string& tier, const std::string& layout,
            const std::string& spec = "", const std::map<std::string, std::string>& env = {}) {
    const fake::Host job = fake::host();
    REQUIRE(start(S_CTX_REMOTE, args(), team, tier, layout, spec) == 0);
    fake::Host& h = fake::host();
    h.num_nodes = job.num_nodes, h.tres = job.tres, h.qos = job.qos, h.account = job.account;
    h.req_switch = job.req_switch, h.time_limit = job.time_limit, h.job_loads = job.job_loads;
    h.admin_comment = job.admin_comment;
    h.uid = getuid(), h.gid = getgid();
    h.job_env = env;
    REQUIRE(plugin().post_opt(nullptr, 0, nullptr) == 0);  // never fails remotely: it would drain the node
    REQUIRE(plugin().user_init(nullptr, 0, nullptr) == 0);
    return plugin().task_priv(nullptr, 0, nullptr);
  }
};

std::string last_error() {
  return fake::host().errors.empty() ? "" : fake::host().errors.back();
}

// No user text may ever reach a printf format.
void check_formats_are_ours() {
  for (const auto& f : fake::host().formats) {
    INFO(f);
    CHECK(f.find("%n") == std::string::npos);
    CHECK(std::count(f.begin(), f.end(), '%') <= 3);
  }
}

}  // namespace

TEST_CASE("the plugin exports exactly the SPANK entry points and plugin symbols") {
  Plugin& p = plugin();
  REQUIRE(p.init);
  REQUIRE(p.post_opt);
  REQUIRE(p.user_init);
  REQUIRE(p.task_priv);
  CHECK(std::string(static_cast<const char*>(dlsym(p.handle, "plugin_name"))) == "forge");
  CHECK(std::string(static_cast<const char*>(dlsym(p.handle, "plugin_type"))) == "spank");
  CHECK(dlsym(p.handle, "plugin_version"));
  CHECK(dlsym(p.handle, "spank_plugin_version"));
  CHECK_FALSE(
      dlsym(p.handle, "_ZN5forge5quota11load_policyERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"));
}

TEST_CASE("sbatch: options are registered and an allowed job passes its choices on") {
  Fixture f;
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp2,dp2") == 0);
  const auto& env = fake::host().control_env;
  CHECK(fake::host().options.size() == 5);
  CHECK(std::string(fake::host().options[0].name) == "train-team");
  CHECK(env.at("FORGE_TEAM") == "team-a");
  CHECK(env.at("FORGE_TIER") == "pretrain");
  CHECK(env.at("FORGE_LAYOUT") == "tp2,pp2,dp2");
  CHECK(env.at("FORGE_QOS") == "pretrain");
  CHECK(env.at("FORGE_GPUS") == "8");
  CHECK(env.at("FORGE_NODES") == "1");
  CHECK(env.at("FORGE_PREEMPTIBLE") == "0");
  CHECK(fake::host().errors.empty());
  // Option callbacks may run twice: the last value wins, nothing accumulates.
  fake::host().options[0].cb(fake::host().options[0].val, "team-a", 0);
  CHECK(plugin().post_opt(nullptr, 0, nullptr) == 0);
  // Jobs that use no --train-* option are not training jobs: nothing to check.
  CHECK(f.sbatch("", "", "") == 0);
  CHECK(fake::host().control_env.empty());
}

TEST_CASE("sbatch: each rejection is one actionable error line") {
  Fixture f;
  CHECK(f.sbatch("team-x", "pretrain", "tp1,pp1,dp1") == -1);
  CHECK_THAT(last_error(), Catch::StartsWith("forge: unknown team 'team-x'"));
  CHECK(f.sbatch("team-b", "explore", "tp1,pp1,dp1") == -1);
  CHECK_THAT(last_error(), Catch::Contains("is not a member of team 'team-b'"));
  CHECK(f.sbatch("team-a", "finetune", "tp1,pp1,dp1") == -1);
  CHECK_THAT(last_error(), Catch::Contains("unknown tier 'finetune'"));
  CHECK(f.sbatch("team-a", "pretrain", "tp16,pp1,dp1") == -1);
  CHECK_THAT(last_error(), Catch::Contains("TP=16 does not fit inside one node"));
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("expected tpX,ppY,dpZ"));
  CHECK(f.sbatch("team-a", "pretrain", "") == -1);
  CHECK_THAT(last_error(), Catch::Contains("missing --train-layout"));
  for (const auto& e : fake::host().errors) CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("sbatch: over quota, with the numbers") {
  Fixture f(990);  // 10 GPU-hours left; pretrain 8 GPUs x 48 h = 384
  CHECK(f.sbatch("team-a", "pretrain", "tp8,pp1,dp1") == -1);
  CHECK_THAT(last_error(), Catch::Contains("over quota") && Catch::Contains("over by 374.0"));
  // mode=warn reports and lets it through
  CHECK(f.sbatch("team-a", "pretrain", "tp8,pp1,dp1", "mode=warn") == 0);
  REQUIRE_FALSE(fake::host().infos.empty());
  CHECK_THAT(fake::host().infos.back(), Catch::Contains("over quota") && Catch::Contains("mode=warn"));
}

TEST_CASE("sbatch: a missing snapshot is a warning when fail-open and a rejection when fail-closed") {
  Fixture f;
  std::filesystem::remove(f.snapshot);
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "fail-open") == 0);
  REQUIRE_FALSE(fake::host().infos.empty());
  CHECK_THAT(fake::host().infos.back(), Catch::Contains("quota not checked (fail-open)"));
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "fail-closed") == -1);
  CHECK_THAT(last_error(), Catch::Contains("fail-closed"));
}

TEST_CASE("sbatch: a snapshot others can write is not trusted") {
  Fixture f(990);
  ::chmod(f.snapshot.c_str(), 0666);
  CHECK(f.sbatch("team-a", "pretrain", "tp8,pp1,dp1", "fail-closed") == -1);
  CHECK_THAT(last_error(), Catch::Contains("writable by group or others"));
}

TEST_CASE("sbatch: plugstack.conf mistakes and a broken policy reject with the reason") {
  Fixture f;
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "mode=bogus") == -1);
  CHECK_THAT(last_error(), Catch::Contains("unknown argument 'mode=bogus'"));
  // job_submit.lua's argument is the controller's: the plugin accepts it and changes nothing.
  fake::reset(S_CTX_ALLOCATOR);
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "controller_fallback=trust-plugin") == 0);
  fake::reset(S_CTX_ALLOCATOR);
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "controller_fallback=yes") == -1);
  // job_tmp= is the nodes' (a private /tmp per job, tested on the dev cluster); it must be absolute.
  fake::reset(S_CTX_ALLOCATOR);
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "job_tmp=/var/spool/forge-jobs") == 0);
  fake::reset(S_CTX_ALLOCATOR);
  CHECK(f.sbatch("team-a", "pretrain", "tp1,pp1,dp1", "job_tmp=relative/dir") == -1);
  CHECK_THAT(last_error(), Catch::Contains("job_tmp= needs an absolute directory"));
  fake::reset(S_CTX_ALLOCATOR);
  const std::string bad = f.dir.write("bad.ini", "[policy]\ncluster = forge\nbogus = 1\n");
  fake::reset(S_CTX_ALLOCATOR);
  std::vector<std::string> args = {"policy=" + bad};
  REQUIRE(f.start(S_CTX_ALLOCATOR, args, "team-a", "pretrain", "tp1,pp1,dp1") == 0);
  CHECK(plugin().post_opt(nullptr, 0, nullptr) == -1);
  CHECK_THAT(last_error(), Catch::Contains(bad + ":3: unknown key 'bogus'"));
}

TEST_CASE("sbatch: --train-spec must agree with --train-layout and its model suit it") {
  Fixture f;
  const std::string spec = f.dir.write("job.ini", "[run]\nname = x\n[parallel]\ntp = 2\npp = 1\ndp = 4\n");
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp1,dp4", "", spec) == 0);
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp1,dp2", "", spec) == -1);
  CHECK_THAT(last_error(), Catch::Contains("disagrees with the job spec's [parallel] (tp2,pp1,dp4)"));
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp1,dp2", "", f.dir / "missing.ini") == -1);
  CHECK_THAT(last_error(), Catch::Contains("--train-spec: cannot read '" + f.dir / "missing.ini" + "'"));
  // [model] from the same file, the trainer's defaults (6 heads) where absent.
  const std::string tp4 = f.dir.write("tp4.ini", "[parallel]\ntp = 4\ndp = 2\n");
  CHECK(f.sbatch("team-a", "pretrain", "tp4,pp1,dp2", "", tp4) == -1);
  CHECK(last_error() ==
        "forge: --train-layout=tp4,pp1,dp2 does not suit the job spec: parallel.tp: must divide model.heads "
        "= 6 "
        "(each rank holds whole heads)");
  CHECK(f.sbatch("team-a", "pretrain", "tp4,pp1,dp2", "",
                 f.dir.write("h8.ini",
                             "[model]\nheads = 8\n[parallel]\n"
                             "tp = 4\ndp = 2\n")) == 0);
  CHECK(f.sbatch("team-a", "pretrain", "tp2,pp1,dp4", "", f.dir.write("bad.ini", "[model]\nvocab = 0\n")) ==
        -1);
  CHECK_THAT(last_error(), Catch::Contains("bad.ini:2: model.vocab = 0: expected a whole number"));
}

TEST_CASE("hostile option values are rejected cleanly and never reach a format string") {
  Fixture f;
  const std::string hostile[] = {std::string(4096, 'A'),
                                 std::string(100000, 'B'),
                                 "%n%s%n%s%x%x",
                                 "a;rm -rf /;`id`$(id)|&>x",
                                 std::string("\xff\xfe\xc3\x28 team"),
                                 std::string("team\nforge: fake line")};
  for (const auto& h : hostile) {
    for (int which = 0; which < 3; ++which) {
      const int rc =
          f.sbatch(which == 0 ? h : "team-a", which == 1 ? h : "pretrain", which == 2 ? h : "tp1,pp1,dp1");
      CHECK(rc == -1);
      const std::string e = last_error();
      CHECK(e.size() < 600);
      CHECK(e.find('\n') == std::string::npos);
      CHECK(e.find('\xff') == std::string::npos);
      check_formats_are_ours();
    }
  }
}

TEST_CASE("slurmstepd: the real allocation must match; violations fail the job in task_init_privileged") {
  Fixture f;
  fake::Host& h = fake::host();
  // tp4,pp2,dp2 = 16 GPUs = 2 nodes under one switch, pretrain QOS, team-a account.
  h.num_nodes = 2, h.tres = "cpu=2,gres/gpu=16,node=2", h.qos = "pretrain", h.account = "team-a";
  h.req_switch = 1, h.time_limit = 60;
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == 0);
  CHECK(fake::host().job_env.at("FORGE_TEAM") == "team-a");
  CHECK(fake::host().job_env.at("FORGE_TIER") == "pretrain");
  CHECK(fake::host().job_env.at("FORGE_LAYOUT") == "tp4,pp2,dp2");
  CHECK(fake::host().job_env.at("FORGE_PREEMPTIBLE") == "0");

  fake::host().tres = "cpu=2,gres/gpu=8,node=1";
  fake::host().num_nodes = 1;
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("job 42 rejected at start: the job was given 8 GPUs"));
  CHECK(fake::host().job_env.empty());
  // The same allocation for an elastic job (job_submit.lua's mark): one whole node holds a replica (tp4,pp2).
  fake::host().admin_comment = "forge-elastic:nodes=1-2";
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == 0);
  fake::host().tres = "cpu=2,gres/gpu=4,node=1";  // half a node: no replica
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  fake::host().admin_comment.clear();

  fake::host().tres = "cpu=2,gres/gpu=16,node=2";
  fake::host().num_nodes = 2;
  fake::host().qos = "explore";
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("QOS 'explore' but tier 'pretrain' uses QOS 'pretrain'"));

  fake::host().qos = "pretrain";
  fake::host().req_switch = 0;
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("--switches=1"));

  fake::host().req_switch = 1;
  fake::host().time_limit = INFINITE;
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("--time=2-00:00:00"));

  // Option variables edited by the user are re-validated against the node's policy.
  fake::host().time_limit = 60;
  CHECK(f.stepd("team-b", "explore", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("not a member of team 'team-b'"));
  CHECK(f.stepd("team-a", "pretrain", "%n%n%n%n") == -1);
  check_formats_are_ours();

  fake::host().job_loads = false;
  CHECK(f.stepd("team-a", "pretrain", "tp4,pp2,dp2") == -1);
  CHECK_THAT(last_error(), Catch::Contains("cannot load the job record"));
  fake::host().job_loads = true;

  // A job without --train-* options is not touched.
  CHECK(f.stepd("", "", "") == 0);
  CHECK(fake::host().job_env.empty());
}

TEST_CASE("sbatch: a job over the approval threshold is told the request command; an id is passed on") {
  Fixture f;
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp16") == 0);  // 16 GPUs: at the threshold, not over it
  CHECK(fake::host().control_env.count("FORGE_APPROVAL") == 0);
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp24") == -1);
  CHECK_THAT(last_error(), Catch::Contains("needs an approval: 24 GPUs"));
  CHECK_THAT(last_error(), Catch::Contains("forge-quota request --team team-a --tier explore --gpus 24"));
  CHECK_THAT(last_error(), Catch::Contains("submit again with --train-approval=ID"));
  // sbatch only names the id; whether it is valid is the controller's judgement (job_submit.lua).
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp24", "", "", "apr-0123456789ab") == 0);
  CHECK(fake::host().control_env.at("FORGE_APPROVAL") == "apr-0123456789ab");
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp24", "", "", "%n%s%x") == 0);
  check_formats_are_ours();
}

TEST_CASE(
    "slurmstepd: a team's run.dir must lie in its directory; a violation fails the job, never the node") {
  Fixture f(0, true);
  const std::string inside = f.dir / "team-a/runs/r1", outside = f.dir / "elsewhere";
  const auto spec = [&](const std::string& name, const std::string& run_dir) {
    return f.dir.write(name, "[run]\ndir = " + run_dir + "\n[parallel]\ntp = 1\npp = 1\ndp = 1\n");
  };
  fake::Host& h = fake::host();
  h.num_nodes = 1, h.tres = "cpu=1,gres/gpu=1,node=1", h.qos = "explore", h.account = "team-a";
  h.req_switch = 0, h.time_limit = 60;
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", spec("in.ini", inside)) == 0);
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", spec("out.ini", outside)) == -1);
  CHECK_THAT(last_error(), Catch::Contains("is outside team team-a's directory"));
  // A sibling whose name merely starts like the team's directory is outside it.
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", spec("sib.ini", f.dir / "team-ab/runs")) == -1);
  // Relative paths are the job's: against its working directory.
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", "rel.ini", {{"PWD", f.dir.path().string()}}) ==
        -1);  // no such spec
  CHECK_THAT(last_error(), Catch::Contains("--train-spec"));
  spec("rel.ini", "team-a/runs/r2");
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", "rel.ini", {{"PWD", f.dir.path().string()}}) == 0);
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1", spec("none.ini", ""), {}) == -1);
  CHECK_THAT(last_error(), Catch::Contains("sets no [run] dir"));
  // Without --train-spec the job declares no run: nothing to check.
  CHECK(f.stepd("team-a", "explore", "tp1,pp1,dp1") == 0);
  // sbatch gives the same answer early.
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp1", "", spec("early.ini", outside)) == -1);
  CHECK_THAT(last_error(), Catch::Contains("is outside team team-a's directory"));
  CHECK(f.sbatch("team-a", "explore", "tp1,pp1,dp1", "", spec("early-in.ini", inside)) == 0);
}
