#include "forge/health/config.h"

#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/text.h"

#include <algorithm>

namespace forge::health {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

ConfigSchema schema() {
  const HealthConfig d;
  ConfigSchema s;
  s.add<std::string>("modes.quick", join(default_checks(Mode::kQuick)), "checks of the Prolog")
      .add<std::string>("modes.periodic", join(default_checks(Mode::kPeriodic)),
                        "checks of HealthCheckProgram")
      .add<std::string>("modes.deep", join(default_checks(Mode::kDeep)), "checks after a failure")
      .add<int>("gpu.expected", d.expected_gpus, "GPUs the node must have; -1: its gres gpu count")
      .add<std::string>("gpu.nvidia_smi", d.nvidia_smi, "nvidia-smi program")
      .add<std::string>("gpu.fake_dir", "", "dev cluster: <dir>/<node>/gpu<i> health files")
      .add<int64_t>("gpu.xid_window_s", d.xid_window_s, "seconds an Xid counts as current")
      .add<std::string>("gpu.fatal_xids", "48, 61, 62, 64, 68, 69, 74, 79, 92, 95, 119, 120, 140",
                        "Xid codes that make a GPU unhealthy")
      .add<std::string>("disk.run_root", "", "run directories' file system")
      .add<std::string>("disk.checkpoint_root", "", "checkpoints' file system")
      .add<std::string>("disk.tmp_root", d.tmp_root, "node-local scratch")
      .add<int64_t>("disk.min_free_mib", d.min_free_mib, "free MiB each root must have")
      .add<double>("disk.min_free_inodes_percent", d.min_free_inodes_percent, "free inodes, percent")
      .add<int64_t>("memory.min_available_mib", d.min_available_mib, "MemAvailable floor, MiB")
      .add<std::string>("munge.socket", "", "munged socket")
      .add<bool>("clock.require_sync", d.require_sync, "fail when NTP says not synchronised")
      .add<bool>("stale_processes.kill", d.kill_stale, "deep mode kills stale job processes")
      .add<double>("general.command_timeout_s", d.command_timeout_s, "seconds per external command")
      .add<double>("general.quick_command_timeout_s", d.quick_command_timeout_s,
                   "seconds per external command in quick mode");
  return s;
}

}  // namespace

LoadedConfig load_health_config(const std::string& path) {
  const Config c = load_config(schema(), path, {});
  LoadedConfig out;
  out.path = path;
  HealthConfig& h = out.config;
  const std::array<const char*, 3> keys = {"modes.quick", "modes.periodic", "modes.deep"};
  std::array<std::vector<std::string>*, 3> lists = {&h.quick, &h.periodic, &h.deep};
  for (size_t i = 0; i < keys.size(); ++i) {
    *lists[i] = split_list(c.get<std::string>(keys[i]));
    out.mode_source[i] = c.source(keys[i]);
  }
  h.expected_gpus = c.get<int>("gpu.expected");
  if (h.expected_gpus < -1) c.reject("gpu.expected", "must be -1 (the node's gres gpu count) or >= 0");
  h.nvidia_smi = c.get<std::string>("gpu.nvidia_smi");
  h.fake_gpu_dir = c.get<std::string>("gpu.fake_dir");
  h.xid_window_s = c.get<int64_t>("gpu.xid_window_s");
  if (h.xid_window_s < 0) c.reject("gpu.xid_window_s", "must be >= 0 (0: every Xid since boot)");
  h.fatal_xids.clear();
  for (const auto& x : split_list(c.get<std::string>("gpu.fatal_xids"))) {
    const auto v = parse_int(x);
    if (!v || *v <= 0 || *v > 100000)
      c.reject("gpu.fatal_xids", "expected a comma-separated list of Xid numbers");
    h.fatal_xids.push_back(static_cast<int>(*v));
  }
  h.run_root = c.get<std::string>("disk.run_root");
  h.checkpoint_root = c.get<std::string>("disk.checkpoint_root");
  h.tmp_root = c.get<std::string>("disk.tmp_root");
  h.min_free_mib = c.get<int64_t>("disk.min_free_mib");
  if (h.min_free_mib < 0) c.reject("disk.min_free_mib", "must be >= 0");
  h.min_free_inodes_percent = c.get<double>("disk.min_free_inodes_percent");
  if (!(h.min_free_inodes_percent >= 0 && h.min_free_inodes_percent <= 100))
    c.reject("disk.min_free_inodes_percent", "must be a percentage, 0 to 100");
  h.min_available_mib = c.get<int64_t>("memory.min_available_mib");
  if (h.min_available_mib < 0) c.reject("memory.min_available_mib", "must be >= 0");
  h.munge_socket = c.get<std::string>("munge.socket");
  h.require_sync = c.get<bool>("clock.require_sync");
  h.kill_stale = c.get<bool>("stale_processes.kill");
  h.command_timeout_s = c.get<double>("general.command_timeout_s");
  if (!(h.command_timeout_s > 0 && h.command_timeout_s <= 60))
    c.reject("general.command_timeout_s", "must be > 0 and <= 60 (Slurm kills HealthCheckProgram at 60 s)");
  h.quick_command_timeout_s = c.get<double>("general.quick_command_timeout_s");
  if (!(h.quick_command_timeout_s > 0 && h.quick_command_timeout_s <= 2))
    c.reject("general.quick_command_timeout_s", "must be > 0 and <= 2 (the Prolog's budget)");
  return out;
}

std::vector<std::string> resolve_checks(const LoadedConfig& loaded, Mode mode,
                                        std::vector<std::string>& warnings) {
  const HealthConfig& h = loaded.config;
  const std::vector<std::string>& names = mode == Mode::kQuick      ? h.quick
                                          : mode == Mode::kPeriodic ? h.periodic
                                                                    : h.deep;
  std::vector<std::string> known_names;
  for (const auto& c : kChecks) known_names.emplace_back(c.name);
  std::vector<std::string> out;
  for (const auto& name : names) {
    if (find_check(name)) {
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
      continue;
    }
    const std::string where = loaded.mode_source[static_cast<size_t>(mode)];
    const std::string hint = did_you_mean(name, known_names);
    warnings.push_back(fmt::format(
        "{}: modes.{}: unknown check '{}' ignored{} (known: {})", where, mode_name(mode), printable(name),
        hint.empty() ? "" : fmt::format(", did you mean '{}'?", hint), join(known_names)));
  }
  return out;
}

}  // namespace forge::health
