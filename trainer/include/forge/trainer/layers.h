// The model's layers that hold parameters, and the seam through which a parallel plan splits them.
//
// The GPT (model.h) is built from these and knows nothing about parallelism: it asks a LayerFactory for
// each one. LayerFactory::whole() makes them whole, as one process holding every parameter. The parallel
// runtime's ParallelPlan (tensor_parallel.h) makes Megatron's layers instead — ColumnParallelLinear,
// RowParallelLinear, VocabParallelEmbedding, VocabParallelCrossEntropy — each of which owns its collective,
// and the all-to-all that moves tokens to the experts of an MoE block (TokenExchange). Which weights are
// split how is the parameter table's ShardRule (model.h), so the plan needs no list of layer names.
#pragma once

#include "forge/trainer/backend.h"
#include "forge/trainer/loss.h"

#include <memory>

namespace forge::trainer {

struct ParamInfo;
class Attention;
struct AttentionSettings;
struct AttentionWeights;

// A parameter as a layer uses it: its table entry, the values forward and backward compute with (in BF16
// mode the rounded working copy) and its gradient. Either may be null for a layer without that parameter.
struct ParamRef {
  const ParamInfo* info = nullptr;
  const float* value = nullptr;
  float* grad = nullptr;
};

// y = x W^T (+ b) over [rows, in] activations; W is the local [out, in] (PyTorch's Linear layout).
class Linear {
 public:
  // add_bias = false leaves the bias to the caller, who fuses it into the op that follows (Megatron's
  // skip_bias_add); backward computes its gradient either way.
  Linear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias);
  virtual ~Linear() = default;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  int in_features() const { return in_; }  // as this rank holds them
  int out_features() const { return out_; }
  const float* bias() const { return bias_.value; }

  // out [rows, out_features] = in @ W^T (+ b).
  virtual void forward(Act out, ConstAct in, int rows);
  // out = gelu(pre), pre = in @ W^T + b: the product with the bias add and the GELU that follow it fused
  // (Backend::matmul_bias_gelu_forward), for a layer whose output needs no collective.
  virtual void forward_gelu(Act out, Act pre, ConstAct in, int rows);
  // din = dout @ W (overwrites; skipped when null); dW += dout^T in; db += column sums of dout.
  virtual void backward(float* din, const float* dout, ConstAct in, int rows);

 protected:
  Backend& backend_;
  ParamRef weight_, bias_;
  bool add_bias_;
  int in_ = 0, out_ = 0;
};

// A norm slot's layer over the rows of the residual stream this process holds: LayerNorm (weight, bias;
// per row the mean and 1 / std) or RMSNorm (weight; per row 1 / rms), alone or fused with the residual add
// before it. Statistics: stats_per_row() floats per row, [N] blocks.
class NormLayer {
 public:
  NormLayer(Backend& backend, bool layernorm, float eps, ParamRef weight, ParamRef bias);
  virtual ~NormLayer() = default;
  NormLayer(const NormLayer&) = delete;
  NormLayer& operator=(const NormLayer&) = delete;

  static size_t stats_per_row(bool layernorm) { return layernorm ? 2 : 1; }
  void forward(Act out, float* stats, const float* in, int N, int C) const;
  // res_out = res_in + delta + delta_bias (null: none); out = the norm of res_out.
  void residual_forward(float* res_out, Act out, float* stats, const float* res_in, const float* delta,
                        const float* delta_bias, int N, int C) const;
  // din += dL/din from dout = dL/d(out); the weights' gradients +=.
  virtual void backward(float* din, const float* dout, const float* in, const float* stats, int N, int C);

 protected:
  Backend& backend_;
  bool layernorm_;
  float eps_;
  ParamRef w_, b_;
};

// Token embedding rows [vocab_begin, vocab_end) of the vocabulary plus the position embedding (when
// `wpe.value` is set): out = wte[token] + wpe[position].
class Embedding {
 public:
  Embedding(Backend& backend, ParamRef wte, ParamRef wpe, int vocab_begin, int vocab_end);
  virtual ~Embedding() = default;
  Embedding(const Embedding&) = delete;
  Embedding& operator=(const Embedding&) = delete;

  virtual void forward(float* out, const int32_t* tokens, const int32_t* positions, int B, int T);
  // Adds dout into the gradients of the rows used.
  virtual void backward(const float* dout, const int32_t* tokens, const int32_t* positions, int B, int T);

 protected:
  Backend& backend_;
  ParamRef wte_, wpe_;
  int vocab_begin_, vocab_end_, C_;
};

// The classifier tied to the token embedding (logits = x wte^T over the vocabulary rows this rank holds)
// and the loss over its logits, chunk by chunk of positions: the logits of all positions never exist at
// once. dx is the gradient of x, for the whole vocabulary.
class Classifier {
 public:
  Classifier(Backend& backend, ParamRef wte, int vocab_begin, VocabGroup* group = nullptr);
  virtual ~Classifier() = default;
  Classifier(const Classifier&) = delete;
  Classifier& operator=(const Classifier&) = delete;

  // The loss of the micro-batch's positions (`rows` of them) from x [rows, C]. When dx is not null,
  // dx = dL/dx and the embedding's gradient gets dL/dwte, for L = scale x the loss's sum. logits_out
  // (host memory, [rows, V], the whole vocabulary only) receives the logits when not null.
  virtual double forward_backward(float* dx, const float* x, const DeviceBatch& batch, int rows,
                                  const Loss& loss, float scale, float* logits_out);
  // The logits of `rows` positions x [rows, C] over the whole vocabulary into host memory [rows, vocab]
  // (decoding: the generator samples from them). Collective over a split vocabulary's ranks.
  virtual void logits(float* out, const float* x, int rows);
  // Context parallelism: the ranks holding the rest of each row, over which a loss of whole sequences sums
  // its per-row figures (Loss::sequences). Not owned.
  void set_row_group(RowGroup* group) { row_group_ = group; }

 protected:
  Backend& backend_;
  ParamRef wte_;
  int vocab_begin_, V_, C_;
  VocabGroup* vocab_group_;
  RowGroup* row_group_ = nullptr;
  Buffer<float> chunk_;
  Buffer<float> nll_, coeff_;  // sequence losses: per position, in the backend's memory
  Buffer<float> decoded_;      // logits(): the products of a decoding step, kept across steps
  std::vector<float> nll_host_, coeff_host_;
};

// Moves the rows of routed tokens between the ranks that share out an MoE block's experts (moe.h). Rank r
// of size() holds experts [r, r + 1) x experts / size(). The whole model's exchange is one rank keeping
// its rows; expert parallelism's is an all-to-all over its group.
class TokenExchange {
 public:
  virtual ~TokenExchange() = default;
  virtual int size() const { return 1; }
  virtual int rank() const { return 0; }
  // Host memory: `per_rank` counts go to each rank (send: size() x per_rank), and recv gets each rank's.
  virtual void exchange_counts(const int64_t* send, int64_t* recv, int per_rank);
  // Backend memory: send_rows[r] rows of `in` ([sum, C], back to back in rank order) go to rank r;
  // recv_rows[r] rows arrive from rank r into `out`, back to back in rank order.
  virtual void exchange_rows(Backend& backend, const float* in, const int64_t* send_rows, float* out,
                             const int64_t* recv_rows, int C);
  // The ranks holding the rest of each sequence of the micro-batch (context parallelism), and the sum of
  // `values` (host memory) over them, in place: the router's figures over the whole micro-batch. The whole
  // model's: one rank, nothing to add.
  virtual int context_size() const { return 1; }
  virtual void sum_over_context(double*, int) {}
};

// The other processes a decoding step involves (GPT::decode, GPT::decoding): a pipeline's stages, which
// decode in turn (the residual stream's rows arrive from the previous stage and leave for the next, in
// backend memory, and the last stage's logits go to every stage, so that each samples the same tokens),
// and an expert-parallel group's ranks, which decode other sequences but exchange tokens at every step.
// Collective over them, in order.
class DecodeLink {
 public:
  virtual ~DecodeLink() = default;
  virtual void receive(float* rows, size_t count) = 0;
  virtual void send(const float* rows, size_t count) = 0;
  virtual void share_logits(float* logits, size_t count) = 0;
  // Whether any of them has rows to decode (`mine`: this process's).
  virtual bool any(bool mine) = 0;
};

class LayerFactory {
 public:
  virtual ~LayerFactory() = default;
  virtual std::unique_ptr<Linear> linear(Backend& backend, ParamRef weight, ParamRef bias,
                                         bool add_bias) const;
  virtual std::unique_ptr<Embedding> embedding(Backend& backend, ParamRef wte, ParamRef wpe) const;
  virtual std::unique_ptr<Classifier> classifier(Backend& backend, ParamRef wte) const;
  virtual std::unique_ptr<TokenExchange> token_exchange() const;
  virtual std::unique_ptr<NormLayer> norm(Backend& backend, bool layernorm, float eps, ParamRef weight,
                                          ParamRef bias) const;
  // Into how many equal pieces of its rows the residual stream is cut, one per process (sequence
  // parallelism): the model keeps the stream, the norms and the residual adds over rows / this many; its
  // embedding writes, and its classifier reads, that share; the attention and FFN products take it and
  // give it back, working on all the rows in between.
  virtual int sequence_shards() const { return 1; }
  // A block's attention slot (attention.h) over the heads in `settings` (this process's share), its
  // products made by linear(); scratch and slots as Attention's constructor takes them.
  virtual std::unique_ptr<Attention> attention(Backend& backend, const AttentionSettings& settings,
                                               const AttentionWeights& weights, int slots, int rows,
                                               float* dqkv, float* datt) const;
  // The link of decoding (null: every layer and expert is in this process, or a tensor-parallel share).
  virtual DecodeLink* decode_link() const { return nullptr; }
  // Layers with every parameter whole, in this process.
  static const LayerFactory& whole();
};

}  // namespace forge::trainer
