// forge-health's checks, decision and node actions over fake probes: the machine is faked, the logic is
// the library's own.
#include "forge/health/health.h"
#include "forge/common/error.h"
#include "forge/health/checks.h"
#include "forge/health/config.h"
#include "forge/health/node.h"
#include "support/paths.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

using namespace forge;
using namespace forge::health;

namespace {

class FakeProbes final : public Probes {
 public:
  std::map<std::string, std::string> files;
  std::set<std::string> dirs, programs;
  std::map<std::string, DiskSpace> disks;
  std::map<std::string, std::string> write_errors, env;
  std::vector<std::string> kmsg;
  std::vector<ProcessInfo> procs;
  std::set<int> unkillable;
  std::vector<int> killed;
  int64_t now = 1800000000;  // 2027-01-15
  double uptime = 100000;
  int self = 999;
  // By program name; unknown programs are "not found".
  std::map<std::string, std::function<CommandOutput(const std::vector<std::string>&, const std::string&)>>
      handlers;
  std::vector<std::vector<std::string>> calls;

  std::optional<DiskSpace> disk_space(const std::string& path, std::string& error) override {
    const auto it = disks.find(path);
    if (it == disks.end()) {
      error = "No such file or directory";
      return std::nullopt;
    }
    return it->second;
  }
  std::optional<std::string> read_file(const std::string& path) override {
    const auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  }
  bool is_directory(const std::string& path) override { return dirs.count(path) > 0; }
  bool exists(const std::string& path) override { return dirs.count(path) || files.count(path); }
  bool have_program(const std::string& p) override { return programs.count(p) > 0; }
  CommandOutput run(const std::vector<std::string>& argv, const std::string& input, double) override {
    calls.push_back(argv);
    const auto it = handlers.find(argv.at(0));
    if (it == handlers.end()) {
      CommandOutput r;
      r.not_found = true;
      return r;
    }
    return it->second(argv, input);
  }
  int64_t now_s() override { return now; }
  double uptime_s() override { return uptime; }
  std::string getenv(const std::string& name) override {
    const auto it = env.find(name);
    return it == env.end() ? "" : it->second;
  }
  std::vector<std::string> kernel_log() override { return kmsg; }
  std::vector<ProcessInfo> processes() override { return procs; }
  int self_pid() override { return self; }
  bool kill_process(int pid) override {
    killed.push_back(pid);
    return !unkillable.count(pid);
  }
  std::string write_read_test(const std::string& dir) override {
    const auto it = write_errors.find(dir);
    return it == write_errors.end() ? "" : it->second;
  }
};

CommandOutput ok(std::string out = "") {
  CommandOutput r;
  r.out = std::move(out);
  return r;
}
CommandOutput failed_with(int status, std::string err) {
  CommandOutput r;
  r.status = status;
  r.err = std::move(err);
  return r;
}

CheckContext context(const HealthConfig& cfg, Mode mode = Mode::kPeriodic, int gres = 8) {
  CheckContext ctx;
  ctx.config = &cfg;
  ctx.node = "node4";
  ctx.mode = mode;
  ctx.gres_gpus = gres;
  return ctx;
}

// The fake dev cluster's scontrol: one node whose state and reason `update` changes, every update recorded.
struct FakeSlurm {
  std::string state = "IDLE", reason;
  std::vector<std::string> updates;
  bool admin_drains_during_checks = false;
  int shows = 0;
  void install(FakeProbes& p) {
    p.programs.insert("scontrol");
    p.handlers["scontrol"] = [this](const std::vector<std::string>& a, const std::string&) {
      if (a.at(1) == "show") {
        if (a.at(4) != "node4") return failed_with(1, "Node " + a.at(4) + " not found");
        if (++shows == 2 && admin_drains_during_checks) {
          state = "IDLE+DRAIN";
          reason = "maintenance";
        }
        std::string line =
            "NodeName=node4 Arch=x86_64 CPUTot=16 Gres=gpu:8 NodeAddr=127.0.0.5 State=" + state +
            " ThreadsPerCore=1 Partitions=gpu";
        if (!reason.empty()) line += " Reason=" + reason + " [root@2026-12-01T13:46:26]";
        return ok(line + "\n");
      }
      std::string joined;
      for (size_t i = 2; i < a.size(); ++i) joined += (i > 2 ? " " : "") + a[i];
      updates.push_back(joined);
      if (a.at(3) == "State=DRAIN") {
        state = "IDLE+DRAIN";
        reason = a.at(4).substr(7);
      } else {
        state = "IDLE";
        reason.clear();
      }
      return ok();
    };
  }
};

// A node whose quick checks all pass (fake GPU dir, disks, memory, munge).
FakeProbes healthy_node() {
  FakeProbes p;
  p.dirs = {"/tmp", "/runs"};
  p.disks["/tmp"] = {50ull << 30, 100ull << 30, 1000000, 2000000};
  p.disks["/runs"] = {50ull << 30, 100ull << 30, 1000000, 2000000};
  p.files["/proc/meminfo"] = "MemTotal:       24683656 kB\nMemAvailable:   20000000 kB\n";
  p.programs = {"munge", "unmunge"};
  p.handlers["munge"] = [](auto&, auto&) { return ok("MUNGE:cred:\n"); };
  p.handlers["unmunge"] = [](auto&, const std::string& in) {
    return in == "MUNGE:cred:\n" ? ok("STATUS: Success (0)\n")
                                 : failed_with(1, "unmunge: Error: Invalid credential");
  };
  return p;
}

LoadedConfig dev_config() {
  LoadedConfig l = load_health_config("");
  l.config.fake_gpu_dir = "/gpu-health";
  l.config.run_root = "/runs";
  return l;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("FORGE_TEST_TMP");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "health";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("gpu: fake health files, missing/empty/ok healthy, anything else names the GPU and the fault") {
  HealthConfig cfg;
  cfg.fake_gpu_dir = "/gpu-health";
  FakeProbes p;
  p.files["/gpu-health/node4/gpu0"] = "";
  p.files["/gpu-health/node4/gpu1"] = "ok\n";
  auto r = check_gpu(context(cfg), p);
  CHECK(r.status == Status::kPass);
  CHECK(r.detail == "8 fake GPUs healthy (/gpu-health/node4)");

  p.files["/gpu-health/node4/gpu3"] = "xid 79: GPU has fallen off the bus\n";
  r = check_gpu(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail == "gpu3: xid 79: GPU has fallen off the bus");
  // Another node's files are not this node's.
  CHECK(check_gpu(context(cfg), p).check == "gpu");
  CheckContext other = context(cfg);
  other.node = "node3";
  CHECK(check_gpu(other, p).status == Status::kPass);
  // Only the node's gres count of GPUs, or the configured count.
  CHECK(check_gpu(context(cfg, Mode::kQuick, 2), p).status == Status::kPass);
  cfg.expected_gpus = 4;
  CHECK(check_gpu(context(cfg, Mode::kQuick, 2), p).status == Status::kFail);
}

TEST_CASE("gpu: skipped, never failed, without nvidia-smi and without a fake directory") {
  HealthConfig cfg;
  FakeProbes p;
  const auto r = check_gpu(context(cfg), p);
  CHECK(r.status == Status::kSkip);
}

TEST_CASE("gpu: nvidia-smi rows, missing GPUs, ECC, retired pages, row remapping, Xid") {
  HealthConfig cfg;
  FakeProbes p;
  p.programs.insert("nvidia-smi");
  std::string rows;
  for (int i = 0; i < 8; ++i) rows += fmt::format("{}, 00000000:{:02X}:00.0, 0, No, No, No\n", i, 0x10 + i);
  p.handlers["nvidia-smi"] = [&](auto&, auto&) { return ok(rows); };
  CHECK(check_gpu(context(cfg), p).status == Status::kPass);

  rows = "0, 00000000:10:00.0, 0, No, No, No\n1, 00000000:11:00.0, [N/A], [N/A], [N/A], [N/A]\n";
  auto r = check_gpu(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail == "2 of 8 GPUs visible to nvidia-smi");

  rows = "0, 00000000:10:00.0, 3, Yes, No, No\n1, 00000000:11:00.0, 0, No, Yes, Yes\n";
  r = check_gpu(context(cfg, Mode::kPeriodic, 2), p);
  CHECK(r.detail ==
        "gpu0 (00000000:10:00.0): 3 uncorrected ECC errors; gpu0 (00000000:10:00.0): retired pages pending, "
        "reset the "
        "GPU; gpu1 (00000000:11:00.0): row remapping pending, reset the GPU; gpu1 (00000000:11:00.0): row "
        "remapping "
        "failed");

  rows = "0, 00000000:10:00.0, 0, No, No, No\n";
  // Fatal Xid inside the window counts; an old one, or an application Xid (13), does not.
  p.kmsg = {
      "4,100,99990000000,-;NVRM: Xid (PCI:0000:10:00): 79, pid=1234, name=python, GPU has fallen off the "
      "bus.",
      "4,101,99995000000,-;NVRM: Xid (PCI:0000:10:00): 13, pid=1234, Graphics Exception",
      "4,90,1000000000,-;NVRM: Xid (PCI:0000:11:00): 48, pid=1, DBE (double bit error)"};
  r = check_gpu(context(cfg, Mode::kPeriodic, 1), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail == "xid 79 (PCI:0000:10:00): GPU has fallen off the bus.");
  cfg.xid_window_s = 0;  // every Xid since boot
  CHECK(check_gpu(context(cfg, Mode::kPeriodic, 1), p).detail.find("xid 48") != std::string::npos);

  p.handlers["nvidia-smi"] = [](auto&, auto&) {
    return failed_with(15, "Unable to determine the device handle for GPU0000:10:00.0: Unknown Error");
  };
  r = check_gpu(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail ==
        "nvidia-smi failed (exit 15): Unable to determine the device handle for GPU0000:10:00.0: Unknown "
        "Error");
}

TEST_CASE("gpu: older drivers without row-remapping fields get the basic query") {
  HealthConfig cfg;
  FakeProbes p;
  p.programs.insert("nvidia-smi");
  p.handlers["nvidia-smi"] = [](const std::vector<std::string>& a, auto&) {
    if (a.at(1).find("remapped_rows") != std::string::npos)
      return failed_with(2, "Field \"remapped_rows.pending\" is not a valid field to query.");
    return ok("0, 00000000:10:00.0, 0, No\n");
  };
  CHECK(check_gpu(context(cfg, Mode::kPeriodic, 1), p).status == Status::kPass);
}

TEST_CASE("disk: free space and inodes per root, missing roots, deep write/read test") {
  HealthConfig cfg;
  cfg.run_root = "/runs";
  cfg.checkpoint_root = "/ckpt";
  FakeProbes p = healthy_node();
  p.dirs.insert("/ckpt");
  p.disks["/ckpt"] = {512ull << 20, 100ull << 30, 1000, 1000000};
  auto r = check_disk(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail ==
        "checkpoint root /ckpt: 512 MiB free, below 1024 MiB; checkpoint root /ckpt: 0.10% inodes free, "
        "below 1%");

  p.disks["/ckpt"] = p.disks["/runs"];
  CHECK(check_disk(context(cfg), p).status == Status::kPass);
  p.write_errors["/runs"] = "fsync /runs/.forge-health-test.1: Input/output error";
  CHECK(check_disk(context(cfg), p).status == Status::kPass);  // writes only in deep mode
  r = check_disk(context(cfg, Mode::kDeep), p);
  CHECK(r.detail == "run root /runs: write/read test: fsync /runs/.forge-health-test.1: Input/output error");

  cfg.checkpoint_root = "/gone";
  r = check_disk(context(cfg), p);
  CHECK(r.detail == "checkpoint root /gone is not a directory");
  // A file system without inode accounting (total 0) is not "0% free".
  cfg.checkpoint_root = "";
  p.disks["/runs"].total_inodes = 0;
  p.disks["/runs"].free_inodes = 0;
  CHECK(check_disk(context(cfg), p).status == Status::kPass);
}

TEST_CASE("memory: MemAvailable against the threshold") {
  HealthConfig cfg;
  FakeProbes p = healthy_node();
  CHECK(check_memory(context(cfg), p).status == Status::kPass);
  p.files["/proc/meminfo"] = "MemTotal: 24683656 kB\nMemFree: 1 kB\nMemAvailable:     512000 kB\n";
  const auto r = check_memory(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail == "MemAvailable 500 MiB, below 1024 MiB");
  CHECK(parse_mem_available_kib("MemTotal: 5 kB\n") == std::nullopt);
  p.files.erase("/proc/meminfo");
  CHECK(check_memory(context(cfg), p).status == Status::kSkip);
}

TEST_CASE("munge: munge -n | unmunge through the configured socket") {
  HealthConfig cfg;
  cfg.munge_socket = "/dev/run/munge/munge.socket";
  FakeProbes p = healthy_node();
  CHECK(check_munge(context(cfg), p).status == Status::kPass);
  CHECK(p.calls.at(0) == std::vector<std::string>{"munge", "-n", "-S", "/dev/run/munge/munge.socket"});
  CHECK(p.calls.at(1) == std::vector<std::string>{"unmunge", "-S", "/dev/run/munge/munge.socket"});

  p.handlers["munge"] = [](auto&, auto&) {
    return failed_with(1, "munge: Error: Failed to access \"/dev/run/munge/munge.socket\": No such file\n");
  };
  auto r = check_munge(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail ==
        "munge -n failed (exit 1): munge: Error: Failed to access \"/dev/run/munge/munge.socket\": No such "
        "file");
  p.handlers["munge"] = [](auto&, auto&) {
    CommandOutput t;
    t.timed_out = true;
    return t;
  };
  // A slow answer in the Prolog is left to the periodic check; there it fails.
  auto slow = check_munge(context(cfg, Mode::kQuick), p);
  CHECK(slow.status == Status::kSkip);
  CHECK(slow.detail == "munge -n did not answer within 1 s; left to the periodic check");
  slow = check_munge(context(cfg, Mode::kPeriodic), p);
  CHECK(slow.status == Status::kFail);
  CHECK(slow.detail == "munge -n did not answer within 10 s");
}

TEST_CASE("clock: never before the build date; synchronisation where a tool answers, not in quick mode") {
  HealthConfig cfg;
  cfg.build_epoch = 1790000000;
  FakeProbes p;
  p.now = 1500000000;
  auto r = check_clock(context(cfg, Mode::kQuick), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail.find("is before this program's build date") != std::string::npos);
  p.now = 1800000000;
  p.programs = {"chronyc", "timedatectl"};
  p.handlers["chronyc"] = [](auto&, auto&) {
    return ok("Reference ID : 0\nLeap status     : Not synchronised\n");
  };
  p.handlers["timedatectl"] = [](auto&, auto&) { return ok("yes\n"); };
  CHECK(check_clock(context(cfg, Mode::kQuick), p).status == Status::kPass);
  CHECK(p.calls.empty());  // quick asks no tool
  r = check_clock(context(cfg), p);
  CHECK(r.status == Status::kFail);
  CHECK(r.detail.rfind("chronyc: not synchronised", 0) == 0);
  cfg.require_sync = false;
  CHECK(check_clock(context(cfg), p).status == Status::kPass);
  cfg.require_sync = true;
  // chronyd not running: timedatectl decides; neither answering is "unknown", which passes.
  p.handlers["chronyc"] = [](auto&, auto&) { return failed_with(1, "506 Cannot talk to daemon"); };
  r = check_clock(context(cfg), p);
  CHECK(r.detail.find("timedatectl: synchronised") != std::string::npos);
  p.handlers["timedatectl"] = [](auto&, auto&) { return failed_with(1, "Failed to connect to bus"); };
  r = check_clock(context(cfg), p);
  CHECK(r.status == Status::kPass);
  CHECK(r.detail.find("sync unknown") != std::string::npos);
  CHECK(parse_build_date("Dec  1 2026") == 1796083200);  // 2026-12-01T00:00:00Z
  CHECK(parse_build_date("Foo  1 2026") == 0);
}

TEST_CASE("stale_processes: job processes of ended jobs, scoped to the node's mount namespace") {
  HealthConfig cfg;
  FakeProbes p;
  auto proc = [](int pid, int ppid, std::string comm, std::vector<std::string> argv, std::string ns,
                 std::string job) {
    return ProcessInfo{pid, ppid, std::move(comm), std::move(argv), std::move(ns), std::move(job)};
  };
  p.procs = {
      proc(1, 0, "init", {"/sbin/init"}, "mnt:[1]", ""),
      proc(10, 1, "slurmd", {"slurmd", "-D", "-N", "node3"}, "mnt:[3]", ""),
      proc(11, 1, "slurmd", {"slurmd", "-D", "-N", "node4"}, "mnt:[4]", ""),
      proc(20, 11, "slurmstepd", {"slurmstepd: [41.batch]"}, "mnt:[4]", ""),
      proc(21, 20, "python", {"python", "train.py"}, "mnt:[4]", "41"),  // running job
      proc(22, 1, "python", {"python", "old.py"}, "mnt:[4]", "37"),     // ended job: stale
      proc(23, 1, "python", {"python", "other.py"}, "mnt:[3]", "38"),   // node3's, not ours
      proc(24, 1, "srun", {"srun", "x"}, "mnt:[1]", "39"),              // the host's (client side)
      proc(998, 11, "bash", {"/bin/bash", "epilog"}, "mnt:[4]", "40"),  // our parent (the Epilog of job 40)
      proc(999, 998, "forge-health", {"forge-health"}, "mnt:[4]", "40"),
  };
  p.programs.insert("squeue");
  p.handlers["squeue"] = [](const std::vector<std::string>& a, auto&) {
    CHECK(a == std::vector<std::string>{"squeue", "-h", "-a", "-o", "%A"});
    return ok("41\n");
  };
  auto r = check_stale_processes(context(cfg, Mode::kDeep), p);
  CHECK(r.status == Status::kFail);
  CHECK(
      r.detail ==
      "1 processes of ended jobs 37 (pid 22 python old.py): kill them, or set [stale_processes] kill = true");
  CHECK(p.killed.empty());

  cfg.kill_stale = true;
  r = check_stale_processes(context(cfg, Mode::kDeep), p);
  CHECK(r.status == Status::kPass);
  CHECK(r.detail == "killed 1 processes of ended jobs 37");
  CHECK(p.killed == std::vector<int>{22});
  p.unkillable = {22};
  CHECK(check_stale_processes(context(cfg, Mode::kDeep), p).status == Status::kFail);

  // A real node: one slurmd in the host's namespace, so every process on the host is the node's.
  for (auto& q : p.procs) q.mnt_ns = "mnt:[1]";
  p.procs.erase(p.procs.begin() + 1);  // no node3 slurmd
  p.handlers["squeue"] = [](auto&, auto&) { return ok("41\n39\n"); };
  cfg.kill_stale = false;
  r = check_stale_processes(context(cfg, Mode::kDeep), p);
  CHECK(r.detail.rfind("2 processes of ended jobs 37,38", 0) == 0);

  p.handlers["squeue"] = [](auto&, auto&) {
    return failed_with(1, "slurm_load_jobs error: Unable to contact slurm controller");
  };
  CHECK(check_stale_processes(context(cfg, Mode::kDeep), p).status == Status::kSkip);
}

TEST_CASE("decision: drain on failure, resume only forge-health's own drains, never an admin's") {
  const std::vector<CheckResult> healthy = {{"gpu", Status::kPass, ""}, {"clock", Status::kSkip, "no tool"}};
  const std::vector<CheckResult> sick = {{"disk", Status::kPass, ""},
                                         {"gpu", Status::kFail, "gpu3: xid 79: GPU has fallen off the bus"},
                                         {"memory", Status::kFail, "low"}};
  NodeState idle{"IDLE", false, "", 8};
  auto d = decide(sick, idle);
  CHECK(d.action == Action::kDrain);
  CHECK(d.reason == "forge-health: gpu: gpu3: xid 79: GPU has fallen off the bus");
  CHECK(decide(healthy, idle).action == Action::kNone);

  NodeState own{"IDLE+DRAIN", true, "forge-health: gpu: gpu3: xid 79", 8};
  CHECK(decide(healthy, own).action == Action::kResume);
  CHECK(decide(sick, own).action == Action::kNone);  // still sick: stays drained, first reason kept

  NodeState admin{"IDLE+DRAIN", true, "maintenance", 8};
  CHECK(decide(healthy, admin).action == Action::kNone);
  CHECK(decide(sick, admin).action == Action::kNone);
  NodeState sneaky{"MIXED+DRAIN", true, "maintenance: forge-health: gpu", 8};
  CHECK(decide(healthy, sneaky).action == Action::kNone);
  // A skipped check never drains.
  CHECK(decide({{"stale_processes", Status::kSkip, "squeue failed"}}, idle).action == Action::kNone);
}

TEST_CASE(
    "reasons: details from logs are sanitized: one line, no quotes, shell or format characters, bounded") {
  CHECK(sanitize_detail("xid 79: GPU has fallen off the bus") == "xid 79: GPU has fallen off the bus");
  CHECK(sanitize_detail("line one\nline two\r\n\t  three") == "line one line two three");
  CHECK(sanitize_detail("\"quoted\" $(rm -rf /) `id` %s%n; a|b & c > d \\x") ==
        "_quoted_ _(rm -rf /) _id_ _s_n_ a_b _ c _ d _x");
  CHECK(sanitize_detail("caf\xc3\xa9") == "caf__");
  CHECK(sanitize_detail("") == "no detail");
  const std::string long_text(500, 'a');
  CHECK(sanitize_detail(long_text).size() == 160);
  CHECK(sanitize_detail(long_text).substr(157) == "...");
  CHECK(sanitize_check("GPU") == "gpu");
  CHECK(sanitize_check("node_lost; rm") == "node_lostrm");
  CHECK(sanitize_check("$%") == "");
  CHECK(make_reason("gpu", "a\nb") == "forge-health: gpu: a b");
  CHECK(is_own_reason(make_reason("x", "y")));
}

TEST_CASE("scontrol show node: state, reason without Slurm's [user@time], gres gpu count") {
  const auto s = parse_scontrol_node(
      "NodeName=node4 Arch=x86_64 CPUTot=16 Gres=gpu:8 NodeAddr=127.0.0.5 State=IDLE+DRAIN ThreadsPerCore=1 "
      "Reason=forge-health: gpu: gpu3: xid 79 [root@2026-12-01T13:46:26]");
  CHECK(s.state == "IDLE+DRAIN");
  CHECK(s.drain);
  CHECK(s.reason == "forge-health: gpu: gpu3: xid 79");
  CHECK(s.gres_gpus == 8);
  const auto idle = parse_scontrol_node("NodeName=n1 Gres=(null) State=MIXED Partitions=gpu");
  CHECK_FALSE(idle.drain);
  CHECK(idle.reason.empty());
  CHECK(idle.gres_gpus == -1);
  CHECK(parse_gres_gpus("gpu:h100:4(S:0-1),gpu:a100:2,shard:8") == 6);
  CHECK_THROWS_AS(parse_scontrol_node("Node x not found"), Error);
}

TEST_CASE("config: unknown check names give one warning each and are never run; bad values name file:line") {
  const std::string path = write_temp("health.ini",
                                      "[modes]\n"
                                      "quick = gpu, gpuu, memory, gpu\n"
                                      "periodic = bogus\n"
                                      "[memory]\n"
                                      "min_available_mib = 2048\n");
  const LoadedConfig l = load_health_config(path);
  CHECK(l.config.min_available_mib == 2048);
  std::vector<std::string> warnings;
  CHECK(resolve_checks(l, Mode::kQuick, warnings) == std::vector<std::string>{"gpu", "memory"});
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] ==
        path +
            ":2: modes.quick: unknown check 'gpuu' ignored, did you mean 'gpu'? (known: gpu, disk, "
            "memory, munge, clock, stale_processes)");
  warnings.clear();
  CHECK(resolve_checks(l, Mode::kPeriodic, warnings).empty());
  CHECK(warnings.size() == 1);
  warnings.clear();
  CHECK(resolve_checks(l, Mode::kDeep, warnings) == default_checks(Mode::kDeep));
  CHECK(warnings.empty());

  const std::string bad = write_temp("bad.ini", "[disk]\nmin_free_inodes_percent = 150\n");
  try {
    load_health_config(bad);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kUsage);
    CHECK(std::string(e.what()) ==
          bad + ":2: disk.min_free_inodes_percent = 150: must be a percentage, 0 to 100");
  }
  const std::string example = forge::test::source_path("configs/health.example.ini");
  const LoadedConfig ex = load_health_config(example);
  for (const Mode m : {Mode::kQuick, Mode::kPeriodic, Mode::kDeep}) {
    warnings.clear();
    resolve_checks(ex, m, warnings);
    CHECK(warnings.empty());
  }
}

TEST_CASE("the mode table: quick writes nothing and scans no processes; deep has every check") {
  CHECK(default_checks(Mode::kQuick) == std::vector<std::string>{"gpu", "disk", "memory", "munge", "clock"});
  CHECK(default_checks(Mode::kPeriodic) == default_checks(Mode::kQuick));
  CHECK(default_checks(Mode::kDeep).size() == kChecks.size());
  CHECK_THROWS_AS(parse_mode("slow"), Error);
}

TEST_CASE("check_node: drains with the reason, resumes its own drain, leaves an admin's drain alone") {
  LoadedConfig l = dev_config();
  FakeProbes p = healthy_node();
  FakeSlurm slurm;
  slurm.install(p);
  auto r = check_node(l, Mode::kQuick, "node4", true, p);
  CHECK(r.healthy());
  CHECK(slurm.updates.empty());

  p.files["/gpu-health/node4/gpu5"] = "xid 79: GPU has fallen off the bus";
  r = check_node(l, Mode::kQuick, "node4", true, p);
  CHECK_FALSE(r.healthy());
  CHECK(r.acted);
  REQUIRE(slurm.updates.size() == 1);
  CHECK(slurm.updates[0] ==
        "NodeName=node4 State=DRAIN Reason=forge-health: gpu: gpu5: xid 79: GPU has fallen off the bus");
  // Still sick: nothing more.
  r = check_node(l, Mode::kQuick, "node4", true, p);
  CHECK(slurm.updates.size() == 1);

  p.files.erase("/gpu-health/node4/gpu5");
  r = check_node(l, Mode::kPeriodic, "node4", true, p);
  CHECK(r.decision.action == Action::kResume);
  CHECK(slurm.updates.back() == "NodeName=node4 State=RESUME");

  slurm.state = "IDLE+DRAIN";
  slurm.reason = "maintenance";
  const size_t n = slurm.updates.size();
  r = check_node(l, Mode::kPeriodic, "node4", true, p);
  CHECK(r.healthy());
  CHECK(slurm.updates.size() == n);
  CHECK(r.decision.message == "drained by someone else ('maintenance'): left drained");
}

TEST_CASE("check_node: an admin drain made while the checks ran is not overwritten") {
  LoadedConfig l = dev_config();
  FakeProbes p = healthy_node();
  FakeSlurm slurm;
  slurm.admin_drains_during_checks = true;
  slurm.install(p);
  p.files["/gpu-health/node4/gpu0"] = "ecc";
  const auto r = check_node(l, Mode::kQuick, "node4", true, p);
  CHECK_FALSE(r.healthy());
  CHECK(slurm.updates.empty());
  CHECK(slurm.reason == "maintenance");
}

TEST_CASE("check_node: an unknown check warns and never drains; --no-drain only reports") {
  const std::string path =
      write_temp("unknown.ini", "[modes]\nquick = gpu, no_such_check\n[gpu]\nfake_dir = /gpu-health\n");
  LoadedConfig l = load_health_config(path);
  FakeProbes p = healthy_node();
  FakeSlurm slurm;
  slurm.install(p);
  auto r = check_node(l, Mode::kQuick, "node4", true, p);
  CHECK(r.healthy());
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0].find("unknown check 'no_such_check' ignored") != std::string::npos);
  CHECK(r.results.size() == 1);
  CHECK(slurm.updates.empty());

  p.files["/gpu-health/node4/gpu1"] = "fault";
  r = check_node(l, Mode::kQuick, "node4", false, p);
  CHECK(r.decision.action == Action::kDrain);
  CHECK_FALSE(r.acted);
  CHECK(slurm.updates.empty());
}

TEST_CASE("check_node: a node Slurm does not know is a usage error") {
  LoadedConfig l = dev_config();
  FakeProbes p = healthy_node();
  FakeSlurm slurm;
  slurm.install(p);
  try {
    check_node(l, Mode::kQuick, "node9", true, p);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kUsage);
    CHECK(
        std::string(e.what()) ==
        "--node node9: Slurm has no such node (scontrol exit 1: Node node9 not found); give its Slurm name");
  }
}

TEST_CASE("check_node: without the node's state it may drain but never resume") {
  LoadedConfig l = dev_config();
  FakeProbes p = healthy_node();
  FakeSlurm slurm;
  slurm.install(p);
  slurm.state = "IDLE+DRAIN";
  slurm.reason = "forge-health: gpu: old";
  p.handlers["scontrol"] = [&, inner = p.handlers["scontrol"]](const std::vector<std::string>& a,
                                                               const std::string& in) {
    if (a.at(1) == "show") return failed_with(1, "slurm_load_node error: Unable to contact slurm controller");
    return inner(a, in);
  };
  auto r = check_node(l, Mode::kPeriodic, "node4", true, p);
  CHECK(r.healthy());
  CHECK(r.decision.action == Action::kNone);
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0].find("cannot read node node4's state") != std::string::npos);
  p.files["/gpu-health/node4/gpu1"] = "fault";
  r = check_node(l, Mode::kPeriodic, "node4", true, p);
  CHECK(r.acted);
  CHECK(slurm.updates.back() == "NodeName=node4 State=DRAIN Reason=forge-health: gpu: gpu1: fault");
}

TEST_CASE("drain command: sanitized reason; an existing drain keeps its reason") {
  FakeProbes p;
  FakeSlurm slurm;
  slurm.install(p);
  CHECK(drain_command("node4", "gpu", "CUDA error: \"unspecified launch failure\"\nat rank 3; $(reboot)", p,
                      5) ==
        "node4: drained: forge-health: gpu: CUDA error: _unspecified launch failure_ at rank 3_ _(reboot)");
  CHECK(drain_command("node4", "node_lost", "again", p, 5).find("already drained") != std::string::npos);
  CHECK(slurm.updates.size() == 1);
  // --down on a drained node: DOWN, with the drain's reason.
  slurm.state = "IDLE+DRAIN";
  slurm.reason = "forge-health: gpu: old";
  CHECK(drain_command("node4", "node_lost", "gone", p, 5, true) == "node4: down: forge-health: gpu: old");
  CHECK(slurm.updates.back() == "NodeName=node4 State=DOWN Reason=forge-health: gpu: old");
  CHECK_THROWS_AS(drain_command("node4", "%%", "x", p, 5), Error);
  try {
    drain_command("node9", "gpu", "x", p, 5);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kUsage);
  }
}

TEST_CASE("environment: the dev cluster's fake GPU directory and munge socket") {
  HealthConfig cfg;
  FakeProbes p;
  p.env["FORGE_DEVCLUSTER_DIR"] = "/dev-cluster";
  p.dirs.insert("/dev-cluster/gpu-health");
  p.files["/dev-cluster/run/munge/munge.socket"] = "";
  apply_environment(cfg, p);
  CHECK(cfg.fake_gpu_dir == "/dev-cluster/gpu-health");
  CHECK(cfg.munge_socket == "/dev-cluster/run/munge/munge.socket");
  HealthConfig given;
  given.munge_socket = "/configured";
  p.env["FORGE_HEALTH_GPU_DIR"] = "/elsewhere";
  apply_environment(given, p);
  CHECK(given.munge_socket == "/configured");
  CHECK(given.fake_gpu_dir == "/elsewhere");
}
