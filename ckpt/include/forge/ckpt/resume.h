// Choosing the checkpoint a job resumes from: the newest committed recovery or milestone checkpoint
// whose files all verify, falling back to older ones with a log line naming what is damaged.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/coordinator.h"

#include <optional>
#include <string>

namespace forge::ckpt {

// Collective. Every rank verifies a share of each candidate's files; rank 0 decides, so all ranks open
// the same checkpoint. Nothing when the run has no valid checkpoint (a fresh start). Throws
// forge::Error(kUsage/kData) when the chosen checkpoint does not meet `expect` (another model config or
// dataset): resuming from an older one would be just as wrong. After loading, the launcher runs the
// verification step from manifest().meta.verification and compares the loss.
std::optional<Checkpoint> open_for_resume(Coordinator& coord, const std::string& run_dir,
                                          const Expectations& expect);

}  // namespace forge::ckpt
