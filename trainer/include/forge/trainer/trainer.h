// One process's training loop pieces: the model, AdamW, schedule, clipping and gradient accumulation
// over micro-batches, behind a single step().
#pragma once

#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"
#include "forge/trainer/spec.h"

#include <cstdint>
#include <span>
#include <vector>

namespace forge::trainer {

// Token rows of seq_len + 1 as model input: row r's first seq_len tokens go to inputs[r * seq_len ..], its
// last seq_len (the next-token targets) to targets[r * seq_len ..].
void split_rows(const int32_t* rows, size_t count, int seq_len, int32_t* inputs, int32_t* targets);

struct StepStats {
  int64_t step = 0;      // 1-based index of the step just taken
  double loss = 0;       // mean over the step's micro-batches
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double seconds = 0;
  int64_t tokens = 0;  // trained tokens in this step
  // False when the loss or the gradient norm is NaN/Inf: the update was dropped (weights and optimizer
  // moments unchanged) but the step still counts (its data is consumed and the schedule advances). The
  // guard (guard.h) decides what happens next. Must be the same on every rank.
  bool finite = true;
  // Where the step's time went (parallel runs; 0 in one process): exposed communication (time blocked
  // on tensor/data-parallel collectives), pipeline bubble (time blocked on the neighbouring stages), and
  // the bytes this rank sent.
  double comm_s = 0;
  double bubble_s = 0;
  uint64_t comm_bytes = 0;
};

class Trainer {
 public:
  // Builds and initializes the model from spec.seed and sets the thread counts.
  explicit Trainer(const TrainSpec& spec);

  GPT& model() { return model_; }
  AdamW& optimizer() { return optimizer_; }
  int64_t steps_taken() const { return optimizer_.steps_taken(); }
  // Token ids one step consumes: microbatches x batch x (seq_len + 1); row r's inputs are its first
  // seq_len tokens and its targets the last seq_len.
  size_t tokens_per_step() const;

  // Accumulates gradients over the micro-batches (mean loss), clips, and applies AdamW at the
  // scheduled learning rate. A non-finite loss or gradient norm returns finite = false without
  // changing weights or moments (StepStats). Marks "forward_backward" and "optimizer" (progress.h).
  StepStats step(std::span<const int32_t> tokens);

  // Testing hook (guard.inject_nan_step): the next step's loss is NaN, as if it had overflowed.
  void inject_nan_once() { inject_nan_ = true; }

 private:
  TrainSpec spec_;
  int threads_;  // set (OpenMP, OpenBLAS) before the model's buffers exist
  GPT model_;
  AdamW optimizer_;
  std::vector<int32_t> inputs_, targets_;
  bool inject_nan_ = false;
};

}  // namespace forge::trainer
