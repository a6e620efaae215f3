// Tensor and expert parallelism applied to the model from outside (Megatron-LM's
// megatron/core/tensor_parallel, same names, same placement of the collectives). ParallelPlan is the
// LayerFactory the parallel runtime hands the GPT; it reads each weight's ShardRule from the parameter
// table and makes:
//   ColumnParallelLinear    output features split; input replicated; backward all-reduces dL/d(input)
//   RowParallelLinear       input features split; forward all-reduces the output, then adds the bias
//   VocabParallelEmbedding  vocabulary rows split; forward all-reduces the (partial) embeddings
//   VocabParallelCrossEntropy  the tied classifier over a split vocabulary: softmax statistics and
//                           dL/d(input) all-reduced
//   SequenceParallelNorm    a norm over the group's share of the rows (below)
//   AllToAllTokenExchange   an MoE block's tokens to the experts' ranks and back, all-to-all over the
//                           expert-parallel group (Megatron's MoEAlltoAllTokenDispatcher); the router's
//                           figures summed over the context-parallel group
// Each owns its collective over its group; the model never sees the groups.
//
// Sequence parallelism (Megatron's sequence_parallel; parallel.sequence_parallel) cuts the residual
// stream between those layers into tp equal pieces of rows, one per rank (LayerFactory::sequence_shards):
// the norms and residual adds run on 1/tp of the rows. The all-reduces become an all-gather of the rows
// before a column-parallel product (and before the classifier) and a reduce-scatter after a row-parallel
// one (and after the embedding); backward swaps the two. The norms' weight gradients, sums over rows, are
// gathered as per-chunk partials and added in one process's order (Backend::add_chunk_sums): the numbers
// are those of tp without it.
#pragma once

#include "forge/comm/comm.h"
#include "forge/trainer/attention.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/spec.h"

#include <memory>

#include <vector>

namespace forge::trainer {

struct ContextScratch;
struct SequenceScratch;

// `sequence` (the classes below that take it): sequence parallelism's buffers, null without it. With it,
// `rows` is still the micro-batch's, and an input or output on the residual stream's side holds this
// rank's rows / group size of them.
class ColumnParallelLinear final : public Linear {
 public:
  ColumnParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias, comm::Comm& group,
                       SequenceScratch* sequence);
  void forward(Act out, ConstAct in, int rows) override;
  void forward_gelu(Act out, Act pre, ConstAct in, int rows) override;
  void backward(float* din, const float* dout, ConstAct in, int rows) override;

 private:
  comm::Comm& group_;
  SequenceScratch* sequence_;
};

class RowParallelLinear final : public Linear {
 public:
  RowParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias, comm::Comm& group,
                    SequenceScratch* sequence);
  void forward(Act out, ConstAct in, int rows) override;  // FP32 out: the partial sums are all-reduced
  void forward_gelu(Act out, Act pre, ConstAct in, int rows) override;  // throws: GELU needs the sum
  void backward(float* din, const float* dout, ConstAct in, int rows) override;

 private:
  comm::Comm& group_;
  SequenceScratch* sequence_;
};

class VocabParallelEmbedding final : public Embedding {
 public:
  // The group's rank 0 adds the position embedding; every rank accumulates its gradient.
  VocabParallelEmbedding(Backend& backend, ParamRef wte, ParamRef wpe, comm::Comm& group,
                         SequenceScratch* sequence);
  void forward(float* out, const int32_t* tokens, const int32_t* positions, int B, int T) override;
  void backward(const float* dout, const int32_t* tokens, const int32_t* positions, int B, int T) override;

 private:
  comm::Comm& group_;
  SequenceScratch* sequence_;
};

class VocabParallelCrossEntropy final : public Classifier, private VocabGroup {
 public:
  VocabParallelCrossEntropy(Backend& backend, ParamRef wte, comm::Comm& group, SequenceScratch* sequence);
  double forward_backward(float* dx, const float* x, const DeviceBatch& batch, int rows, const Loss& loss,
                          float scale, float* logits_out) override;
  // Each rank's vocabulary columns, all-gathered over the group (the whole rows on every rank).
  void logits(float* out, const float* x, int rows) override;

 private:
  void max(float* values, int n) override;
  void sum(float* values, int n) override;
  comm::Comm& group_;
  SequenceScratch* sequence_;
};

// A norm under sequence parallelism: forward as any, on this rank's rows; backward gathers the group's
// per-chunk partial sums of the weight gradients and adds them in order, so that every rank gets the
// gradient over all rows, bit for bit one process's. A rank's rows must be whole chunks (kNormChunkRows).
class SequenceParallelNorm final : public NormLayer {
 public:
  SequenceParallelNorm(Backend& backend, bool layernorm, float eps, ParamRef weight, ParamRef bias,
                       comm::Comm& group, SequenceScratch& sequence);
  void backward(float* din, const float* dout, const float* in, const float* stats, int N, int C) override;

 private:
  comm::Comm& group_;
  SequenceScratch& sequence_;
};

class AllToAllTokenExchange final : public TokenExchange {
 public:
  AllToAllTokenExchange(comm::Comm& group, comm::Comm& context) : group_(group), context_(context) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int per_rank) override;
  void exchange_rows(Backend& backend, const float* in, const int64_t* send_rows, float* out,
                     const int64_t* recv_rows, int C) override;
  int context_size() const override { return context_.size(); }
  void sum_over_context(double* values, int n) override;

 private:
  comm::Comm &group_, &context_;
  std::vector<size_t> send_, recv_;
};

// The context-parallel group as the rows a sequence loss sums over (Loss::sequences).
class ContextRows final : public RowGroup {
 public:
  explicit ContextRows(comm::Comm& cp) : cp_(cp) {}
  int size() const override { return cp_.size(); }
  void sum(double* values, size_t count) override;

 private:
  comm::Comm& cp_;
};

class ParallelPlan final : public LayerFactory {
 public:
  // tp: the tensor-parallel group; ep: the expert-parallel group; cp: the context-parallel group, whose
  // attention slots (when it has more than one rank) exchange keys and values as cp_comm says;
  // sequence_parallel: the residual stream cut over tp (when it has more than one rank).
  // pp (when given): the pipeline whose stages decode in turn (decode_link, with ep's ranks).
  ParallelPlan(comm::Comm& tp, comm::Comm& ep, comm::Comm& cp, ContextComm cp_comm = ContextComm::kRing,
               bool sequence_parallel = false, comm::Comm* pp = nullptr);
  // Every weight whole in this process, the sequences shared out over `cp` as cp_comm says: the layers of
  // a distillation teacher beside a context-parallel student (on each of its tensor-parallel ranks).
  static std::unique_ptr<ParallelPlan> context_only(comm::Comm& cp, ContextComm cp_comm);
  std::unique_ptr<Linear> linear(Backend& backend, ParamRef weight, ParamRef bias,
                                 bool add_bias) const override;
  std::unique_ptr<Embedding> embedding(Backend& backend, ParamRef wte, ParamRef wpe) const override;
  std::unique_ptr<Classifier> classifier(Backend& backend, ParamRef wte) const override;
  std::unique_ptr<TokenExchange> token_exchange() const override;
  std::unique_ptr<NormLayer> norm(Backend& backend, bool layernorm, float eps, ParamRef weight,
                                  ParamRef bias) const override;
  int sequence_shards() const override;
  DecodeLink* decode_link() const override { return decoding_.get(); }
  std::unique_ptr<Attention> attention(Backend& backend, const AttentionSettings& settings,
                                       const AttentionWeights& weights, int slots, int rows, float* dqkv,
                                       float* datt) const override;
  // The bytes of the context-parallel attention's and sequence parallelism's shared buffers.
  size_t scratch_bytes() const;

 private:
  // context_only: one-rank tp and ep groups, owned (declared first: tp_ and ep_ refer to them).
  std::unique_ptr<comm::Comm> own_tp_, own_ep_;
  comm::Comm &tp_, &ep_, &cp_;
  ContextComm cp_comm_;
  std::shared_ptr<ContextScratch> context_;    // shared by the layers
  std::shared_ptr<SequenceScratch> sequence_;  // null without sequence parallelism
  std::unique_ptr<ContextRows> rows_;          // null without context parallelism
  std::unique_ptr<DecodeLink> decoding_;       // null without pipeline or expert parallelism
};

}  // namespace forge::trainer
