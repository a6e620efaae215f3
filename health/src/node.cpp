#include "forge/health/node.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <fmt/format.h>

namespace forge::health {
namespace {

// The value of " Key=" in a `scontrol show node -o` line, up to the next space ("" if absent).
std::string field(std::string_view line, std::string_view key) {
  // Built by append: GCC 12's -Wrestrict misfires on `" " + std::string(...)`.
  std::string padded(1, ' '), needle(1, ' ');
  padded.append(line);
  needle.append(key).append(1, '=');
  const size_t at = padded.find(needle);
  if (at == std::string::npos) return "";
  const size_t start = at + needle.size();
  const size_t end = padded.find(' ', start);
  return padded.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

bool safe_char(char c) {
  if (c >= 'a' && c <= 'z') return true;
  if (c >= 'A' && c <= 'Z') return true;
  if (c >= '0' && c <= '9') return true;
  // No quotes, '%' (format strings), '$', '`', '\\', ';', '|', '&', '<', '>', '*', '?', '!', '{', '}'.
  return std::string_view(" .,:_-+=/@()[]#~^").find(c) != std::string_view::npos;
}

}  // namespace

int parse_gres_gpus(std::string_view gres) {
  int total = -1;
  for (const auto& item : split_list(gres, ',')) {
    if (item.rfind("gpu", 0) != 0) continue;
    std::string_view s = item;
    s = s.substr(0, s.find('('));  // "(S:0-1)" socket binding
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) continue;
    const auto n = parse_int(s.substr(colon + 1));
    if (!n || *n < 0) continue;
    total = (total < 0 ? 0 : total) + static_cast<int>(*n);
  }
  return total;
}

NodeState parse_scontrol_node(std::string_view line) {
  NodeState s;
  s.state = field(line, "State");
  if (s.state.empty()) fail(ExitCode::kComm, "scontrol show node: no State= in '{}'", printable(line, 80));
  s.drain = s.state.find("DRAIN") != std::string::npos;
  s.gres_gpus = parse_gres_gpus(field(line, "Gres"));
  // Reason= is the last field and may hold spaces; Slurm appends " [user@time]".
  const size_t at = line.find(" Reason=");
  if (at != std::string_view::npos) {
    std::string reason = trim(line.substr(at + 8));
    const size_t bracket = reason.rfind(" [");
    if (bracket != std::string::npos && reason.back() == ']' &&
        reason.find('@', bracket) != std::string::npos)
      reason = trim(reason.substr(0, bracket));
    s.reason = reason;
  }
  return s;
}

std::string sanitize_detail(std::string_view text, size_t max) {
  std::string out;
  bool space = false;
  for (const char c : text) {
    const bool blank = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (blank) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += safe_char(c) ? c : '_';
  }
  if (out.size() > max) {
    out.resize(max > 3 ? max - 3 : 0);
    out.append("...");
  }
  return out.empty() ? "no detail" : out;
}

std::string sanitize_check(std::string_view name) {
  std::string out;
  for (const char c : name) {
    const char l = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '_' || l == '-') out += l;
    if (out.size() == 32) break;
  }
  return out;
}

std::string make_reason(std::string_view check, std::string_view detail) {
  const std::string c = sanitize_check(check);
  return fmt::format("{} {}: {}", kReasonPrefix, c.empty() ? "unknown" : c, sanitize_detail(detail));
}

bool is_own_reason(std::string_view reason) {
  return reason.substr(0, kReasonPrefix.size()) == kReasonPrefix;
}

Decision decide(const std::vector<CheckResult>& results, const NodeState& node) {
  const CheckResult* bad = nullptr;
  for (const auto& r : results)
    if (r.status == Status::kFail) {
      bad = &r;
      break;
    }
  Decision d;
  if (bad) {
    if (node.drain) {
      d.message = is_own_reason(node.reason)
                      ? fmt::format("already drained by forge-health ({}); reason kept", node.reason)
                      : fmt::format("already drained by someone else ('{}'); their reason kept", node.reason);
      return d;
    }
    d.action = Action::kDrain;
    d.reason = make_reason(bad->check, bad->detail);
    d.message = "drain: " + d.reason;
    return d;
  }
  if (node.drain && is_own_reason(node.reason)) {
    d.action = Action::kResume;
    d.message = fmt::format("resume: healthy again (was '{}')", node.reason);
    return d;
  }
  if (node.drain) d.message = fmt::format("drained by someone else ('{}'): left drained", node.reason);
  return d;
}

}  // namespace forge::health
