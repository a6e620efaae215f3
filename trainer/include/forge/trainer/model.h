// A GPT-2-style decoder on CPU: learned token and position embeddings, pre-LayerNorm blocks with causal
// multi-head attention and a 4x GELU MLP, final LayerNorm, classifier tied to the token embedding.
//
// The model knows nothing about parallelism. It is described by a parameter table: every parameter is a
// named logical tensor with its logical shape and the rule by which tensor parallelism may shard it, so a
// checkpoint stores it independent of the layout and a later parallel plan needs no model change.
// Parameters, and their gradients, live in one contiguous buffer each, with a view per parameter.
#pragma once

#include "forge/common/huge_buffer.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer {

class Comm;

struct ModelConfig {
  int layers = 0;
  int d_model = 0;
  int heads = 0;
  int vocab = 0;
  int seq_len = 0;        // tokens per training sequence
  int max_positions = 0;  // rows of the position embedding (>= seq_len)
  int head_dim() const { return d_model / heads; }
};

enum class DType { kF32, kBF16 };

// How a logical tensor is split across the ranks of a tensor-parallel group.
struct ShardRule {
  enum class Kind { kReplicated, kSplit };
  Kind kind = Kind::kReplicated;
  int dim = 0;     // the split dimension (kSplit)
  int groups = 1;  // the dimension is `groups` equal blocks, each split separately (fused q|k|v: 3)
};

struct ParamInfo {
  std::string name;                  // logical name, e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;        // logical (unsharded) shape
  std::vector<int64_t> local_shape;  // this slice's shard
  ShardRule shard;
  bool decay = true;   // AdamW weight decay applies (matrices; not norms or biases)
  float init_std = 0;  // normal(0, init_std) if > 0, else constant init_value
  float init_value = 0;
  size_t offset = 0;  // into the flat buffers
  size_t numel = 0;   // local element count
};

// The part of the logical model one process holds: blocks [first_layer, last_layer), whether it holds
// the embedding and/or the head, and its tensor-parallel rank. The default is the whole model.
struct ModelSlice {
  int first_layer = 0;
  int last_layer = -1;  // -1: all layers
  bool embedding = true;
  bool head = true;
  int tp_rank = 0;
  int tp_size = 1;
};

// Parameter table of `slice` in storage order. Throws std::invalid_argument if the slice does not fit.
std::vector<ParamInfo> parameter_table(const ModelConfig& config, const ModelSlice& slice = {});

// Initial values of rank `tp_rank`'s shard of `p` (GPT-2 scheme): element i of the logical tensor is a
// pure function of (seed, p.name, i), so every layout draws the same logical model.
void init_parameter(const ParamInfo& p, int tp_rank, uint64_t seed, std::span<float> out);

// Model FLOPs per token (PaLM appendix B): 6*N + 12*L*T*d, N excluding position embeddings.
double flops_per_token(const ModelConfig& config);

class GPT {
 public:
  // Allocates parameters, gradients and activations of `slice` for micro-batches of `batch` sequences,
  // with `slots` activation sets (the micro-batches a pipeline stage holds in flight). A slice with
  // slice.tp_size > 1 needs `tp`, the tensor-parallel group it is rank slice.tp_rank of. The flat buffers
  // are padded to a multiple of `flat_multiple` elements (data-parallel sharding splits them evenly).
  // Throws std::invalid_argument when the slice does not fit the config.
  GPT(const ModelConfig& config, int batch, DType dtype = DType::kF32, const ModelSlice& slice = {},
      int slots = 1, Comm* tp = nullptr, size_t flat_multiple = 1);
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelSlice& slice() const { return slice_; }
  int batch() const { return batch_; }
  DType dtype() const { return dtype_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& param(const std::string& name) const;

  std::span<float> weights() { return weights_; }
  std::span<float> grads() { return grads_; }
  std::span<float> weight(const std::string& name);
  std::span<float> grad(const std::string& name);

  // Deterministic initialization of every parameter (init_parameter).
  void init(uint64_t seed);
  void zero_grad();
  // Call after changing weights() (optimizer step, loading): refreshes the BF16 working copy.
  void weights_changed();

  // Whole-model conveniences (slot 0). tokens, targets: batch x seq_len. Forward and backward of the
  // mean cross-entropy; gradients of `grad_scale` x loss are added to grads(). Returns the mean loss.
  float forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                         float grad_scale = 1.0f);
  // Mean loss only.
  float forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  // All logits, batch x seq_len x vocab (tests and evaluation; tp_size 1).
  void forward_logits(std::span<const int32_t> tokens, std::span<float> logits);

  // Pipeline-stage primitives on activation set `slot`. rows() = batch x seq_len.
  // forward: a slice with the embedding reads `tokens`, any other reads `input` ([rows, d_model], the
  // residual stream from the previous stage). A slice with the head returns the mean loss of `targets`
  // and, if `backward`, prepares the classifier's gradient (grad_scale x mean loss) for backward();
  // any other returns 0 and leaves its output in output(slot).
  float forward(int slot, const int32_t* tokens, const float* input, const int32_t* targets, float grad_scale,
                bool backward);
  std::span<const float> output(int slot) const;
  // backward of the micro-batch forward() ran on `slot`: from the classifier gradient (head) or from
  // `d_output` (the next stage's input gradient). Leaves the gradient of the slice's input in
  // input_grad(slot) (slices without the embedding). Calls on_grads(l) as soon as the gradients of layer l
  // are complete for this micro-batch; l = config.layers for the final LayerNorm, -1 for the embeddings.
  void backward(int slot, const int32_t* tokens, const float* d_output,
                const std::function<void(int)>& on_grads = {});
  std::span<const float> input_grad(int slot) const;
  int64_t rows() const { return int64_t(batch_) * config_.seq_len; }

  // Bytes held by activations and scratch (for memory reports).
  size_t activation_bytes() const;

 private:
  struct Acts;
  struct Scratch;
  float run_forward(int slot, const int32_t* tokens, const float* input, const int32_t* targets,
                    float grad_scale, bool backward, float* logits_out);
  void tp_sum(float* data, int64_t n);
  void check_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets) const;

  ModelConfig config_;
  ModelSlice slice_;
  int batch_;
  DType dtype_;
  Comm* tp_;
  int layers_;  // blocks in this slice
  std::vector<ParamInfo> params_;
  // Large buffers in huge pages (huge_buffer.h): first touch of ~0.6 GB was most of the start-up.
  HugeBuffer<float> weights_, grads_;
  HugeBuffer<float> work_;  // BF16 mode: weights rounded to BF16 (the copy forward/backward use)
  std::vector<std::unique_ptr<Acts>> acts_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace forge::trainer
