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

struct StepStats {
  int64_t step = 0;      // 1-based index of the step just taken
  double loss = 0;       // mean over the step's micro-batches
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double seconds = 0;
  int64_t tokens = 0;  // trained tokens in this step
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
  // scheduled learning rate. A non-finite loss or gradient norm throws forge::Error(kNumeric) naming
  // the step, before the weights change.
  StepStats step(std::span<const int32_t> tokens);

 private:
  TrainSpec spec_;
  int threads_;  // set (OpenMP, OpenBLAS) before the model's buffers exist
  GPT model_;
  AdamW optimizer_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace forge::trainer
