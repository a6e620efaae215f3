#include "forge/trainer/tensor_parallel.h"

#include "context_attention.h"

#include "forge/trainer/model.h"

#include <stdexcept>

namespace forge::trainer {

ColumnParallelLinear::ColumnParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias,
                                           Comm& group)
    : Linear(backend, weight, bias, add_bias), group_(group) {}

void ColumnParallelLinear::backward(float* din, const float* dout, ConstAct in, int rows) {
  Linear::backward(din, dout, in, rows);
  // Each rank's output columns contribute to the input gradient: sum them.
  if (din != nullptr) group_.all_reduce_sum(din, size_t(rows) * size_t(in_));
}

RowParallelLinear::RowParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias,
                                     Comm& group)
    : Linear(backend, weight, bias, add_bias), group_(group) {}

void RowParallelLinear::forward(Act out, ConstAct in, int rows) {
  // Each rank's input features give a partial product; the bias (replicated) goes on after the sum.
  float* sum = out.f32();
  backend_.matmul_forward(sum, in, weight_.value, nullptr, rows, in_, out_);
  group_.all_reduce_sum(sum, size_t(rows) * size_t(out_));
  if (add_bias_) backend_.add_bias(sum, bias_.value, rows, out_);
}

void RowParallelLinear::forward_gelu(Act, Act, ConstAct, int) {
  throw std::logic_error("RowParallelLinear: the GELU of a partial product is not the GELU of the sum");
}

namespace {
// The vocabulary rows rank r of the group holds.
int vocab_begin(const ParamRef& wte, const Comm& group) {
  return group.rank() * int(wte.info->local_shape[0]);
}
}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(Backend& backend, ParamRef wte, ParamRef wpe, Comm& group)
    : Embedding(backend, wte, wpe, vocab_begin(wte, group),
                vocab_begin(wte, group) + int(wte.info->local_shape[0])),
      group_(group) {
  if (group.rank() != 0) wpe_.value = nullptr;
}

void VocabParallelEmbedding::forward(float* out, const int32_t* tokens, const int32_t* positions, int B,
                                     int T) {
  // Tokens outside this rank's rows contribute zeros: the sum over the group is the full embedding.
  Embedding::forward(out, tokens, positions, B, T);
  group_.all_reduce_sum(out, size_t(B) * size_t(T) * size_t(C_));
}

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Backend& backend, ParamRef wte, Comm& group)
    : Classifier(backend, wte, vocab_begin(wte, group)), group_(group) {
  vocab_group_ = this;  // the softmax statistics are combined over the group (max, sum below)
}

double VocabParallelCrossEntropy::forward_backward(float* dx, const float* x, const DeviceBatch& batch,
                                                   int rows, const Loss& loss, float scale,
                                                   float* logits_out) {
  const double total = Classifier::forward_backward(dx, x, batch, rows, loss, scale, logits_out);
  if (dx != nullptr) group_.all_reduce_sum(dx, size_t(rows) * size_t(C_));
  return total;
}

void VocabParallelCrossEntropy::max(float* values, int n) {
  group_.all_reduce(values, size_t(n), CommType::kF32, ReduceOp::kMax)->wait();
}

void VocabParallelCrossEntropy::sum(float* values, int n) {
  group_.all_reduce_sum(values, size_t(n));
}

void AllToAllTokenExchange::exchange_counts(const int64_t* send, int64_t* recv, int per_rank) {
  send_.assign(size_t(size()), size_t(per_rank) * sizeof(int64_t));
  group_.all_to_all_v(send, send_.data(), recv, send_.data(), CommType::kU8)->wait();
}

void AllToAllTokenExchange::exchange_rows(Backend&, const float* in, const int64_t* send_rows, float* out,
                                          const int64_t* recv_rows, int C) {
  send_.resize(size_t(size()));
  recv_.resize(size_t(size()));
  for (size_t r = 0; r < send_.size(); ++r) {
    send_[r] = size_t(send_rows[r]) * size_t(C);
    recv_[r] = size_t(recv_rows[r]) * size_t(C);
  }
  group_.all_to_all_v(in, send_.data(), out, recv_.data(), CommType::kF32)->wait();
}

std::unique_ptr<Linear> ParallelPlan::linear(Backend& backend, ParamRef weight, ParamRef bias,
                                             bool add_bias) const {
  const ShardRule& rule = weight.info->shard;
  if (tp_.size() == 1 || rule.kind != ShardRule::Kind::kSplit)
    return LayerFactory::linear(backend, weight, bias, add_bias);
  if (rule.dim == 0) return std::make_unique<ColumnParallelLinear>(backend, weight, bias, add_bias, tp_);
  return std::make_unique<RowParallelLinear>(backend, weight, bias, add_bias, tp_);
}

std::unique_ptr<Embedding> ParallelPlan::embedding(Backend& backend, ParamRef wte, ParamRef wpe) const {
  if (tp_.size() == 1) return LayerFactory::embedding(backend, wte, wpe);
  return std::make_unique<VocabParallelEmbedding>(backend, wte, wpe, tp_);
}

std::unique_ptr<Classifier> ParallelPlan::classifier(Backend& backend, ParamRef wte) const {
  if (tp_.size() == 1) return LayerFactory::classifier(backend, wte);
  return std::make_unique<VocabParallelCrossEntropy>(backend, wte, tp_);
}

ParallelPlan::ParallelPlan(Comm& tp, Comm& ep, Comm& cp, ContextComm cp_comm)
    : tp_(tp), ep_(ep), cp_(cp), cp_comm_(cp_comm), context_(std::make_shared<ContextScratch>()) {}

std::unique_ptr<Attention> ParallelPlan::attention(Backend& backend, const AttentionSettings& settings,
                                                   const AttentionWeights& w, int slots, int rows,
                                                   float* dqkv, float* datt) const {
  if (cp_.size() == 1) return LayerFactory::attention(backend, settings, w, slots, rows, dqkv, datt);
  auto qkv = linear(backend, w.qkv, w.qkv_bias, true), proj = linear(backend, w.proj, w.proj_bias, false);
  context_->reserve(cp_comm_, rows, settings.shape, cp_.size());
  if (cp_comm_ == ContextComm::kAllToAll)
    return std::make_unique<AllToAllAttention>(cp_, context_, backend, settings, std::move(qkv),
                                               std::move(proj), w, slots, rows, dqkv, datt);
  return std::make_unique<RingAttention>(cp_, context_, backend, settings, std::move(qkv), std::move(proj), w,
                                         slots, rows, dqkv, datt);
}

size_t ParallelPlan::scratch_bytes() const {
  return context_->bytes();
}

std::unique_ptr<TokenExchange> ParallelPlan::token_exchange() const {
  if (ep_.size() == 1) return LayerFactory::token_exchange();
  return std::make_unique<AllToAllTokenExchange>(ep_);
}

}  // namespace forge::trainer
