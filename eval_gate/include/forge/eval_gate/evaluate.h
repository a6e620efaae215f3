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
  // How sequences are read and scored (as_trained): packed documents with their boundaries, and only the
  // replies a chat dataset's loss mask marks (a fine-tuned model's held-out masked loss).
  bool document_mask = false;
  bool replies_only = false;
};

// `options` with the reading and scoring the checkpoint's run trained with (its spec's data.document_mask
// and run.objective). The gate measures the candidate and its baseline (e.g. the model it was fine-tuned
// from) alike, the candidate's way.
EvalOptions as_trained(const std::string& checkpoint_dir, EvalOptions options);

// Loads the checkpoint's model (its manifest's model config) and evaluates it. With `own_dataset` the
// checkpoint must have been trained on this dataset version (the candidate); a baseline may come from
// another (the parent of a fine-tune), with the same tokenizer. Throws forge::Error: kData when the
// checkpoint is damaged or (own_dataset) was trained on another dataset version, or the dataset lacks a
// validation split; kUsage when the dataset's vocabulary does not fit the model.
DomainResults evaluate_checkpoint(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                  const EvalOptions& options, trainer::Comm& comm, bool own_dataset = true);

}  // namespace forge::gate
