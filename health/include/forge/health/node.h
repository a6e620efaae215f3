// The node's Slurm state as forge-health needs it, and the one decision made from it: drain, resume or
// leave alone. forge-health resumes only its own drains (reason "forge-health: ..."), never anyone else's.
#pragma once

#include "forge/health/checks.h"

#include <string>
#include <string_view>
#include <vector>

namespace forge::health {

inline constexpr std::string_view kReasonPrefix = "forge-health:";

struct NodeState {
  std::string state;   // "IDLE+DRAIN", "MIXED", ...
  bool drain = false;  // DRAIN flag set (draining or drained)
  std::string reason;  // without Slurm's trailing " [user@time]"
  int gres_gpus = -1;  // gpu count of Gres=, -1 if none is listed
};

// Parses one line of `scontrol show node -o NAME`; forge::Error(kComm) if it has no State=.
NodeState parse_scontrol_node(std::string_view line);
// The gpu count of a Gres= value: "gpu:8", "gpu:h100:4(S:0-1),gpu:a100:2" -> 6; "(null)" -> -1.
int parse_gres_gpus(std::string_view gres);

// Text from logs or users made safe as a Slurm reason: one line, printable ASCII without quotes, '%',
// '$', '`', backslash or other shell/format metacharacters, spaces collapsed, at most `max` bytes.
std::string sanitize_detail(std::string_view text, size_t max = 160);
// A check name as a reason field: [a-z0-9_-], at most 32 bytes; "" if nothing is left.
std::string sanitize_check(std::string_view name);
// "forge-health: <check>: <detail>", both parts sanitized.
std::string make_reason(std::string_view check, std::string_view detail);
bool is_own_reason(std::string_view reason);

enum class Action { kNone, kDrain, kResume };
struct Decision {
  Action action = Action::kNone;
  std::string reason;   // kDrain: the reason to set
  std::string message;  // one line for the log: what was decided and why
};

// Drain on the first failed check unless the node is already drained (an administrator's reason or an
// earlier forge-health reason is kept); resume only when every check passed or skipped and the drain
// reason is forge-health's own.
Decision decide(const std::vector<CheckResult>& results, const NodeState& node);

}  // namespace forge::health
