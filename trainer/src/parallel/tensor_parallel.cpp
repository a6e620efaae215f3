#include "forge/trainer/tensor_parallel.h"

#include "context_attention.h"

#include "forge/comm/groups.h"
#include "forge/trainer/model.h"

#include <algorithm>
#include <stdexcept>

namespace forge::trainer {

// In the backend's memory, as the activations they carry.
struct SequenceScratch {
  Buffer<float> gathered;           // [rows, C]: a share of rows gathered from the group
  Buffer<uint16_t> gathered_bf16;   // the same for BF16 activations (the column products' inputs)
  Buffer<float> full;               // [rows, C]: a product's rows before the reduce-scatter
  Buffer<float> partial, partials;  // a norm's weight-gradient partials: this rank's, the group's

  void reserve(Backend& backend, int rows, int C, int ranks, bool bf16) {
    const size_t n = size_t(rows) * size_t(C),
                 chunks = size_t(rows / ranks + kNormChunkRows - 1) / kNormChunkRows;
    backend.grow(gathered, n);
    if (bf16) backend.grow(gathered_bf16, n);
    backend.grow(full, n);
    backend.grow(partial, chunks * 2 * size_t(C));
    backend.grow(partials, size_t(ranks) * chunks * 2 * size_t(C));
  }
  size_t bytes() const {
    return (gathered.size() + full.size() + partial.size() + partials.size()) * sizeof(float) +
           gathered_bf16.size() * sizeof(uint16_t);
  }

  // The group's shares of `rows` rows of `width` (this rank's: `mine`), whole, in rank order.
  const float* gather(comm::Comm& group, const float* mine, int rows, int width) {
    group
        .all_gather(mine, gathered.data(), size_t(rows / group.size()) * size_t(width), comm::CommType::kF32)
        ->wait();
    return gathered.data();
  }
  // The same for activations, BF16 ones moved as they are (half the bytes).
  ConstAct gather(comm::Comm& group, ConstAct mine, int rows, int width) {
    if (!mine.bf16) return gather(group, mine.f32(), rows, width);
    group
        .all_gather(mine.data, gathered_bf16.data(), size_t(rows / group.size()) * size_t(width),
                    comm::CommType::kBF16)
        ->wait();
    return static_cast<const uint16_t*>(gathered_bf16.data());
  }
  // Rank r of the group receives rows [r, r + 1) x rows / size of the group's sum of `whole`.
  static void scatter(comm::Comm& group, const float* whole, float* mine, int rows, int width) {
    group.reduce_scatter(whole, mine, size_t(rows / group.size()) * size_t(width), comm::CommType::kF32)
        ->wait();
  }
};

ColumnParallelLinear::ColumnParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias,
                                           comm::Comm& group, SequenceScratch* sequence)
    : Linear(backend, weight, bias, add_bias), group_(group), sequence_(sequence) {}

void ColumnParallelLinear::forward(Act out, ConstAct in, int rows) {
  if (sequence_ != nullptr) in = sequence_->gather(group_, in, rows, in_);
  Linear::forward(out, in, rows);
}

void ColumnParallelLinear::forward_gelu(Act out, Act pre, ConstAct in, int rows) {
  if (sequence_ != nullptr) in = sequence_->gather(group_, in, rows, in_);
  Linear::forward_gelu(out, pre, in, rows);
}

void ColumnParallelLinear::backward(float* din, const float* dout, ConstAct in, int rows) {
  if (sequence_ == nullptr) {
    Linear::backward(din, dout, in, rows);
    // Each rank's output columns contribute to the input gradient: sum them.
    if (din != nullptr) group_.all_reduce_sum(din, size_t(rows) * size_t(in_));
    return;
  }
  // The input is gathered again rather than kept: keeping it would cost what the cut saves (Megatron
  // does the same). The summed input gradient goes back cut: reduce-scatter.
  float* whole = din != nullptr ? sequence_->full.data() : nullptr;
  // A frozen weight's product does not read the input (Backend::matmul_backward): no gather.
  Linear::backward(whole, dout, weight_.grad != nullptr ? sequence_->gather(group_, in, rows, in_) : in,
                   rows);
  if (din != nullptr) SequenceScratch::scatter(group_, whole, din, rows, in_);
}

RowParallelLinear::RowParallelLinear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias,
                                     comm::Comm& group, SequenceScratch* sequence)
    : Linear(backend, weight, bias, add_bias), group_(group), sequence_(sequence) {}

void RowParallelLinear::forward(Act out, ConstAct in, int rows) {
  // Each rank's input features give a partial product; the bias (replicated) goes on after the sum.
  float* sum = sequence_ != nullptr ? sequence_->full.data() : out.f32();
  backend_.matmul_forward(sum, in, weight_.value, nullptr, rows, in_, out_);
  if (sequence_ != nullptr) {
    SequenceScratch::scatter(group_, sum, out.f32(), rows, out_);
    rows /= group_.size();
    sum = out.f32();
  } else {
    group_.all_reduce_sum(sum, size_t(rows) * size_t(out_));
  }
  if (add_bias_) backend_.add_bias(sum, bias_.value, rows, out_);
}

void RowParallelLinear::backward(float* din, const float* dout, ConstAct in, int rows) {
  if (sequence_ != nullptr) dout = sequence_->gather(group_, dout, rows, out_);
  Linear::backward(din, dout, in, rows);
}

void RowParallelLinear::forward_gelu(Act, Act, ConstAct, int) {
  throw std::logic_error("RowParallelLinear: the GELU of a partial product is not the GELU of the sum");
}

namespace {
// The vocabulary rows rank r of the group holds.
int vocab_begin(const ParamRef& wte, const comm::Comm& group) {
  return group.rank() * int(wte.info->local_shape[0]);
}
}  // namespace

VocabParallelEmbedding::VocabParallelEmbedding(Backend& backend, ParamRef wte, ParamRef wpe,
                                               comm::Comm& group, SequenceScratch* sequence)
    : Embedding(backend, wte, wpe, vocab_begin(wte, group),
                vocab_begin(wte, group) + int(wte.info->local_shape[0])),
      group_(group),
      sequence_(sequence) {
  if (group.rank() != 0) wpe_.value = nullptr;
}

void VocabParallelEmbedding::forward(float* out, const int32_t* tokens, const int32_t* positions, int B,
                                     int T) {
  // Tokens outside this rank's rows contribute zeros: the sum over the group is the full embedding.
  if (sequence_ == nullptr) {
    Embedding::forward(out, tokens, positions, B, T);
    group_.all_reduce_sum(out, size_t(B) * size_t(T) * size_t(C_));
    return;
  }
  Embedding::forward(sequence_->full.data(), tokens, positions, B, T);
  SequenceScratch::scatter(group_, sequence_->full.data(), out, B * T, C_);
}

void VocabParallelEmbedding::backward(const float* dout, const int32_t* tokens, const int32_t* positions,
                                      int B, int T) {
  if (wte_.grad == nullptr) return;  // frozen (on every rank of the group): nothing to gather for
  if (sequence_ != nullptr) dout = sequence_->gather(group_, dout, B * T, C_);
  Embedding::backward(dout, tokens, positions, B, T);
}

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Backend& backend, ParamRef wte, comm::Comm& group,
                                                     SequenceScratch* sequence)
    : Classifier(backend, wte, vocab_begin(wte, group)), group_(group), sequence_(sequence) {
  vocab_group_ = this;  // the softmax statistics are combined over the group (max, sum below)
}

double VocabParallelCrossEntropy::forward_backward(float* dx, const float* x, const DeviceBatch& batch,
                                                   int rows, const Loss& loss, float scale,
                                                   float* logits_out) {
  if (sequence_ == nullptr) {
    const double total = Classifier::forward_backward(dx, x, batch, rows, loss, scale, logits_out);
    if (dx != nullptr) group_.all_reduce_sum(dx, size_t(rows) * size_t(C_));
    return total;
  }
  float* whole = dx != nullptr ? sequence_->full.data() : nullptr;
  const double total = Classifier::forward_backward(whole, sequence_->gather(group_, x, rows, C_), batch,
                                                    rows, loss, scale, logits_out);
  if (dx != nullptr) SequenceScratch::scatter(group_, whole, dx, rows, C_);
  return total;
}

void VocabParallelCrossEntropy::logits(float* out, const float* x, int rows) {
  if (sequence_ != nullptr)
    throw std::logic_error("VocabParallelCrossEntropy::logits: decoding under sequence parallelism");
  // decoded_ holds this rank's columns, then every rank's (kept across decoding steps).
  const size_t part = size_t(rows) * size_t(V_), ranks = size_t(group_.size());
  backend_.grow(decoded_, (ranks + 1) * part);
  float *mine = decoded_.data(), *all = mine + part;
  backend_.matmul_forward(mine, x, wte_.value, nullptr, rows, C_, V_);
  group_.all_gather(mine, all, part, comm::CommType::kF32)->wait();
  std::vector<float> copy;
  const float* gathered = all;
  if (!backend_.host_memory()) {
    copy.resize(ranks * part);
    backend_.copy_to_host(copy.data(), all, copy.size() * sizeof(float));
    gathered = copy.data();
  }
  // Rank q's block holds columns [q V_, (q + 1) V_) of every row.
  const size_t V = ranks * size_t(V_);
  for (size_t q = 0; q < ranks; ++q)
    for (size_t r = 0; r < size_t(rows); ++r)
      std::copy_n(gathered + q * part + r * size_t(V_), size_t(V_), out + r * V + q * size_t(V_));
}

void VocabParallelCrossEntropy::max(float* values, int n) {
  group_.all_reduce(values, size_t(n), comm::CommType::kF32, comm::ReduceOp::kMax)->wait();
}

void VocabParallelCrossEntropy::sum(float* values, int n) {
  group_.all_reduce_sum(values, size_t(n));
}

SequenceParallelNorm::SequenceParallelNorm(Backend& backend, bool layernorm, float eps, ParamRef weight,
                                           ParamRef bias, comm::Comm& group, SequenceScratch& sequence)
    : NormLayer(backend, layernorm, eps, weight, bias), group_(group), sequence_(sequence) {}

void SequenceParallelNorm::backward(float* din, const float* dout, const float* in, const float* st, int N,
                                    int C) {
  if (N % kNormChunkRows != 0)
    throw std::logic_error("SequenceParallelNorm: a rank's rows are not whole chunks of kNormChunkRows");
  const int64_t chunks = N / kNormChunkRows;
  const int width = layernorm_ ? 2 * C : C;  // per chunk: the weight's terms (then the bias's)
  float* partial = sequence_.partial.data();
  if (layernorm_)
    backend_.layernorm_backward_partials(din, partial, dout, in, w_.value, st, st + N, N, C);
  else
    backend_.rmsnorm_backward_partials(din, partial, dout, in, w_.value, st, N, C);
  if (w_.grad == nullptr) return;  // frozen: the partials serve only the weights' gradients
  group_.all_gather(partial, sequence_.partials.data(), size_t(chunks) * size_t(width), comm::CommType::kF32)
      ->wait();
  const int64_t all = chunks * group_.size();  // the ranks hold consecutive rows: chunk order is rank order
  backend_.add_chunk_sums(w_.grad, sequence_.partials.data(), all, C, width);
  if (layernorm_) backend_.add_chunk_sums(b_.grad, sequence_.partials.data() + C, all, C, width);
}

void AllToAllTokenExchange::exchange_counts(const int64_t* send, int64_t* recv, int per_rank) {
  if (size() == 1) return TokenExchange::exchange_counts(send, recv, per_rank);
  send_.assign(size_t(size()), size_t(per_rank) * sizeof(int64_t));
  group_.all_to_all_v(send, send_.data(), recv, send_.data(), comm::CommType::kU8)->wait();
}

void AllToAllTokenExchange::exchange_rows(Backend&, const float* in, const int64_t* send_rows, float* out,
                                          const int64_t* recv_rows, int C) {
  send_.resize(size_t(size()));
  recv_.resize(size_t(size()));
  for (size_t r = 0; r < send_.size(); ++r) {
    send_[r] = size_t(send_rows[r]) * size_t(C);
    recv_[r] = size_t(recv_rows[r]) * size_t(C);
  }
  group_.all_to_all_v(in, send_.data(), out, recv_.data(), comm::CommType::kF32)->wait();
}

std::unique_ptr<Linear> ParallelPlan::linear(Backend& backend, ParamRef weight, ParamRef bias,
                                             bool add_bias) const {
  const ShardRule& rule = weight.info->shard;
  if (tp_.size() == 1 || rule.kind != ShardRule::Kind::kSplit) {
    // Every product between the norms is split: a whole one would see a cut input.
    if (sequence_) throw std::logic_error("ParallelPlan: sequence parallelism with an unsplit product");
    return LayerFactory::linear(backend, weight, bias, add_bias);
  }
  if (rule.dim == 0)
    return std::make_unique<ColumnParallelLinear>(backend, weight, bias, add_bias, tp_, sequence_.get());
  return std::make_unique<RowParallelLinear>(backend, weight, bias, add_bias, tp_, sequence_.get());
}

std::unique_ptr<Embedding> ParallelPlan::embedding(Backend& backend, ParamRef wte, ParamRef wpe) const {
  if (tp_.size() == 1) return LayerFactory::embedding(backend, wte, wpe);
  return std::make_unique<VocabParallelEmbedding>(backend, wte, wpe, tp_, sequence_.get());
}

void ContextRows::sum(double* values, size_t count) {
  cp_.all_reduce(values, count, comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
}

std::unique_ptr<Classifier> ParallelPlan::classifier(Backend& backend, ParamRef wte) const {
  std::unique_ptr<Classifier> out =
      tp_.size() == 1 ? LayerFactory::classifier(backend, wte)
                      : std::make_unique<VocabParallelCrossEntropy>(backend, wte, tp_, sequence_.get());
  out->set_row_group(rows_.get());
  return out;
}

std::unique_ptr<NormLayer> ParallelPlan::norm(Backend& backend, bool layernorm, float eps, ParamRef weight,
                                              ParamRef bias) const {
  if (!sequence_) return LayerFactory::norm(backend, layernorm, eps, weight, bias);
  return std::make_unique<SequenceParallelNorm>(backend, layernorm, eps, weight, bias, tp_, *sequence_);
}

int ParallelPlan::sequence_shards() const {
  return sequence_ ? tp_.size() : 1;
}

std::unique_ptr<ParallelPlan> ParallelPlan::context_only(comm::Comm& cp, ContextComm cp_comm) {
  std::unique_ptr<comm::Comm> tp = comm::self_comm("tp"), ep = comm::self_comm("ep");
  auto plan = std::make_unique<ParallelPlan>(*tp, *ep, cp, cp_comm);
  plan->own_tp_ = std::move(tp);
  plan->own_ep_ = std::move(ep);
  return plan;
}

namespace {

// Stage s receives from s - 1 and sends to s + 1; the last stage's logits are broadcast. Whether any rank
// decodes: over the expert-parallel group, then the pipeline (whose stages share their replica's rows), so
// every rank of the groups' product learns the same answer, the stages without MoE blocks too.
class ParallelDecodeLink final : public DecodeLink {
 public:
  ParallelDecodeLink(comm::Comm& pp, comm::Comm& ep) : pp_(pp), ep_(ep) {}
  void receive(float* rows, size_t count) override {
    pp_.recv(rows, count, comm::CommType::kF32, pp_.rank() - 1, kTag)->wait();
  }
  void send(const float* rows, size_t count) override {
    pp_.send(rows, count, comm::CommType::kF32, pp_.rank() + 1, kTag)->wait();
  }
  void share_logits(float* logits, size_t count) override {
    pp_.broadcast(logits, count, comm::CommType::kF32, pp_.size() - 1)->wait();
  }
  bool any(bool mine) override {
    int32_t flag = mine ? 1 : 0;
    for (comm::Comm* group : {&ep_, &pp_})
      if (group->size() > 1) group->all_reduce(&flag, 1, comm::CommType::kI32, comm::ReduceOp::kMax)->wait();
    return flag != 0;
  }

 private:
  // MPI's least tag bound: apart from a training step's (2 x micro-batch + 0 or 1).
  static constexpr int kTag = 32767;
  comm::Comm &pp_, &ep_;
};

}  // namespace

ParallelPlan::ParallelPlan(comm::Comm& tp, comm::Comm& ep, comm::Comm& cp, ContextComm cp_comm,
                           bool sequence_parallel, comm::Comm* pp)
    : tp_(tp),
      ep_(ep),
      cp_(cp),
      cp_comm_(cp_comm),
      context_(std::make_shared<ContextScratch>()),
      sequence_(sequence_parallel && tp.size() > 1 ? std::make_shared<SequenceScratch>() : nullptr),
      rows_(cp.size() > 1 ? std::make_unique<ContextRows>(cp) : nullptr),
      decoding_(pp != nullptr && (pp->size() > 1 || ep.size() > 1)
                    ? std::make_unique<ParallelDecodeLink>(*pp, ep)
                    : nullptr) {}

std::unique_ptr<Attention> ParallelPlan::attention(Backend& backend, const AttentionSettings& settings,
                                                   const AttentionWeights& w, int slots, int rows,
                                                   float* dqkv, float* datt) const {
  // Every model has attention slots, and this is where the plan learns the rows.
  if (sequence_) sequence_->reserve(backend, rows, int(w.proj.info->shape[0]), tp_.size(), settings.bf16);
  if (cp_.size() == 1) return LayerFactory::attention(backend, settings, w, slots, rows, dqkv, datt);
  auto qkv = linear(backend, w.qkv, w.qkv_bias, true), proj = linear(backend, w.proj, w.proj_bias, false);
  context_->reserve(backend, cp_comm_, rows, settings.shape, cp_.size(), settings.bf16);
  if (cp_comm_ == ContextComm::kAllToAll)
    return std::make_unique<AllToAllAttention>(cp_, context_, backend, settings, std::move(qkv),
                                               std::move(proj), w, slots, rows, dqkv, datt);
  return std::make_unique<RingAttention>(cp_, context_, backend, settings, std::move(qkv), std::move(proj), w,
                                         slots, rows, dqkv, datt);
}

size_t ParallelPlan::scratch_bytes() const {
  return context_->bytes() + (sequence_ ? sequence_->bytes() : 0);
}

void AllToAllTokenExchange::sum_over_context(double* values, int n) {
  context_.all_reduce(values, size_t(n), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
}

std::unique_ptr<TokenExchange> ParallelPlan::token_exchange() const {
  if (ep_.size() == 1 && cp_.size() == 1) return LayerFactory::token_exchange();
  return std::make_unique<AllToAllTokenExchange>(ep_, cp_);
}

}  // namespace forge::trainer
