// The decisions of the checkpoint tiers as pure functions: when a save is due, which checkpoints
// retention removes, in which order a resume tries them, and the Young/Daly interval advice.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace forge::ckpt {

enum class Tier { kRecovery, kMilestone, kRelease };
std::string_view tier_name(Tier tier);   // "recovery", "milestone", "release"
Tier parse_tier(std::string_view name);  // throws forge::Error(kUsage)

struct TierPolicy {
  int64_t recovery_every = 0;   // steps; 0: off
  double recovery_every_s = 0;  // seconds; 0: off
  int recovery_keep = 3;        // newest recovery checkpoints kept (>= 1)
  int64_t milestone_every = 0;  // steps; 0: off
};

enum class Due { kNone, kRecovery, kMilestone };

// What to save after `step` completed. A milestone also serves as the recovery point, so a step due for
// both saves a milestone. The time trigger compares seconds since the last recovery/milestone save: on
// several ranks the clocks differ, so the launcher decides on one rank and broadcasts the answer.
Due due_at(const TierPolicy& policy, int64_t step, int64_t last_saved_step, double seconds_since_save);

struct CkptRef {
  Tier tier = Tier::kRecovery;
  int64_t step = 0;
  bool locked = false;  // being read or promoted (a process holds its lock)
  bool operator==(const CkptRef&) const = default;
};

// Committed checkpoints retention deletes: recovery checkpoints beyond the newest `recovery_keep`, but
// never a locked one nor `newest_valid` (the newest checkpoint known to verify). Milestones and releases
// are never deleted.
std::vector<CkptRef> retention_victims(const std::vector<CkptRef>& committed, int recovery_keep,
                                       std::optional<CkptRef> newest_valid);

// Resume candidates, newest first: recovery and milestone checkpoints (never release), a milestone
// before a recovery checkpoint of the same step.
std::vector<CkptRef> resume_order(const std::vector<CkptRef>& committed);

// Young/Daly: the recovery interval that minimises expected lost time, sqrt(2 * C * MTBF), for a save
// that stalls training C seconds and a mean time between failures MTBF.
double young_daly_interval_s(double stall_s, double mtbf_s);

// Expected fraction of run time lost with interval T (first order): the stalls C/T plus the work redone
// after a failure, on average T/2 per failure, plus the restart time R per failure.
double expected_waste(double interval_s, double stall_s, double mtbf_s, double restart_s = 0);

}  // namespace forge::ckpt
