// The GPT of forge/trainer/model.h on one GPU, and its training step: the same configuration, parameter
// table, initialization (init_parameter on the host, then copied) and optimizer semantics as the CPU
// Trainer, so that loss curves of the two are comparable step by step.
//
// Memory: FP32 master weights, FP32 gradients and AdamW moments; in BF16 mode a BF16 working copy of the
// weights (refreshed by the optimizer kernel) and BF16 activations wherever the CPU model rounds to BF16
// (the inputs of the matrix products); the residual stream, statistics and logits stay FP32.
#pragma once

#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"
#include "forge/trainer/spec.h"
#include "forge/trainer/step_stats.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace forge::trainer::cuda {

class CudaGPT {
 public:
  // The whole model (the default ModelSlice) for micro-batches of `batch` sequences, on the current device.
  CudaGPT(const ModelConfig& config, int batch, DType dtype);
  ~CudaGPT();
  CudaGPT(const CudaGPT&) = delete;
  CudaGPT& operator=(const CudaGPT&) = delete;

  const ModelConfig& config() const;
  int batch() const;
  DType dtype() const;
  const std::vector<ParamInfo>& params() const;
  size_t num_params() const;

  // Deterministic initialization: init_parameter of every parameter, as GPT::init.
  void init(uint64_t seed);
  void set_weights(std::span<const float> host);
  void get_weights(std::span<float> host) const;
  void get_grads(std::span<float> host) const;
  // Device buffers of num_params() floats.
  float* weights();
  float* grads();
  void zero_grad();
  // Call after changing weights() other than through the optimizer: refreshes the BF16 working copy.
  void weights_changed();

  // As GPT::forward_backward / forward_loss (tokens and targets on the host, batch x seq_len).
  float forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                         float grad_scale = 1.0f);
  float forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets);

  // AdamW over all parameters with the gradients scaled by `clip` first (moments held here).
  void adamw_step(const OptimConfig& optim, int64_t t, double lr, float clip);
  // L2 norm of all gradients (synchronizes).
  double grad_norm();

  // Device bytes this model allocated (weights, gradients, optimizer state, activations).
  size_t device_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// forge::trainer::Trainer's step on the GPU: micro-batch accumulation, clipping, the schedule, AdamW, and
// the same kNumeric failure on a non-finite loss or gradient norm before the weights change.
class CudaTrainer {
 public:
  explicit CudaTrainer(const TrainSpec& spec);
  CudaGPT& model() { return model_; }
  int64_t steps_taken() const { return steps_; }
  size_t tokens_per_step() const;
  StepStats step(std::span<const int32_t> tokens);

 private:
  TrainSpec spec_;
  CudaGPT model_;
  int64_t steps_ = 0;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace forge::trainer::cuda
