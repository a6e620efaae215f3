// AdamW over the model's flat parameter buffer, the learning-rate schedule and gradient clipping.
#pragma once

#include "forge/trainer/backend.h"
#include "forge/trainer/model.h"
#include "forge/trainer/spec.h"

#include <cstdint>
#include <span>
#include <vector>

namespace forge::trainer {

// Linear warm-up over warmup_steps (step 0 gets lr / warmup_steps), then cosine decay from lr to min_lr
// at total_steps. `step` counts from 0.
double learning_rate(const OptimConfig& optim, int64_t step, int64_t total_steps);

// L2 norm of all gradients (accumulated in double).
double grad_norm(std::span<const float> grads);

// Scales gradients so their global norm is at most max_norm (as torch.nn.utils.clip_grad_norm_: factor
// max_norm / (norm + 1e-6) when below 1). max_norm <= 0: no clipping. Returns the norm before clipping.
double clip_grad_norm(std::span<float> grads, double max_norm);

// AdamW with decoupled weight decay (applied only to parameters marked `decay`) and bias correction,
// the update PyTorch's torch.optim.AdamW computes. It owns the moments of `ranges` of the flat buffer
// (all of it by default; a ZeRO-1 shard otherwise), stored back to back in range order in the backend's
// memory, and updates only those elements (Backend::adamw).
class AdamW {
 public:
  AdamW(const OptimConfig& optim, const std::vector<ParamInfo>& params, size_t size,
        std::vector<FlatRange> ranges = {}, Backend& backend = cpu_backend());
  void step(std::span<float> weights, std::span<const float> grads, double lr);
  const std::vector<FlatRange>& ranges() const { return ranges_; }
  int64_t steps_taken() const { return t_; }
  // Resuming from a checkpoint: the step count drives bias correction and the schedule.
  void restore_steps(int64_t steps) { t_ = steps; }
  // Continued training on moments loaded from another run (ckpt.init_optimizer = keep): bias correction
  // counts the `steps` updates they averaged before this run's first, while steps_taken(), the step of
  // the schedule and the data, starts again from 0.
  void set_moment_steps_before(int64_t steps) { moment_steps_before_ = steps; }
  int64_t moment_steps_before() const { return moment_steps_before_; }
  // First and second moments, packed like ranges() (for checkpoints).
  std::span<float> m() { return m_.span(); }
  std::span<float> v() { return v_.span(); }

 private:
  OptimConfig optim_;
  Backend& backend_;
  std::vector<FlatRange> ranges_;
  std::vector<AdamWSegment> segments_;  // each owned stretch of one parameter
  size_t size_;
  Buffer<float> m_, v_;
  int64_t t_ = 0;
  int64_t moment_steps_before_ = 0;
};

}  // namespace forge::trainer
