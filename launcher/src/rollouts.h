// run.objective = grpo (docs/TRAINER.md, "Objectives"): every step's micro-batches are the policy's own
// replies to prompts of a prompt set (forge-data prepare --format prompts), sampled on the training ranks
// with the weights being trained (no copy to another process), scored by the gate's scorers
// (eval_gate/rewards.h) and turned into GRPO's advantages; the log-probabilities the loss's ratio divides
// by are recomputed under the same weights by the trainer's own forward, so that at a rollout's first
// update the ratio is exactly 1.
#pragma once

#include "data_source.h"
#include "forge/common/config.h"
#include "forge/trainer/spec.h"

#include <memory>

namespace forge::launcher {

// The rollouts of data-parallel rank `dp_rank`: checks the prompt set against the reward (65 naming the
// file and how many prompts it cannot score), the policy's format (ckpt.init_from, rl.format_dataset) and
// the sandbox when code is rewarded (69), and loads the KL's reference when rl.kl_coef > 0, before
// anything of the run is allocated. Samples nothing until set_policy.
std::unique_ptr<DataSource> open_rollouts(const Config& config, const trainer::TrainSpec& spec, int dp_rank,
                                          trainer::Backend& backend);

}  // namespace forge::launcher
