// Operations on a run's checkpoint tree outside the training loop: promotion to the release tier (by
// the evaluation gate) and garbage collection.
#pragma once

#include "forge/common/json.h"

#include <string>
#include <vector>

namespace forge::ckpt {

// Verifies the checkpoint, then commits a copy as <run>/checkpoints/release/step-N/ (data files
// hard-linked when on the same filesystem, else copied and fsynced) whose manifest records the source
// and the gate's verdict. The source stays locked (retention skips it) until the copy is committed.
// Throws forge::Error(kUsage) when that release exists already, kData when the source is damaged.
// Returns the release directory.
std::string promote(const std::string& checkpoint_dir, const Json& verdict);

struct GcReport {
  std::vector<std::string> removed;  // (dry run: would be removed)
  std::vector<std::string> in_use;   // garbage or retention victims left because a process holds them
  std::string newest_valid;          // protected from retention; empty when no checkpoint verifies
};

// Removes crash leftovers nobody holds (".step-N.partial-*" staging directories, ".trash-*", step-N
// directories without COMMITTED), then applies retention; the newest checkpoint that verifies is never
// removed.
GcReport collect_garbage(const std::string& run_dir, int recovery_keep, bool dry_run);

}  // namespace forge::ckpt
