// The node health checks: each one a function of the configuration, the node and the probes, returning
// {check, status, detail}. Which checks run in which mode is kDefaultModes (docs/HEALTH.md).
#pragma once

#include "forge/health/probes.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::health {

// quick: Slurm's Prolog, must stay well under 2 s (no clock-sync query, no disk writes, no process scan).
// periodic: HealthCheckProgram. deep: after a failure (Epilog) or by hand: adds the disk write/read test
// and the stale-process scan.
enum class Mode { kQuick, kPeriodic, kDeep };
std::string_view mode_name(Mode mode);
// "quick", "periodic" or "deep"; anything else is forge::Error(kUsage).
Mode parse_mode(std::string_view name);

enum class Status { kPass, kFail, kSkip };  // skip: not applicable here, or not decidable; never drains

struct CheckResult {
  std::string check;
  Status status = Status::kPass;
  std::string detail;  // why it failed or was skipped; what was seen when it passed
};

struct HealthConfig {
  // Check names per mode, as configured (may name unknown checks: resolve_checks warns about them).
  std::vector<std::string> quick, periodic, deep;
  // gpu
  int expected_gpus = -1;  // -1: the node's gres gpu count (scontrol), else this many
  std::string nvidia_smi = "nvidia-smi";
  std::string fake_gpu_dir;    // dev cluster: <dir>/<node>/gpu<i>; used only without nvidia-smi
  int64_t xid_window_s = 600;  // Xid records older than this are history, not a current fault
  std::vector<int> fatal_xids = {48, 61, 62, 64, 68, 69, 74, 79, 92, 95, 119, 120, 140};
  // disk: roots that are "" are not checked
  std::string run_root, checkpoint_root, tmp_root = "/tmp";
  int64_t min_free_mib = 1024;
  double min_free_inodes_percent = 1.0;
  // memory
  int64_t min_available_mib = 1024;
  // munge: "" = $MUNGE_SOCKET, else the dev cluster's socket if it exists, else munge's default
  std::string munge_socket;
  // clock
  bool require_sync = true;  // fail when chronyc/timedatectl answer "not synchronised"
  int64_t build_epoch = 0;   // the clock must not be before this (default: this program's build date)
  // stale_processes
  bool kill_stale = false;
  // seconds each external command may take
  double command_timeout_s = 10, quick_command_timeout_s = 1;
};

// What the checks know about the node besides the probes.
struct CheckContext {
  const HealthConfig* config = nullptr;
  std::string node;
  Mode mode = Mode::kPeriodic;
  int gres_gpus = -1;  // from scontrol, -1 when unknown
  // The time each external command may take in this mode.
  double timeout_s() const;
};

using CheckFn = CheckResult (*)(const CheckContext&, Probes&);
struct CheckInfo {
  std::string_view name;
  CheckFn run;
  bool quick, periodic, deep;  // the default modes (kDefaultModes)
};
extern const std::array<CheckInfo, 6> kChecks;
const CheckInfo* find_check(std::string_view name);
// The default check list of a mode, from kChecks.
std::vector<std::string> default_checks(Mode mode);

CheckResult check_gpu(const CheckContext& ctx, Probes& probes);
CheckResult check_disk(const CheckContext& ctx, Probes& probes);
CheckResult check_memory(const CheckContext& ctx, Probes& probes);
CheckResult check_munge(const CheckContext& ctx, Probes& probes);
CheckResult check_clock(const CheckContext& ctx, Probes& probes);
CheckResult check_stale_processes(const CheckContext& ctx, Probes& probes);

// Runs the named checks (unknown names are skipped here; config.h reports them). A check that throws
// becomes a skip naming the error: a bug in a check must not drain a node.
std::vector<CheckResult> run_checks(const std::vector<std::string>& names, const CheckContext& ctx,
                                    Probes& probes);

// Pure parsers, exposed for the tests.
// MemAvailable in KiB from /proc/meminfo text; nullopt if absent.
std::optional<int64_t> parse_mem_available_kib(std::string_view meminfo);
// Fatal Xid records of the kernel log within `window_s` before `uptime_s`: "xid 79 (PCI:0000:3b:00): ...".
std::vector<std::string> recent_xids(const std::vector<std::string>& kmsg, double uptime_s, int64_t window_s,
                                     const std::vector<int>& fatal);
// The epoch second of a __DATE__ string ("Dec  1 2026"), 0 if it does not parse.
int64_t parse_build_date(std::string_view date);

}  // namespace forge::health
