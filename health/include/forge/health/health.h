// What `forge-health check|drain|resume` do, over injected probes: read the node's Slurm state, run the
// mode's checks, decide (node.h) and act with `scontrol update`. The CLI (tools/forge_health.cpp) only
// parses options and prints.
#pragma once

#include "forge/health/config.h"
#include "forge/health/node.h"
#include "forge/health/probes.h"

#include <string>
#include <vector>

namespace forge::health {

// Fills what the configuration left empty from the environment: the fake GPU directory
// ($FORGE_HEALTH_GPU_DIR, else $FORGE_DEVCLUSTER_DIR/gpu-health when it exists) and the munge socket
// ($MUNGE_SOCKET, else $FORGE_DEVCLUSTER_DIR/run/munge/munge.socket when it exists).
void apply_environment(HealthConfig& config, Probes& probes);

struct NodeQuery {
  bool ok = false;
  bool unknown = false;  // scontrol answered: no such node
  NodeState state;
  std::string error;  // !ok: why scontrol could not tell
};
NodeQuery query_node(const std::string& node, Probes& probes, double timeout_s);
// `scontrol update NodeName=... State=DRAIN Reason=...` (argv, no shell), or State=DOWN when `down`; ""
// or the error.
std::string scontrol_drain(const std::string& node, const std::string& reason, Probes& probes,
                           double timeout_s, bool down = false);
std::string scontrol_resume(const std::string& node, Probes& probes, double timeout_s);

struct CheckReport {
  std::string node;
  Mode mode = Mode::kQuick;
  std::vector<std::string> warnings;  // unknown checks, unreadable node state
  std::vector<CheckResult> results;
  Decision decision;
  bool acted = false;        // the decision's scontrol ran and succeeded
  std::string action_error;  // it ran and failed
  bool healthy() const;      // no check failed
};

// Runs `mode`'s checks on `node`; with `act`, drains or resumes as decide() says. The node's state is read
// again just before acting, so an administrator's drain made meanwhile is never overwritten. A node Slurm
// does not know is forge::Error(kUsage); a Slurm that cannot be asked is a warning.
CheckReport check_node(const LoadedConfig& loaded, Mode mode, const std::string& node, bool act,
                       Probes& probes);

// `forge-health drain`: drains with make_reason(check, detail) unless the node is already drained (whose
// reason is kept). `down` (--down, for a node that no longer answers: the batch scripts' node_lost) marks
// it DOWN instead, drained or not, so that Slurm ends and requeues its jobs now rather than after
// SlurmdTimeout; a node that registers again returns through ReturnToService and its health checks.
// Returns the one line to print; forge::Error(kUsage) for an empty check name, kComm when scontrol fails.
std::string drain_command(const std::string& node, const std::string& check, const std::string& detail,
                          Probes& probes, double timeout_s, bool down = false);

}  // namespace forge::health
