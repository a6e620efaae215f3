// A GPT-2-style decoder on CPU: learned token and position embeddings, pre-LayerNorm blocks with causal
// multi-head attention and a 4x GELU MLP, final LayerNorm, classifier tied to the token embedding.
//
// The model knows nothing about parallelism. It is described by a parameter table: every parameter is a
// named logical tensor with its logical shape and the rule by which tensor parallelism may shard it, so a
// checkpoint stores it independent of the layout and a later parallel plan needs no model change.
// Parameters, and their gradients, live in one contiguous buffer each, with a view per parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer {

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
  // Allocates parameters, gradients and activations for micro-batches of `batch` sequences. Only the
  // whole model (default slice) runs forward/backward in this build; other slices throw
  // std::invalid_argument.
  GPT(const ModelConfig& config, int batch, DType dtype = DType::kF32, const ModelSlice& slice = {});
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const ModelConfig& config() const { return config_; }
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

  // tokens, targets: batch x seq_len. Forward and backward of the mean cross-entropy; gradients of
  // `grad_scale` x loss are added to grads(). Returns the mean loss.
  float forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                         float grad_scale = 1.0f);
  // Mean loss only.
  float forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets);
  // All logits, batch x seq_len x vocab (tests and evaluation).
  void forward_logits(std::span<const int32_t> tokens, std::span<float> logits);

  // Bytes held by parameters, gradients and activations (for memory reports).
  size_t activation_bytes() const;

 private:
  struct Acts;
  void forward_blocks(const int32_t* tokens);
  float classifier(const int32_t* targets, float* logits_out, bool backward, float grad_scale);
  void backward_blocks(const int32_t* tokens);
  void check_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets) const;

  ModelConfig config_;
  ModelSlice slice_;
  int batch_;
  DType dtype_;
  std::vector<ParamInfo> params_;
  std::vector<float> weights_, grads_;
  std::vector<float> work_;  // BF16 mode: weights rounded to BF16 (the copy forward/backward use)
  std::unique_ptr<Acts> acts_;
};

}  // namespace forge::trainer
