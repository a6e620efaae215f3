// The GPT's forward and backward passes over the CPU kernels, and its buffers. A model object holds one
// slice of the logical model (ModelSlice): a range of blocks, optionally the embedding and the head, and
// one tensor-parallel shard of each, with the shard's group reductions made through the Comm interface
// (Megatron's scheme: column-parallel qkv and MLP-in, row-parallel projections, one reduction after each
// in forward and one after each input-gradient product in backward; vocabulary-parallel embedding and
// classifier).
#include "forge/trainer/model.h"

#include "cpu/kernels.h"
#include "forge/common/error.h"
#include "forge/trainer/comm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace forge::trainer {

namespace {

struct LayerOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fc2w, fc2b;
};

// The classifier's softmax statistics combined across the tensor-parallel group.
class TpReduce final : public cpu::GroupReduce {
 public:
  explicit TpReduce(Comm& comm) : comm_(comm) {}
  void max(float* v, int n) override {
    comm_.all_reduce(v, size_t(n), CommType::kF32, ReduceOp::kMax)->wait();
  }
  void sum(float* v, int n) override { comm_.all_reduce_sum(v, size_t(n)); }

 private:
  Comm& comm_;
};

}  // namespace

namespace {

// An input of a matrix product that backward reads again, one slab per layer of the slice. FP32 mode keeps
// it as computed. BF16 mode keeps it as 2-byte BF16 values (the values the BF16 model computes with, so
// nothing changes numerically): the layer being computed, or differentiated, works in one FP32 buffer
// (`work`, in Scratch) shared by every layer and micro-batch.
struct Saved {
  HugeBuffer<float> f32;
  HugeBuffer<uint16_t> bf16;
  HugeBuffer<float>* work = nullptr;
  int64_t per_layer = 0;

  Saved() = default;
  Saved(int64_t layers, int64_t n, HugeBuffer<float>* work_buffer) : work(work_buffer), per_layer(n) {
    if (work == nullptr)
      f32 = HugeBuffer<float>(size_t(layers * n));
    else
      bf16 = HugeBuffer<uint16_t>(size_t(layers * n));
  }
  // Where layer l's values are computed.
  float* at(int l) { return work != nullptr ? work->data() : f32.data() + l * per_layer; }
  // Keeps layer l's values, just computed at at(l): rounded to BF16 in BF16 mode.
  void keep(int l) {
    if (work == nullptr) return;
    // Rounded in place too: the rest of the layer computes with what is kept.
    cpu::to_bf16(bf16.data() + l * per_layer, work->data(), per_layer);
  }
  // Layer l's values for backward.
  const float* load(int l) {
    if (work == nullptr) return f32.data() + l * per_layer;
    cpu::from_bf16(work->data(), bf16.data() + l * per_layer, per_layer);
    return work->data();
  }
  size_t bytes() const { return f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t); }
};

}  // namespace

// Activations of one micro-batch in flight: per layer of the slice, what backward needs.
struct GPT::Acts {
  HugeBuffer<float> res;      // (L + 1) x [N, C]: stream entering each block, and leaving the last
  HugeBuffer<float> res_mid;  // L x [N, C]: after the attention residual
  Saved ln1, ln2;             // L x [N, C]
  HugeBuffer<float> ln1_stats, ln2_stats;  // L x 2 x [N] (mean, rstd)
  Saved qkv;                               // L x [N, 3C/tp]
  Saved att;                               // L x [N, C/tp]
  HugeBuffer<float> lse;                   // L x [B, NH/tp, T]
  Saved fc_pre, fc_act;                    // L x [N, 4C/tp]
  HugeBuffer<float> lnf, lnf_stats, dlnf;  // head: [N, C], 2 x [N], classifier gradient [N, C]
  HugeBuffer<float> dres;                  // [N, C]: gradient of the stream; after backward, of the input

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&res, &res_mid, &ln1_stats, &ln2_stats, &lse, &lnf, &lnf_stats, &dlnf, &dres})
      n += v->size() * sizeof(float);
    for (const auto* v : {&ln1, &ln2, &qkv, &att, &fc_pre, &fc_act}) n += v->bytes();
    return n;
  }
};

// Buffers reused by every layer and micro-batch, and the parameter offsets.
struct GPT::Scratch {
  HugeBuffer<float> delta, dln, datt, dqkv, dfc;
  // BF16 mode: the FP32 working buffers of the Saved activations, one layer each.
  HugeBuffer<float> ln1, ln2, qkv, att, fc_pre, fc_act;
  std::vector<LayerOffsets> layer;
  size_t wte = 0, wpe = 0, lnfw = 0, lnfb = 0;
  std::unique_ptr<TpReduce> vocab_group;

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&delta, &dln, &datt, &dqkv, &dfc, &ln1, &ln2, &qkv, &att, &fc_pre, &fc_act})
      n += v->size() * sizeof(float);
    return n;
  }
};

GPT::GPT(const ModelConfig& config, int batch, DType dtype, const ModelSlice& slice, int slots, Comm* tp,
         size_t flat_multiple)
    : config_(config), slice_(slice), batch_(batch), dtype_(dtype), tp_(tp) {
  if (slice_.last_layer < 0) slice_.last_layer = config.layers;
  params_ = parameter_table(config_, slice_);
  if (batch < 1) throw std::invalid_argument("GPT: batch must be >= 1");
  if (slots < 1) throw std::invalid_argument("GPT: slots must be >= 1");
  const int tps = slice_.tp_size;
  if (tps > 1 && (tp == nullptr || tp->size() != tps || tp->rank() != slice_.tp_rank))
    throw std::invalid_argument("GPT: a tensor-parallel slice needs its group's communicator");
  if (config.heads % tps != 0)
    throw std::invalid_argument("GPT: heads must divide by the tensor-parallel size");
  if (tps == 1) tp_ = nullptr;
  layers_ = slice_.last_layer - slice_.first_layer;
  const ParamInfo& last = params_.back();
  const size_t m = std::max<size_t>(flat_multiple, 1);
  const size_t flat = (last.offset + last.numel + m - 1) / m * m;
  weights_ = HugeBuffer<float>(flat);
  grads_ = HugeBuffer<float>(flat);
  if (dtype_ == DType::kBF16) work_ = HugeBuffer<float>(flat);

  const int64_t L = layers_, C = config.d_model, N = rows(), Cl = C / tps;
  scratch_ = std::make_unique<Scratch>();
  Scratch& s = *scratch_;
  s.delta = HugeBuffer<float>(size_t(N * C));
  s.dln = HugeBuffer<float>(size_t(N * C));
  s.datt = HugeBuffer<float>(size_t(N * Cl));
  s.dqkv = HugeBuffer<float>(size_t(N * 3 * Cl));
  s.dfc = HugeBuffer<float>(size_t(N * 4 * Cl));
  const bool bf16 = dtype_ == DType::kBF16;
  // The working buffer of a Saved activation of n values per layer (BF16 mode), or none (FP32).
  const auto work = [&](HugeBuffer<float>& buffer, int64_t n) -> HugeBuffer<float>* {
    if (!bf16) return nullptr;
    buffer = HugeBuffer<float>(size_t(n));
    return &buffer;
  };
  HugeBuffer<float>*w_ln1 = work(s.ln1, N * C), *w_ln2 = work(s.ln2, N * C), *w_qkv = work(s.qkv, N * 3 * Cl),
  *w_att = work(s.att, N * Cl), *w_fc_pre = work(s.fc_pre, N * 4 * Cl),
  *w_fc_act = work(s.fc_act, N * 4 * Cl);
  for (int slot = 0; slot < slots; ++slot) {
    auto a = std::make_unique<Acts>();
    a->res = HugeBuffer<float>(size_t((L + 1) * N * C));
    a->res_mid = HugeBuffer<float>(size_t(L * N * C));
    a->ln1 = Saved(L, N * C, w_ln1);
    a->ln2 = Saved(L, N * C, w_ln2);
    a->ln1_stats = HugeBuffer<float>(size_t(L * 2 * N));
    a->ln2_stats = HugeBuffer<float>(size_t(L * 2 * N));
    a->qkv = Saved(L, N * 3 * Cl, w_qkv);
    a->att = Saved(L, N * Cl, w_att);
    a->lse = HugeBuffer<float>(size_t(L * N * (config.heads / tps)));
    a->fc_pre = Saved(L, N * 4 * Cl, w_fc_pre);
    a->fc_act = Saved(L, N * 4 * Cl, w_fc_act);
    if (slice_.head) {
      a->lnf = HugeBuffer<float>(size_t(N * C));
      a->lnf_stats = HugeBuffer<float>(size_t(2 * N));
      a->dlnf = HugeBuffer<float>(size_t(N * C));
    }
    a->dres = HugeBuffer<float>(size_t(N * C));
    acts_.push_back(std::move(a));
  }
  if (slice_.embedding || slice_.head) s.wte = param("wte.weight").offset;
  if (slice_.embedding) s.wpe = param("wpe.weight").offset;
  if (slice_.head) {
    s.lnfw = param("lnf.weight").offset;
    s.lnfb = param("lnf.bias").offset;
  }
  for (int l = slice_.first_layer; l < slice_.last_layer; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const auto at = [&](const char* n) { return param(b + n).offset; };
    s.layer.push_back({at("ln1.weight"), at("ln1.bias"), at("attn.qkv.weight"), at("attn.qkv.bias"),
                       at("attn.proj.weight"), at("attn.proj.bias"), at("ln2.weight"), at("ln2.bias"),
                       at("mlp.fc.weight"), at("mlp.fc.bias"), at("mlp.proj.weight"), at("mlp.proj.bias")});
  }
  if (tp_ != nullptr) s.vocab_group = std::make_unique<TpReduce>(*tp_);
}

GPT::~GPT() = default;

const ParamInfo& GPT::param(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  throw std::invalid_argument("GPT: no parameter named '" + name + "'");
}

std::span<float> GPT::weight(const std::string& name) {
  const ParamInfo& p = param(name);
  return {weights_.data() + p.offset, p.numel};
}

std::span<float> GPT::grad(const std::string& name) {
  const ParamInfo& p = param(name);
  return {grads_.data() + p.offset, p.numel};
}

void GPT::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void GPT::weights_changed() {
  if (dtype_ == DType::kBF16) cpu::round_to_bf16(work_.data(), weights_.data(), int64_t(weights_.size()));
}

size_t GPT::activation_bytes() const {
  size_t n = scratch_->bytes();
  for (const auto& a : acts_) n += a->bytes();
  return n;
}

void GPT::tp_sum(float* data, int64_t n) {
  if (tp_ != nullptr) tp_->all_reduce_sum(data, size_t(n));
}

std::span<const float> GPT::output(int slot) const {
  const Acts& a = *acts_.at(size_t(slot));
  const size_t nc = size_t(rows()) * size_t(config_.d_model);
  return {a.res.data() + size_t(layers_) * nc, nc};
}

std::span<const float> GPT::input_grad(int slot) const {
  return acts_.at(size_t(slot))->dres;
}

void GPT::check_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets) const {
  if (!slice_.embedding || !slice_.head)
    throw std::invalid_argument("GPT: the whole-model calls need a slice with the embedding and the head");
  const size_t n = size_t(batch_) * size_t(config_.seq_len);
  if (tokens.size() != n || (!targets.empty() && targets.size() != n))
    fail(ExitCode::kData, "GPT: expected {} tokens (batch {} x seq_len {}), got {} inputs and {} targets", n,
         batch_, config_.seq_len, tokens.size(), targets.size());
  for (const auto* s : {&tokens, &targets})
    for (int32_t t : *s)
      if (t < 0 || t >= config_.vocab)
        fail(ExitCode::kData, "GPT: token id {} is outside the vocabulary [0, {})", t, config_.vocab);
}

float GPT::run_forward(int slot, const int32_t* tokens, const float* input, const int32_t* targets,
                       float grad_scale, bool backward, float* logits_out) {
  Acts& a = *acts_.at(size_t(slot));
  Scratch& s = *scratch_;
  const bool bf16 = dtype_ == DType::kBF16;
  const float* w = bf16 ? work_.data() : weights_.data();
  const int tps = slice_.tp_size;
  const int B = batch_, T = config_.seq_len, C = config_.d_model, L = layers_;
  const int Cl = C / tps, NHl = config_.heads / tps, Vl = config_.vocab / tps, v0 = slice_.tp_rank * Vl;
  const int N = B * T;
  const int64_t NC = int64_t(N) * C;
  // BF16 mode keeps what backward reads from the matrix products (their inputs) as BF16 values (Saved);
  // the residual stream, statistics and all accumulation stay FP32.
  if (slice_.embedding) {
    // Vocabulary-parallel lookup: each rank adds the rows it holds, rank 0 the positions; the sum over
    // the group is the full embedding.
    cpu::embedding_forward(a.res.data(), tokens, w + s.wte, slice_.tp_rank == 0 ? w + s.wpe : nullptr, B, T,
                           C, v0, v0 + Vl);
    tp_sum(a.res.data(), NC);
  } else {
    std::memcpy(a.res.data(), input, sizeof(float) * size_t(NC));
  }
  for (int l = 0; l < L; ++l) {
    const LayerOffsets& o = s.layer[size_t(l)];
    float* x = a.res.data() + l * NC;
    float* ln1 = a.ln1.at(l);
    float* ln1s = a.ln1_stats.data() + int64_t(l) * 2 * N;
    float* qkv = a.qkv.at(l);
    float* att = a.att.at(l);
    float* mid = a.res_mid.data() + l * NC;
    float* ln2 = a.ln2.at(l);
    float* ln2s = a.ln2_stats.data() + int64_t(l) * 2 * N;
    float* fc_pre = a.fc_pre.at(l);
    float* fc_act = a.fc_act.at(l);
    if (l == 0) {
      cpu::layernorm_forward(ln1, ln1s, ln1s + N, x, w + o.ln1w, w + o.ln1b, N, C);
      a.ln1.keep(l);
    }
    cpu::matmul_forward(qkv, ln1, w + o.qkvw, w + o.qkvb, N, C, 3 * Cl);
    a.qkv.keep(l);
    cpu::attention_forward(att, a.lse.data() + int64_t(l) * N * NHl, qkv, B, T, Cl, NHl);
    a.att.keep(l);
    cpu::matmul_forward(s.delta.data(), att, w + o.projw, nullptr, N, Cl, C);
    tp_sum(s.delta.data(), NC);
    cpu::residual_layernorm_forward(mid, ln2, ln2s, ln2s + N, x, s.delta.data(), w + o.projb, w + o.ln2w,
                                    w + o.ln2b, N, C);
    a.ln2.keep(l);
    cpu::matmul_forward(fc_pre, ln2, w + o.fcw, nullptr, N, C, 4 * Cl);
    cpu::bias_gelu_forward(fc_act, fc_pre, w + o.fcb, N, 4 * Cl);
    a.fc_pre.keep(l);
    a.fc_act.keep(l);
    cpu::matmul_forward(s.delta.data(), fc_act, w + o.fc2w, nullptr, N, 4 * Cl, C);
    tp_sum(s.delta.data(), NC);
    // The next LayerNorm (the next block's ln1, or lnf) is fused with this residual add; a stage's last
    // block without the head hands the plain stream to the next stage, which owns that LayerNorm.
    if (l + 1 < L || slice_.head) {
      const bool last = l + 1 == L;
      const LayerOffsets* next = last ? nullptr : &s.layer[size_t(l) + 1];
      float* ln_next = last ? a.lnf.data() : a.ln1.at(l + 1);
      float* stats_next = last ? a.lnf_stats.data() : a.ln1_stats.data() + int64_t(l + 1) * 2 * N;
      cpu::residual_layernorm_forward(x + NC, ln_next, stats_next, stats_next + N, mid, s.delta.data(),
                                      w + o.fc2b, w + (last ? s.lnfw : next->ln1w),
                                      w + (last ? s.lnfb : next->ln1b), N, C);
      if (!last)
        a.ln1.keep(l + 1);
      else if (bf16)
        cpu::round_to_bf16(ln_next, NC);
    } else {
      cpu::residual_forward(x + NC, mid, s.delta.data(), w + o.fc2b, N, C);
    }
  }
  if (!slice_.head) return 0.0f;
  if (L == 0) {
    cpu::layernorm_forward(a.lnf.data(), a.lnf_stats.data(), a.lnf_stats.data() + N, a.res.data(), w + s.lnfw,
                           w + s.lnfb, N, C);
    if (bf16) cpu::round_to_bf16(a.lnf.data(), NC);
  }
  const double total = cpu::classifier_forward_backward(
      backward ? a.dlnf.data() : nullptr, grads_.data() + s.wte, a.lnf.data(), w + s.wte, targets, N, C, Vl,
      grad_scale / float(N), logits_out, s.vocab_group.get(), v0);
  if (backward) tp_sum(a.dlnf.data(), NC);
  return float(total / N);
}

float GPT::forward(int slot, const int32_t* tokens, const float* input, const int32_t* targets,
                   float grad_scale, bool backward) {
  return run_forward(slot, tokens, input, targets, grad_scale, backward, nullptr);
}

void GPT::backward(int slot, const int32_t* tokens, const float* d_output,
                   const std::function<void(int)>& on_grads) {
  Acts& a = *acts_.at(size_t(slot));
  Scratch& s = *scratch_;
  const float* w = dtype_ == DType::kBF16 ? work_.data() : weights_.data();
  float* g = grads_.data();
  const int tps = slice_.tp_size;
  const int B = batch_, T = config_.seq_len, C = config_.d_model, L = layers_;
  const int Cl = C / tps, NHl = config_.heads / tps, Vl = config_.vocab / tps, v0 = slice_.tp_rank * Vl;
  const int N = B * T;
  const int64_t NC = int64_t(N) * C;
  float* dres = a.dres.data();
  const auto done = [&](int layer) {
    if (on_grads) on_grads(layer);
  };
  if (slice_.head) {
    std::fill(a.dres.begin(), a.dres.end(), 0.0f);
    // a.dlnf holds dL/d(lnf output) from the classifier.
    cpu::layernorm_backward(dres, g + s.lnfw, g + s.lnfb, a.dlnf.data(), a.res.data() + L * NC, w + s.lnfw,
                            a.lnf_stats.data(), a.lnf_stats.data() + N, N, C);
    done(config_.layers);
  } else {
    std::memcpy(dres, d_output, sizeof(float) * size_t(NC));
  }
  for (int l = L - 1; l >= 0; --l) {
    const LayerOffsets& o = s.layer[size_t(l)];
    const float* x = a.res.data() + l * NC;
    const float* ln1 = a.ln1.load(l);
    const float* ln1s = a.ln1_stats.data() + int64_t(l) * 2 * N;
    const float* qkv = a.qkv.load(l);
    const float* att = a.att.load(l);
    const float* mid = a.res_mid.data() + l * NC;
    const float* ln2 = a.ln2.load(l);
    const float* ln2s = a.ln2_stats.data() + int64_t(l) * 2 * N;
    const float* fc_pre = a.fc_pre.load(l);
    const float* fc_act = a.fc_act.load(l);
    // dres = dL/d(block output) = dL/d(mlp delta): MLP backward.
    cpu::matmul_backward(s.dfc.data(), g + o.fc2w, g + o.fc2b, dres, fc_act, w + o.fc2w, N, 4 * Cl, C);
    cpu::gelu_backward(s.dfc.data(), fc_pre, N, 4 * Cl);
    cpu::matmul_backward(s.dln.data(), g + o.fcw, g + o.fcb, s.dfc.data(), ln2, w + o.fcw, N, C, 4 * Cl);
    tp_sum(s.dln.data(), NC);
    cpu::layernorm_backward(dres, g + o.ln2w, g + o.ln2b, s.dln.data(), mid, w + o.ln2w, ln2s, ln2s + N, N,
                            C);
    // dres = dL/d(res_mid): attention backward.
    cpu::matmul_backward(s.datt.data(), g + o.projw, g + o.projb, dres, att, w + o.projw, N, Cl, C);
    cpu::attention_backward(s.dqkv.data(), s.datt.data(), qkv, att, a.lse.data() + int64_t(l) * N * NHl, B, T,
                            Cl, NHl);
    cpu::matmul_backward(s.dln.data(), g + o.qkvw, g + o.qkvb, s.dqkv.data(), ln1, w + o.qkvw, N, C, 3 * Cl);
    tp_sum(s.dln.data(), NC);
    cpu::layernorm_backward(dres, g + o.ln1w, g + o.ln1b, s.dln.data(), x, w + o.ln1w, ln1s, ln1s + N, N, C);
    done(slice_.first_layer + l);
  }
  if (slice_.embedding) {
    cpu::embedding_backward(g + s.wte, g + s.wpe, dres, tokens, B, T, C, v0, v0 + Vl);
    done(-1);
  }
}

float GPT::forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                            float grad_scale) {
  check_tokens(tokens, targets);
  const float loss = run_forward(0, tokens.data(), nullptr, targets.data(), grad_scale, true, nullptr);
  backward(0, tokens.data(), nullptr);
  return loss;
}

float GPT::forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  check_tokens(tokens, targets);
  return run_forward(0, tokens.data(), nullptr, targets.data(), 1.0f, false, nullptr);
}

void GPT::forward_logits(std::span<const int32_t> tokens, std::span<float> logits) {
  check_tokens(tokens, {});
  if (slice_.tp_size != 1 || !slice_.embedding || !slice_.head)
    throw std::invalid_argument("GPT::forward_logits: needs the whole model on one rank");
  if (logits.size() != size_t(batch_) * config_.seq_len * config_.vocab)
    throw std::invalid_argument("GPT::forward_logits: logits must hold batch x seq_len x vocab values");
  // Targets only feed the loss, which is discarded here: class 0 for every row.
  std::vector<int32_t> zeros(size_t(batch_) * config_.seq_len, 0);
  run_forward(0, tokens.data(), nullptr, zeros.data(), 1.0f, false, logits.data());
}

}  // namespace forge::trainer
