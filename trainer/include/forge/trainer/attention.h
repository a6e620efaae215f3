// The attention slot of a block: its q, k, v product, the per-head q/k norm and rotary positions when the
// model has them, the attention over the heads this process holds, and the output product. A layer like
// the FFN slot's: the model (model.h) asks the LayerFactory (layers.h) for one per block, so a parallel
// plan decides how it is split — tensor parallelism hands it split products and its share of the heads —
// and what computes the attention proper (attend_forward / attend_backward, where context parallelism
// puts ring attention).
#pragma once

#include "forge/trainer/backend.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/rope.h"

#include <memory>
#include <vector>

namespace forge::trainer {

struct DeviceBatch;

// What an attention layer computes besides its products, from the model spec.
struct AttentionSettings {
  AttentionShape shape;  // the heads this process holds
  bool rotary = false;   // rotary positions on q and k
  RopeTable rope;
  bool qk_norm = false;  // per-head RMSNorm of q and k (q_norm, k_norm weights), before the rotation
  float norm_eps = 1e-5f;
  bool bf16 = false;  // BF16 activation storage (the model's BF16 mode)
  // Selective recompute (model.recompute): the attention's output is not kept per micro-batch but written
  // here (one buffer the model's recomputed layers share) and computed again in the backward, from the q,
  // k and v the layer keeps. Null: kept.
  ActBuffer* recompute_out = nullptr;
  // Full recompute (model.h, Recompute): the layer is built with one slot, which every micro-batch uses
  // (the model runs the block's forward again before its backward), and keeps its activations in the set
  // of `activations_of`, the first such layer, which every recomputed block shares (null: the first).
  bool recompute_full = false;
  Attention* activations_of = nullptr;
};

// An attention layer's parameters as this process holds them: the q, k and v products' weights as one
// [(heads + 2 kv_heads) head_dim, C] tensor and their biases (GPT-2's attn.qkv, or a view over attn.q,
// attn.k, attn.v, which the parameter table stores back to back), the q/k norm weights, the output product.
struct AttentionWeights {
  ParamRef qkv, qkv_bias, q_norm, k_norm, proj, proj_bias;
};

class Attention {
 public:
  // qkv: [rows, C] -> [rows, shape.qkv_width()] with its bias added; proj: [rows, shape.q_width()] ->
  // [rows, C], its bias left to the block (output_bias). Scratch: dqkv [rows, qkv_width], datt
  // [rows, q_width], shared by every layer of a model. Activations for `slots` micro-batches in flight.
  Attention(Backend& backend, const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
            std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots, int rows, float* dqkv,
            float* datt);
  virtual ~Attention() = default;
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // out [B*T, C] = the layer's update to the residual stream (without the output bias) from `in` (the
  // norm's output), for micro-batch slot `slot` of B sequences of T positions with the batch's positions
  // and document starts (DeviceBatch).
  void forward(int slot, ConstAct in, float* out, const DeviceBatch& batch, int B, int T);
  // din = dL/d(in) (overwrites) from dout = dL/d(out), for the micro-batch forward() ran on `slot`.
  void backward(int slot, ConstAct in, const float* dout, float* din, const DeviceBatch& batch, int B, int T);
  // Incremental decoding (GPT::decode): `rows` rows at positions pos of cache sequences seq; the caches
  // hold shape.kv_heads heads per position ([sequences, max_len, kv_width]).
  void decode(ConstAct in, float* out, float* k_cache, float* v_cache, const int32_t* seq, const int32_t* pos,
              int rows, int max_len);

  const AttentionShape& shape() const { return settings_.shape; }
  const float* output_bias() const { return proj_->bias(); }
  virtual size_t activation_bytes() const;

 protected:
  // The attention proper over this process's heads of the rotated q, k and v (Backend::attention_forward
  // and attention_backward): what context parallelism replaces.
  // `slot`: the micro-batch's, for a replacement that keeps activations of its own.
  virtual void attend_forward(int slot, Act out, float* lse, ConstAct qkv, const DeviceBatch& batch, int B,
                              int T);
  virtual void attend_backward(int slot, float* dqkv, const float* dout, ConstAct qkv, ConstAct out,
                               const float* lse, const DeviceBatch& batch, int B, int T);
  const AttentionSettings& settings() const { return settings_; }

  Backend& backend_;

 private:
  // The attention's output for the micro-batch in `slot`: kept, or the shared recompute buffer.
  Act output(int slot);
  // q, k, v after the product's bias, the q/k norm and the rotation.
  void project(int slot, ConstAct in, Act qkv, const int32_t* positions, int rows, int T);

  AttentionSettings settings_;
  std::unique_ptr<Linear> qkv_, proj_;
  ParamRef q_norm_, k_norm_;
  float *dqkv_, *datt_;
  Buffer<float> inv_freq_;  // the rotation's frequencies, in the backend's memory
  struct Acts {
    ActBuffer qkv, att;      // what backward reads again: BF16 in BF16 mode
    Buffer<float> lse;       // [B, heads, T]
    Buffer<float> qk_saved;  // qk-norm: its inputs [rows, (heads + kv_heads) head_dim] and 1 / rms
    Buffer<float> qk_rstd;
  };
  // The activation set of the micro-batch in `slot` (full recompute: the shared set), and the slot of its
  // own buffers a replacement of attend_* is given.
  Acts& acts(int slot);
  int own_slot(int slot) const { return settings_.recompute_full ? 0 : slot; }
  std::vector<Acts> acts_;
};

}  // namespace forge::trainer
