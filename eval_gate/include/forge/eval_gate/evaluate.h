// Evaluating a checkpoint on a dataset's held-out validation split, per data domain. Data parallel over
// the ranks of `comm` (forge-train's bootstrap and communicator): rank r takes sequences r, r + size, ...
// and the statistics are summed.
#pragma once

#include "forge/eval_gate/stats.h"
#include "forge/trainer/comm.h"

#include <cstdint>
#include <string>

namespace forge::gate {

struct EvalOptions {
  int64_t max_sequences = 0;  // per domain; 0 = the whole validation split
  int threads = 0;            // 0: SLURM_CPUS_PER_TASK or all cores
};

// Loads the checkpoint's model (its manifest's model config) and evaluates it. Throws forge::Error:
// kData when the checkpoint is damaged or was trained on another dataset version, or the dataset lacks
// a validation split; kUsage when the dataset's vocabulary does not fit the model.
DomainResults evaluate_checkpoint(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                  const EvalOptions& options, trainer::Comm& comm);

}  // namespace forge::gate
