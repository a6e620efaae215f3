#include "forge/health/health.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <fmt/format.h>

namespace forge::health {
namespace {

std::string one_line(const CommandOutput& r) {
  if (r.not_found) return "scontrol not found (is Slurm's client installed and on PATH?)";
  if (r.timed_out) return "scontrol did not answer in time";
  const std::string& all = r.err.empty() ? r.out : r.err;
  const size_t start = all.find_first_not_of(" \t\r\n");
  std::string text = start == std::string::npos ? "" : trim(all.substr(start, all.find('\n', start) - start));
  return fmt::format("scontrol exit {}: {}", r.status, text.empty() ? "no message" : printable(text, 120));
}

}  // namespace

bool CheckReport::healthy() const {
  for (const auto& r : results)
    if (r.status == Status::kFail) return false;
  return true;
}

void apply_environment(HealthConfig& config, Probes& probes) {
  const std::string dev = probes.getenv("FORGE_DEVCLUSTER_DIR");
  if (config.fake_gpu_dir.empty()) {
    config.fake_gpu_dir = probes.getenv("FORGE_HEALTH_GPU_DIR");
    if (config.fake_gpu_dir.empty() && !dev.empty() && probes.is_directory(dev + "/gpu-health"))
      config.fake_gpu_dir = dev + "/gpu-health";
  }
  if (config.munge_socket.empty()) {
    config.munge_socket = probes.getenv("MUNGE_SOCKET");
    if (config.munge_socket.empty() && !dev.empty() && probes.exists(dev + "/run/munge/munge.socket"))
      config.munge_socket = dev + "/run/munge/munge.socket";
  }
}

NodeQuery query_node(const std::string& node, Probes& probes, double timeout_s) {
  NodeQuery q;
  const CommandOutput r = probes.run({"scontrol", "show", "node", "-o", node}, "", timeout_s);
  if (r.not_found || r.timed_out || r.status != 0) {
    q.error = one_line(r);
    q.unknown = !r.not_found && !r.timed_out && (r.err + r.out).find(" not found") != std::string::npos;
    return q;
  }
  const std::string line = trim(r.out.substr(0, r.out.find('\n')));
  if (line.rfind("NodeName=" + node + " ", 0) != 0) {
    q.error = fmt::format("scontrol show node {}: unexpected answer '{}'", node, printable(line, 60));
    return q;
  }
  try {
    q.state = parse_scontrol_node(line);
    q.ok = true;
  } catch (const Error& e) {
    q.error = e.what();
  }
  return q;
}

std::string scontrol_drain(const std::string& node, const std::string& reason, Probes& probes,
                           double timeout_s, bool down) {
  const CommandOutput r = probes.run(
      {"scontrol", "update", "NodeName=" + node, down ? "State=DOWN" : "State=DRAIN", "Reason=" + reason}, "",
      timeout_s);
  return r.not_found || r.timed_out || r.status != 0 ? one_line(r) : "";
}

std::string scontrol_resume(const std::string& node, Probes& probes, double timeout_s) {
  const CommandOutput r =
      probes.run({"scontrol", "update", "NodeName=" + node, "State=RESUME"}, "", timeout_s);
  return r.not_found || r.timed_out || r.status != 0 ? one_line(r) : "";
}

CheckReport check_node(const LoadedConfig& loaded, Mode mode, const std::string& node, bool act,
                       Probes& probes) {
  CheckReport report;
  report.node = node;
  report.mode = mode;
  const std::vector<std::string> names = resolve_checks(loaded, mode, report.warnings);
  CheckContext ctx;
  ctx.config = &loaded.config;
  ctx.node = node;
  ctx.mode = mode;
  // scontrol gets the command timeout of periodic mode even in quick: it is the one call whose failure
  // would leave an unhealthy node undrained.
  const double scontrol_timeout = loaded.config.command_timeout_s;
  NodeQuery q = query_node(node, probes, scontrol_timeout);
  if (q.unknown)
    fail(ExitCode::kUsage, "--node {}: Slurm has no such node ({}); give its Slurm name", node, q.error);
  if (q.ok) {
    ctx.gres_gpus = q.state.gres_gpus;
  } else {
    report.warnings.push_back(fmt::format("cannot read node {}'s state: {}", node, q.error));
  }
  report.results = run_checks(names, ctx, probes);
  // Without the node's state forge-health can still drain (an unhealthy node must not take jobs) but never
  // resume: it cannot tell its own drain from an administrator's.
  report.decision = decide(report.results, q.ok ? q.state : NodeState{});
  if (!act || report.decision.action == Action::kNone) return report;
  if (q.ok) {
    // The checks took a while: decide again on the state as it is now.
    const NodeQuery now = query_node(node, probes, scontrol_timeout);
    if (now.ok) report.decision = decide(report.results, now.state);
    if (report.decision.action == Action::kNone) return report;
  }
  report.action_error = report.decision.action == Action::kDrain
                            ? scontrol_drain(node, report.decision.reason, probes, scontrol_timeout)
                            : scontrol_resume(node, probes, scontrol_timeout);
  report.acted = report.action_error.empty();
  return report;
}

std::string drain_command(const std::string& node, const std::string& check, const std::string& detail,
                          Probes& probes, double timeout_s, bool down) {
  if (sanitize_check(check).empty())
    fail(ExitCode::kUsage, "--check '{}': expected a check name of letters, digits, '_' or '-' (e.g. gpu)",
         printable(check));
  const NodeQuery q = query_node(node, probes, timeout_s);
  if (q.unknown) fail(ExitCode::kUsage, "--node {}: Slurm has no such node ({})", node, q.error);
  if (!q.ok) fail(ExitCode::kComm, "cannot read node {}'s state: {}", node, q.error);
  if (q.state.drain && !down)
    return fmt::format("{}: already drained ('{}'); reason kept", node, q.state.reason);
  const std::string reason = q.state.drain ? q.state.reason : make_reason(check, detail);
  const std::string err = scontrol_drain(node, reason, probes, timeout_s, down);
  if (!err.empty()) fail(ExitCode::kComm, "cannot {} {}: {}", down ? "mark DOWN" : "drain", node, err);
  return fmt::format("{}: {}: {}", node, down ? "down" : "drained", reason);
}

}  // namespace forge::health
