#include "forge/ckpt/policy.h"

#include "forge/common/error.h"

#include <algorithm>
#include <cmath>

namespace forge::ckpt {

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kRecovery:
      return "recovery";
    case Tier::kMilestone:
      return "milestone";
    case Tier::kRelease:
      return "release";
  }
  return "unknown";
}

Tier parse_tier(std::string_view name) {
  for (Tier t : {Tier::kRecovery, Tier::kMilestone, Tier::kRelease})
    if (tier_name(t) == name) return t;
  fail(ExitCode::kUsage, "unknown checkpoint tier '{}': use recovery, milestone or release", name);
}

Due due_at(const TierPolicy& policy, int64_t step, int64_t last_saved_step, double seconds_since_save) {
  if (step <= last_saved_step) return Due::kNone;
  if (policy.milestone_every > 0 && step % policy.milestone_every == 0) return Due::kMilestone;
  if (policy.recovery_every > 0 && step % policy.recovery_every == 0) return Due::kRecovery;
  if (policy.recovery_every_s > 0 && seconds_since_save >= policy.recovery_every_s) return Due::kRecovery;
  return Due::kNone;
}

std::vector<CkptRef> retention_victims(const std::vector<CkptRef>& committed, int recovery_keep,
                                       std::optional<CkptRef> newest_valid) {
  std::vector<CkptRef> recovery;
  for (const auto& c : committed)
    if (c.tier == Tier::kRecovery) recovery.push_back(c);
  std::sort(recovery.begin(), recovery.end(),
            [](const CkptRef& a, const CkptRef& b) { return a.step > b.step; });
  std::vector<CkptRef> victims;
  const size_t keep = static_cast<size_t>(std::max(recovery_keep, 1));
  for (size_t i = keep; i < recovery.size(); ++i) {
    const CkptRef& c = recovery[i];
    if (c.locked) continue;
    if (newest_valid && newest_valid->tier == c.tier && newest_valid->step == c.step) continue;
    victims.push_back(c);
  }
  return victims;
}

std::vector<CkptRef> resume_order(const std::vector<CkptRef>& committed) {
  std::vector<CkptRef> out;
  for (const auto& c : committed)
    if (c.tier != Tier::kRelease) out.push_back(c);
  std::sort(out.begin(), out.end(), [](const CkptRef& a, const CkptRef& b) {
    if (a.step != b.step) return a.step > b.step;
    return a.tier == Tier::kMilestone && b.tier != Tier::kMilestone;
  });
  return out;
}

double young_daly_interval_s(double stall_s, double mtbf_s) {
  if (!(stall_s > 0) || !(mtbf_s > 0))
    fail(ExitCode::kUsage, "the Young/Daly interval needs a positive save stall and MTBF (got {} s and {} s)",
         stall_s, mtbf_s);
  return std::sqrt(2.0 * stall_s * mtbf_s);
}

double expected_waste(double interval_s, double stall_s, double mtbf_s, double restart_s) {
  if (!(interval_s > 0) || !(mtbf_s > 0))
    fail(ExitCode::kUsage, "the expected waste needs a positive interval and MTBF (got {} s and {} s)",
         interval_s, mtbf_s);
  return stall_s / interval_s + (interval_s / 2.0 + restart_s) / mtbf_s;
}

}  // namespace forge::ckpt
