// The GPT's forward and backward passes over a backend's ops, and its buffers. A model object holds one
// slice of the logical model (ModelSlice): a range of blocks, optionally the embedding and the head. How
// its layers are split, and the collectives that go with the split, belong to the layers the factory made
// (layers.h); this file never talks to another process.
#include "forge/trainer/model.h"

#include "forge/common/error.h"
#include "forge/trainer/moe.h"
#include "forge/trainer/trace.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace forge::trainer {

namespace {

// The dense MLP: fc (column-parallel when split) with its bias and GELU fused, proj (row-parallel when
// split).
class DenseMLP final : public FeedForward {
 public:
  DenseMLP(Backend& backend, std::unique_ptr<Linear> fc, std::unique_ptr<Linear> proj, int slots, int rows,
           bool bf16, float* dfc)
      : backend_(backend), fc_(std::move(fc)), proj_(std::move(proj)), dfc_(dfc) {
    const size_t n = size_t(rows) * size_t(fc_->out_features());
    for (int s = 0; s < slots; ++s) {
      pre_.emplace_back(backend, n, bf16);
      act_.emplace_back(backend, n, bf16);
    }
  }
  void forward(int slot, ConstAct in, float* out, int rows) override {
    Act act = act_[size_t(slot)].at();
    fc_->forward_gelu(act, pre_[size_t(slot)].at(), in, rows);
    proj_->forward(out, act, rows);
  }
  void backward(int slot, ConstAct in, const float* dout, float* din, int rows) override {
    proj_->backward(dfc_, dout, act_[size_t(slot)].at(), rows);
    backend_.gelu_backward(dfc_, pre_[size_t(slot)].at(), rows, fc_->out_features());
    fc_->backward(din, dfc_, in, rows);
  }
  const float* output_bias() const override { return proj_->bias(); }
  size_t activation_bytes() const override {
    size_t n = 0;
    for (size_t s = 0; s < pre_.size(); ++s) n += pre_[s].bytes() + act_[s].bytes();
    return n;
  }

 private:
  Backend& backend_;
  std::unique_ptr<Linear> fc_, proj_;
  float* dfc_;
  std::vector<ActBuffer> pre_, act_;  // per slot: fc output before and after the GELU
};

// First position of each position's document: what attention needs of the segment ids.
void document_starts(const MicroBatch& b, std::vector<int32_t>& out) {
  out.resize(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const bool opens = i % size_t(b.seq_len) == 0 || b.segments[i] != b.segments[i - 1];
    out[i] = opens ? int32_t(i % size_t(b.seq_len)) : out[i - 1];
  }
}

}  // namespace

// Buffers reused by every block and micro-batch.
struct GPT::Workspace {
  Buffer<float> delta, dln, datt, dqkv, dfc;

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&delta, &dln, &datt, &dqkv, &dfc}) n += v->size() * sizeof(float);
    return n;
  }
};

// One block of the slice: its layers and, per activation set, what its backward reads.
struct GPT::Block {
  ParamRef ln1w, ln1b, ln2w, ln2b;
  std::unique_ptr<Linear> qkv, proj;
  std::unique_ptr<FeedForward> ffn;
  struct Acts {
    Buffer<float> res_mid;               // after the attention residual
    Buffer<float> ln1_stats, ln2_stats;  // 2 x [N] (mean, rstd)
    Buffer<float> lse;                   // [B, NH/tp, T]
    ActBuffer ln1, ln2, qkv, att;        // what backward reads again: BF16 in BF16 mode
  };
  std::vector<Acts> acts;

  size_t bytes() const {
    size_t n = ffn->activation_bytes();
    for (const Acts& a : acts) {
      for (const auto* v : {&a.res_mid, &a.ln1_stats, &a.ln2_stats, &a.lse}) n += v->size() * sizeof(float);
      for (const auto* v : {&a.ln1, &a.ln2, &a.qkv, &a.att}) n += v->bytes();
    }
    return n;
  }
};

// One micro-batch in flight: the residual stream, the head's activations, and the batch itself.
struct GPT::Slot {
  Buffer<float> res;                   // (L + 1) x [N, C]: stream entering each block, and leaving the last
  Buffer<float> lnf, lnf_stats, dlnf;  // head: [N, C], 2 x [N], classifier gradient [N, C]
  Buffer<float> dres;                  // [N, C]: gradient of the stream; after backward, of the input
  Buffer<int32_t> inputs, targets, positions, doc_start;  // device backends: the batch's copies
  Buffer<float> weights;
  std::vector<int32_t> doc_start_host;
  std::vector<int32_t> targets_host;  // a next-token batch's targets, written out for the loss
  DeviceBatch batch;
  std::vector<int32_t> decode_host;  // decode(): tokens, positions, cache sequences
  Buffer<int32_t> decode;            // device backends: their copy

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&res, &lnf, &lnf_stats, &dlnf, &dres, &weights}) n += v->size() * sizeof(float);
    for (const auto* v : {&inputs, &targets, &positions, &doc_start, &decode})
      n += v->size() * sizeof(int32_t);
    return n;
  }
};

GPT::GPT(const ModelConfig& config, int batch, DType dtype, const ModelSlice& slice, int slots,
         Backend& backend, const LayerFactory& layers, size_t flat_multiple, std::shared_ptr<const Loss> loss)
    : config_(config),
      slice_(slice),
      batch_(batch),
      dtype_(dtype),
      backend_(backend),
      loss_(loss != nullptr ? std::move(loss) : std::make_shared<LmCrossEntropy>()) {
  if (slice_.last_layer < 0) slice_.last_layer = config.layers;
  params_ = parameter_table(config_, slice_, std::max<size_t>(flat_multiple, 1));
  if (batch < 1) throw std::invalid_argument("GPT: batch must be >= 1");
  if (slots < 1) throw std::invalid_argument("GPT: slots must be >= 1");
  const int tps = slice_.tp_size;
  if (config.heads % tps != 0)
    throw std::invalid_argument("GPT: heads must divide by the tensor-parallel size");
  layers_ = slice_.last_layer - slice_.first_layer;
  const ParamInfo& last = params_.back();
  const size_t m = std::max<size_t>(flat_multiple, 1);
  const size_t flat = (last.offset + last.numel + m - 1) / m * m;
  weights_ = backend.alloc<float>(flat);
  grads_ = backend.alloc<float>(flat);
  const bool bf16 = dtype_ == DType::kBF16;
  if (bf16) work_ = backend.alloc<float>(flat);

  const size_t L = size_t(layers_), C = size_t(config.d_model), N = size_t(rows()), Cl = C / size_t(tps);
  ws_ = std::make_unique<Workspace>();
  Workspace& w = *ws_;
  w.delta = backend.alloc<float>(N * C);
  w.dln = backend.alloc<float>(N * C);
  w.datt = backend.alloc<float>(N * Cl);
  w.dqkv = backend.alloc<float>(N * 3 * Cl);
  w.dfc = backend.alloc<float>(N * 4 * Cl);

  for (int s = 0; s < slots; ++s) {
    auto slot = std::make_unique<Slot>();
    slot->res = backend.alloc<float>((L + 1) * N * C);
    if (slice_.head) {
      slot->lnf = backend.alloc<float>(N * C);
      slot->lnf_stats = backend.alloc<float>(2 * N);
      slot->dlnf = backend.alloc<float>(N * C);
    }
    slot->dres = backend.alloc<float>(N * C);
    slots_.push_back(std::move(slot));
  }
  for (int l = slice_.first_layer; l < slice_.last_layer; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    auto block = std::make_unique<Block>();
    block->ln1w = ref(b + "ln1.weight");
    block->ln1b = ref(b + "ln1.bias");
    block->ln2w = ref(b + "ln2.weight");
    block->ln2b = ref(b + "ln2.bias");
    block->qkv = layers.linear(backend, ref(b + "attn.qkv.weight"), ref(b + "attn.qkv.bias"), true);
    block->proj = layers.linear(backend, ref(b + "attn.proj.weight"), ref(b + "attn.proj.bias"), false);
    if (config.moe_block(l)) {
      const MoeSettings moe{config.experts,         config.top_k,         config.capacity_factor,
                            config.router_aux_coef, config.router_z_coef, bf16};
      // The router computes in FP32: its master weights, also in BF16 mode.
      const ParamInfo& router = param(b + "moe.router.weight");
      auto layer = std::make_unique<MoeLayer>(
          backend, moe, l, ParamRef{&router, weights_.data() + router.offset, grads_.data() + router.offset},
          ref(b + "moe.fc.weight"), ref(b + "moe.fc.bias"), ref(b + "moe.proj.weight"),
          ref(b + "moe.proj.bias"), layers.token_exchange(), slots, int(N));
      moe_layers_.push_back(layer.get());
      block->ffn = std::move(layer);
    } else {
      block->ffn = std::make_unique<DenseMLP>(
          backend, layers.linear(backend, ref(b + "mlp.fc.weight"), ref(b + "mlp.fc.bias"), false),
          layers.linear(backend, ref(b + "mlp.proj.weight"), ref(b + "mlp.proj.bias"), false), slots, int(N),
          bf16, w.dfc.data());
    }
    for (int s = 0; s < slots; ++s) {
      Block::Acts a;
      a.res_mid = backend.alloc<float>(N * C);
      a.ln1_stats = backend.alloc<float>(2 * N);
      a.ln2_stats = backend.alloc<float>(2 * N);
      a.lse = backend.alloc<float>(N * size_t(config.heads / tps));
      a.ln1 = ActBuffer(backend, N * C, bf16);
      a.ln2 = ActBuffer(backend, N * C, bf16);
      a.qkv = ActBuffer(backend, N * 3 * Cl, bf16);
      a.att = ActBuffer(backend, N * Cl, bf16);
      block->acts.push_back(std::move(a));
    }
    blocks_.push_back(std::move(block));
  }
  if (slice_.embedding) embedding_ = layers.embedding(backend, ref("wte.weight"), ref("wpe.weight"));
  if (slice_.head) {
    classifier_ = layers.classifier(backend, ref("wte.weight"));
    lnf_w_ = ref("lnf.weight");
    lnf_b_ = ref("lnf.bias");
  }
}

GPT::~GPT() = default;

ParamRef GPT::ref(const std::string& name) {
  const ParamInfo& p = param(name);
  const float* values = (dtype_ == DType::kBF16 ? work_.data() : weights_.data()) + p.offset;
  return {&p, values, grads_.data() + p.offset};
}

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

void GPT::init(uint64_t seed) {
  std::vector<float> staging;
  for (const auto& p : params_) {
    if (backend_.host_memory()) {
      init_parameter(p, slice_, seed, weight(p.name));
      continue;
    }
    staging.resize(p.numel);
    init_parameter(p, slice_, seed, staging);
    backend_.copy_from_host(weights_.data() + p.offset, staging.data(), p.numel * sizeof(float));
  }
  weights_changed();
}

void GPT::zero_grad() {
  backend_.fill(grads_.data(), 0.0f, grads_.size());
}

void GPT::weights_changed() {
  weights_changed({0, weights_.size()});
}

void GPT::weights_changed(FlatRange part) {
  if (dtype_ != DType::kBF16 || part.hi <= part.lo) return;
  backend_.round_to_bf16(work_.data() + part.lo, weights_.data() + part.lo, part.hi - part.lo);
  backend_.bf16_working_copy(work_.data() + part.lo, part.hi - part.lo);
}

void GPT::set_router_loss_weight(float weight) {
  for (MoeLayer* m : moe_layers_) m->set_loss_weight(weight);
}

std::vector<RouterStats> GPT::take_router_stats() {
  std::vector<RouterStats> out;
  for (MoeLayer* m : moe_layers_) out.push_back(m->take_stats());
  return out;
}

size_t GPT::activation_bytes() const {
  size_t n = ws_->bytes();
  for (const auto& s : slots_) n += s->bytes();
  for (const auto& b : blocks_) n += b->bytes();
  return n;
}

std::span<const float> GPT::output(int slot) const {
  const Slot& s = *slots_.at(size_t(slot));
  const size_t nc = size_t(rows()) * size_t(config_.d_model);
  return {s.res.data() + size_t(layers_) * nc, nc};
}

std::span<const float> GPT::input_grad(int slot) const {
  return slots_.at(size_t(slot))->dres.span();
}

LossSums GPT::run_forward(int slot, const MicroBatch& batch, const float* input, float loss_scale,
                          bool backward, float* logits_out, bool classify,
                          const std::function<void(int)>& before_weights) {
  Slot& s = *slots_.at(size_t(slot));
  if (batch.rows != batch_ || batch.seq_len != config_.seq_len)
    throw std::invalid_argument("GPT: the micro-batch is not batch x seq_len");
  // The micro-batch where the backend reads it, for this forward and the backward that follows: the
  // caller's own vectors on a host backend (the batch outlives the step), copies in device memory else.
  const size_t n = batch.size();
  const auto place = [&](auto& buffer, const auto& values) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    if (values.empty()) return static_cast<const T*>(nullptr);
    if (backend_.host_memory()) return values.data();
    if (buffer.size() != n) buffer = backend_.alloc<T>(n);
    backend_.copy_from_host(buffer.data(), values.data(), n * sizeof(T));
    return static_cast<const T*>(buffer.data());
  };
  s.batch.inputs = place(s.inputs, batch.inputs);
  if (batch.form() == MicroBatch::Targets::kNextToken) {
    s.targets_host.resize(n);
    batch.copy_targets(s.targets_host.data());
    s.batch.targets = place(s.targets, s.targets_host);
  } else {
    s.batch.targets = place(s.targets, batch.targets);
  }
  s.batch.weights = place(s.weights, batch.weights);
  s.batch.positions = place(s.positions, batch.positions);
  s.doc_start_host.clear();
  if (!batch.segments.empty()) document_starts(batch, s.doc_start_host);
  s.batch.doc_start = place(s.doc_start, s.doc_start_host);
  s.batch.host = &batch;

  const int B = batch_, T = config_.seq_len, Cl = config_.d_model / slice_.tp_size;
  const int NHl = config_.heads / slice_.tp_size;
  if (before_weights) before_weights(-1);
  if (slice_.embedding) {
    TraceSpan span("forward embedding", "compute");
    embedding_->forward(s.res.data(), s.batch.inputs, s.batch.positions, B, T);
  } else {
    backend_.copy(s.res.data(), input, sizeof(float) * size_t(rows()) * size_t(config_.d_model));
  }
  run_blocks(
      slot, B * T,
      [&](int, Act att, float* lse, ConstAct qkv) {
        backend_.attention_forward(att, lse, qkv, s.batch.doc_start, B, T, Cl, NHl);
      },
      before_weights);
  if (!slice_.head) return {};
  TraceSpan span("forward head + loss", "compute");
  if (!classify) return {};
  const double loss = classifier_->forward_backward(backward ? s.dlnf.data() : nullptr, s.lnf.data(), s.batch,
                                                    int(rows()), *loss_, loss_scale, logits_out);
  return {loss, loss_->weight(batch)};
}

void GPT::run_blocks(int slot, int N, const std::function<void(int, Act, float*, ConstAct)>& attend,
                     const std::function<void(int)>& before_weights) {
  Slot& s = *slots_.at(size_t(slot));
  Workspace& w = *ws_;
  const auto need = [&](int layer) {
    if (before_weights) before_weights(slice_.first_layer + layer);
  };
  const bool bf16 = dtype_ == DType::kBF16;
  const int C = config_.d_model, L = layers_;
  const int64_t NC = int64_t(N) * C;
  // BF16 mode stores the inputs of the matrix products and of the attention as BF16 (ActBuffer), the ops
  // writing them rounded; the residual stream, statistics and all accumulation stay FP32. The final
  // LayerNorm's output stays BF16 values held in FP32: the classifier's chunks read it, one per slot.
  for (int l = 0; l < L; ++l) {
    TraceSpan span("forward block", "compute", slice_.first_layer + l);
    Block& k = *blocks_[size_t(l)];
    Block::Acts& a = k.acts[size_t(slot)];
    float* x = s.res.data() + l * NC;
    need(l);
    float* ln1s = a.ln1_stats.data();
    float* ln2s = a.ln2_stats.data();
    if (l == 0) backend_.layernorm_forward(a.ln1.at(), ln1s, ln1s + N, x, k.ln1w.value, k.ln1b.value, N, C);
    k.qkv->forward(a.qkv.at(), a.ln1.at(), N);
    attend(l, a.att.at(), a.lse.data(), a.qkv.at());
    k.proj->forward(w.delta.data(), a.att.at(), N);
    backend_.residual_layernorm_forward(a.res_mid.data(), a.ln2.at(), ln2s, ln2s + N, x, w.delta.data(),
                                        k.proj->bias(), k.ln2w.value, k.ln2b.value, N, C);
    k.ffn->forward(slot, a.ln2.at(), w.delta.data(), N);
    // The next LayerNorm (the next block's ln1, or lnf) is fused with this residual add; a stage's last
    // block without the head hands the plain stream to the next stage, which owns that LayerNorm.
    if (l + 1 < L || slice_.head) {
      const bool last = l + 1 == L;
      need(l + 1);  // its LayerNorm: the next block's, or the final one (layer config.layers)
      Block* next = last ? nullptr : blocks_[size_t(l) + 1].get();
      Block::Acts* na = last ? nullptr : &next->acts[size_t(slot)];
      const Act ln_next = last ? Act(s.lnf.data()) : na->ln1.at();
      float* stats_next = last ? s.lnf_stats.data() : na->ln1_stats.data();
      backend_.residual_layernorm_forward(
          x + NC, ln_next, stats_next, stats_next + N, a.res_mid.data(), w.delta.data(), k.ffn->output_bias(),
          last ? lnf_w_.value : next->ln1w.value, last ? lnf_b_.value : next->ln1b.value, N, C);
      if (last && bf16) backend_.round_to_bf16(s.lnf.data(), s.lnf.data(), size_t(NC));
    } else {
      backend_.residual_forward(x + NC, a.res_mid.data(), w.delta.data(), k.ffn->output_bias(), N, C);
    }
  }
  if (slice_.head && L == 0) {
    need(0);
    backend_.layernorm_forward(s.lnf.data(), s.lnf_stats.data(), s.lnf_stats.data() + N, s.res.data(),
                               lnf_w_.value, lnf_b_.value, N, C);
    if (bf16) backend_.round_to_bf16(s.lnf.data(), s.lnf.data(), size_t(NC));
  }
}

LossSums GPT::forward(int slot, const MicroBatch& batch, const float* input, float loss_scale, bool backward,
                      const std::function<void(int)>& before_weights) {
  return run_forward(slot, batch, input, loss_scale, backward, nullptr, true, before_weights);
}

void GPT::backward(int slot, const float* d_output, const std::function<void(int)>& on_grads) {
  Slot& s = *slots_.at(size_t(slot));
  Workspace& w = *ws_;
  const int B = batch_, T = config_.seq_len, C = config_.d_model, L = layers_;
  const int Cl = C / slice_.tp_size, NHl = config_.heads / slice_.tp_size;
  const int N = B * T;
  const int64_t NC = int64_t(N) * C;
  float* dres = s.dres.data();
  const auto done = [&](int layer) {
    if (on_grads) on_grads(layer);
  };
  if (slice_.head) {
    TraceSpan span("backward head", "compute");
    backend_.fill(dres, 0.0f, size_t(NC));
    // s.dlnf holds dL/d(lnf output) from the classifier.
    backend_.layernorm_backward(dres, lnf_w_.grad, lnf_b_.grad, s.dlnf.data(), s.res.data() + L * NC,
                                lnf_w_.value, s.lnf_stats.data(), s.lnf_stats.data() + N, N, C);
    done(config_.layers);
  } else {
    backend_.copy(dres, d_output, sizeof(float) * size_t(NC));
  }
  for (int l = L - 1; l >= 0; --l) {
    TraceSpan span("backward block", "compute", slice_.first_layer + l);
    Block& k = *blocks_[size_t(l)];
    Block::Acts& a = k.acts[size_t(slot)];
    const float* x = s.res.data() + l * NC;
    const ConstAct ln1 = a.ln1.at(), qkv = a.qkv.at(), att = a.att.at(), ln2 = a.ln2.at();
    const float* ln1s = a.ln1_stats.data();
    const float* ln2s = a.ln2_stats.data();
    // dres = dL/d(block output) = dL/d(FFN output): FFN backward, then its LayerNorm.
    k.ffn->backward(slot, ln2, dres, w.dln.data(), N);
    backend_.layernorm_backward(dres, k.ln2w.grad, k.ln2b.grad, w.dln.data(), a.res_mid.data(), k.ln2w.value,
                                ln2s, ln2s + N, N, C);
    // dres = dL/d(res_mid): attention backward.
    k.proj->backward(w.datt.data(), dres, att, N);
    backend_.attention_backward(w.dqkv.data(), w.datt.data(), qkv, att, a.lse.data(), s.batch.doc_start, B, T,
                                Cl, NHl);
    k.qkv->backward(w.dln.data(), w.dqkv.data(), ln1, N);
    backend_.layernorm_backward(dres, k.ln1w.grad, k.ln1b.grad, w.dln.data(), x, k.ln1w.value, ln1s, ln1s + N,
                                N, C);
    done(slice_.first_layer + l);
  }
  if (slice_.embedding) {
    TraceSpan span("backward embedding", "compute");
    embedding_->backward(dres, s.batch.inputs, s.batch.positions, B, T);
    done(-1);
  }
}

void GPT::check(const MicroBatch& batch) const {
  if (batch.rows != batch_ || batch.seq_len != config_.seq_len)
    fail(ExitCode::kData,
         "a micro-batch of {} x {} positions, but the model trains {} x {} (data.batch x "
         "model.seq_len)",
         batch.rows, batch.seq_len, batch_, config_.seq_len);
  if (const auto problem = batch.problem(config_.vocab, config_.max_positions))
    fail(ExitCode::kData, "{}", *problem);
}

void GPT::check_whole(const MicroBatch& batch) const {
  if (!slice_.embedding || !slice_.head)
    throw std::invalid_argument("GPT: the whole-model calls need a slice with the embedding and the head");
  check(batch);
}

LossSums GPT::forward_backward(const MicroBatch& batch, float loss_scale) {
  check_whole(batch);
  const LossSums sums = run_forward(0, batch, nullptr, loss_scale, true, nullptr);
  backward(0, nullptr);
  return sums;
}

LossSums GPT::forward_loss(const MicroBatch& batch) {
  check_whole(batch);
  return run_forward(0, batch, nullptr, 1.0f, false, nullptr);
}

void GPT::forward_logits(const MicroBatch& batch, std::span<float> logits) {
  check_whole(batch);
  if (slice_.tp_size != 1)
    throw std::invalid_argument("GPT::forward_logits: needs the whole model on one rank");
  if (logits.size() != size_t(batch_) * config_.seq_len * config_.vocab)
    throw std::invalid_argument("GPT::forward_logits: logits must hold batch x seq_len x vocab values");
  run_forward(0, batch, nullptr, 1.0f, false, logits.data());
}

KvCache::KvCache(GPT& model, int sequences, int max_len) : sequences_(sequences), max_len_(max_len) {
  const ModelConfig& c = model.config();
  if (sequences < 1 || max_len < 1 || max_len > c.max_positions)
    throw std::invalid_argument("KvCache: needs >= 1 sequence and 1 to max_positions positions");
  const size_t n = size_t(sequences) * size_t(max_len) * size_t(c.d_model);
  for (int l = model.slice().first_layer; l < model.slice().last_layer; ++l) {
    keys_.push_back(model.backend().alloc<float>(n));
    values_.push_back(model.backend().alloc<float>(n));
  }
}

size_t KvCache::bytes() const {
  size_t n = 0;
  for (const auto& b : keys_) n += 2 * b.size() * sizeof(float);
  return n;
}

void GPT::decode(KvCache& cache, std::span<const DecodeRow> rows, std::span<const int> logit_rows,
                 std::span<float> logits) {
  if (!slice_.embedding || !slice_.head || slice_.tp_size != 1)
    throw std::invalid_argument("GPT::decode: needs the whole model on one rank");
  if (cache.keys_.size() != blocks_.size())
    throw std::invalid_argument("GPT::decode: the cache was made for another model");
  const int N = int(rows.size()), C = config_.d_model, V = config_.vocab;
  if (N < 1 || N > this->rows()) throw std::invalid_argument("GPT::decode: 1 to rows() rows at a time");
  if (logits.size() != logit_rows.size() * size_t(V))
    throw std::invalid_argument("GPT::decode: logits must hold logit_rows x vocab values");
  Slot& s = *slots_[0];
  s.decode_host.resize(3 * size_t(N));
  int32_t *tokens = s.decode_host.data(), *positions = tokens + N, *seq = positions + N;
  for (int r = 0; r < N; ++r) {
    const DecodeRow& row = rows[size_t(r)];
    if (row.sequence < 0 || row.sequence >= cache.sequences() || row.position < 0 ||
        row.position >= cache.max_len() || row.token < 0 || row.token >= V)
      throw std::invalid_argument("GPT::decode: a row outside the cache, the positions or the vocabulary");
    tokens[r] = row.token;
    positions[r] = row.position;
    seq[r] = row.sequence;
  }
  const int32_t* host = s.decode_host.data();
  if (!backend_.host_memory()) {
    if (s.decode.size() < s.decode_host.size()) s.decode = backend_.alloc<int32_t>(3 * size_t(this->rows()));
    backend_.copy_from_host(s.decode.data(), host, s.decode_host.size() * sizeof(int32_t));
    host = s.decode.data();
  }
  // A row's position is both the position embedding's row and its place in the cache.
  embedding_->forward(s.res.data(), host, host + N, 1, N);
  run_blocks(0, N, [&](int l, Act att, float*, ConstAct qkv) {
    backend_.attention_decode(att, qkv, cache.keys_[size_t(l)].data(), cache.values_[size_t(l)].data(),
                              host + 2 * N, host + N, N, cache.max_len(), C, config_.heads);
  });
  // The classifier of the rows asked for: gathered next to each other, one product.
  const int M = int(logit_rows.size());
  float* gathered = ws_->delta.data();
  for (int i = 0; i < M; ++i) {
    const int r = logit_rows[size_t(i)];
    if (r < 0 || r >= N) throw std::invalid_argument("GPT::decode: a logit row outside the rows");
    backend_.copy(gathered + int64_t(i) * C, s.lnf.data() + int64_t(r) * C, sizeof(float) * size_t(C));
  }
  const ParamRef wte = ref("wte.weight");
  if (backend_.host_memory()) {
    backend_.matmul_forward(logits.data(), gathered, wte.value, nullptr, M, C, V);
  } else {
    Buffer<float> out = backend_.alloc<float>(logits.size());
    backend_.matmul_forward(out.data(), gathered, wte.value, nullptr, M, C, V);
    backend_.copy_to_host(logits.data(), out.data(), logits.size() * sizeof(float));
  }
}

void GPT::forward_features(const MicroBatch& batch) {
  check_whole(batch);
  TraceSpan span("teacher forward", "compute");
  run_forward(0, batch, nullptr, 1.0f, false, nullptr, false);
}

void GPT::feature_logits(float* out, int row0, int rows, int vocab_begin, int V) {
  if (slice_.tp_size != 1 || row0 < 0 || rows < 0 || row0 + rows > this->rows() || vocab_begin < 0 ||
      vocab_begin + V > config_.vocab)
    throw std::invalid_argument("GPT::feature_logits: positions or columns outside the whole model");
  const int C = config_.d_model;
  const ParamRef wte = ref("wte.weight");
  // The classifier's product (Classifier::forward_backward), on the columns asked for.
  backend_.matmul_forward(out, slots_[0]->lnf.data() + int64_t(row0) * C,
                          wte.value + int64_t(vocab_begin) * C, nullptr, rows, C, V);
}

}  // namespace forge::trainer
