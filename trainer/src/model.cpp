// The decoder's forward and backward passes over a backend's ops, and its buffers. A model object holds
// one slice of the logical model (ModelSlice): a range of blocks, optionally the embedding and the head.
// How its layers are split, and the collectives that go with the split, belong to the layers the factory
// made (layers.h, attention.h); this file never talks to another process.
#include "forge/trainer/model.h"

#include "forge/common/error.h"
#include "forge/common/trace.h"
#include "forge/trainer/attention.h"
#include "forge/trainer/moe.h"
#include "vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace forge::trainer {

namespace {

// The dense MLP: fc with its bias and GELU fused, then proj; or (SwiGLU) gate_up, silu(gate) x up, down.
// The first product is column-parallel when split, the second row-parallel.
class DenseMLP final : public FeedForward {
 public:
  // recompute_act (SwiGLU only): selective recompute's shared buffer for silu(gate) x up, which is then
  // not kept per micro-batch but computed again from the kept gate and up in the backward; null: kept.
  // recompute_full: one activation set every micro-batch uses, that of activations_of, the first such
  // layer, which every fully recomputed block shares (null: this is it; AttentionSettings::recompute_full).
  DenseMLP(Backend& backend, std::unique_ptr<Linear> fc, std::unique_ptr<Linear> proj, bool swiglu, int slots,
           int rows, bool bf16, float* dfc, ActBuffer* recompute_act = nullptr, bool recompute_full = false,
           DenseMLP* activations_of = nullptr)
      : backend_(backend),
        fc_(std::move(fc)),
        proj_(std::move(proj)),
        swiglu_(swiglu),
        dfc_(dfc),
        recompute_act_(swiglu ? recompute_act : nullptr),
        full_(recompute_full),
        holder_(recompute_full && activations_of != nullptr ? activations_of : this) {
    const size_t pre = size_t(rows) * size_t(fc_->out_features()), act = swiglu ? pre / 2 : pre;
    const int sets = full_ ? (holder_ == this ? 1 : 0) : slots;
    for (int s = 0; s < sets; ++s) {
      pre_.emplace_back(backend, pre, bf16);
      act_.emplace_back(recompute_act_ != nullptr ? ActBuffer() : ActBuffer(backend, act, bf16));
    }
  }
  // The width of the activation between the products.
  int hidden() const { return swiglu_ ? fc_->out_features() / 2 : fc_->out_features(); }
  void forward(int slot, ConstAct in, float* out, int rows) override {
    forward_kept(slot, in, rows);
    proj_->forward(out, activation(slot), rows);
  }
  void forward_kept(int slot, ConstAct in, int rows) override {
    const Act act = activation(slot), pre = kept(slot);
    if (swiglu_) {
      fc_->forward(pre, in, rows);
      backend_.swiglu_forward(act, pre, rows, hidden());
    } else {
      fc_->forward_gelu(act, pre, in, rows);
    }
  }
  void backward(int slot, ConstAct in, const float* dout, float* din, int rows) override {
    const ConstAct pre = kept(slot);
    if (swiglu_) {
      // dL/d(act) after the first rows x hidden values of the scratch, dL/d(gate | up) into its start.
      float* dact = dfc_ + size_t(rows) * size_t(fc_->out_features());
      if (recompute_act_ != nullptr) backend_.swiglu_forward(activation(slot), kept(slot), rows, hidden());
      proj_->backward(dact, dout, activation(slot), rows);
      backend_.swiglu_backward(dfc_, dact, pre, rows, hidden());
    } else {
      proj_->backward(dfc_, dout, activation(slot), rows);
      backend_.gelu_backward(dfc_, pre, rows, fc_->out_features());
    }
    fc_->backward(din, dfc_, in, rows);
  }
  const float* output_bias() const override { return proj_->bias(); }
  size_t activation_bytes() const override {
    size_t n = 0;
    for (size_t s = 0; s < pre_.size(); ++s) n += pre_[s].bytes() + act_[s].bytes();
    return n;
  }
  // Scratch the backward needs: rows x this many floats.
  static size_t scratch_width(bool swiglu, int hidden) {
    return swiglu ? 3 * size_t(hidden) : size_t(hidden);
  }

 private:
  size_t set(int slot) const { return full_ ? 0 : size_t(slot); }
  Act kept(int slot) { return holder_->pre_[set(slot)].at(); }  // the first product's output
  Act activation(int slot) {
    return recompute_act_ != nullptr ? recompute_act_->at() : holder_->act_[set(slot)].at();
  }

  Backend& backend_;
  std::unique_ptr<Linear> fc_, proj_;
  bool swiglu_;
  float* dfc_;
  ActBuffer* recompute_act_;
  bool full_;
  DenseMLP* holder_;                  // whose sets pre_ and act_ this layer uses
  std::vector<ActBuffer> pre_, act_;  // per slot: the first product's output and the activation's
};

// An MoE block with a shared expert (Qwen2-MoE): out = routed(x) + sigmoid(x . w_gate) x shared(x), the
// shared expert a dense SwiGLU MLP every token goes through. The gate's [rows] arithmetic runs on the host,
// as the router's does (moe.h).
class SharedExpertMoe final : public FeedForward {
 public:
  SharedExpertMoe(Backend& backend, std::unique_ptr<MoeLayer> routed, std::unique_ptr<DenseMLP> shared,
                  ParamRef gate, int slots, int rows, int C)
      : backend_(backend), routed_(std::move(routed)), shared_(std::move(shared)), gate_(gate), C_(C) {
    const size_t N = size_t(rows), NC = N * size_t(C);
    for (int s = 0; s < slots; ++s) {
      shared_out_.push_back(backend.alloc<float>(NC));
      gates_.emplace_back(N);
    }
    d_shared_ = backend.alloc<float>(NC);
    d_in_ = backend.alloc<float>(NC);
    column_ = backend.alloc<float>(N);
    gate_dev_ = backend.alloc<float>(N);
    dlogit_.resize(N);
    std::vector<int32_t> identity(N);
    for (size_t i = 0; i < N; ++i) identity[i] = int32_t(i);
    identity_ = backend.alloc<int32_t>(N);
    backend.copy_from_host(identity_.data(), identity.data(), N * sizeof(int32_t));
  }
  MoeLayer* routed() { return routed_.get(); }

  void forward(int slot, ConstAct in, float* out, int rows) override {
    routed_->forward(slot, in, out, rows);
    float* shared = shared_out_[size_t(slot)].data();
    shared_->forward(slot, in, shared, rows);
    if (shared_->output_bias() != nullptr) backend_.add_bias(shared, shared_->output_bias(), rows, C_);
    // g = sigmoid(x . w_gate), then out += g x shared.
    std::vector<float>& g = gates_[size_t(slot)];
    backend_.matmul_forward(column_.data(), in, gate_.value, nullptr, rows, C_, 1);
    backend_.copy_to_host(g.data(), column_.data(), size_t(rows) * sizeof(float));
    for (int t = 0; t < rows; ++t) g[size_t(t)] = 1.0f / (1.0f + std::exp(-g[size_t(t)]));
    backend_.copy_from_host(gate_dev_.data(), g.data(), size_t(rows) * sizeof(float));
    backend_.combine_rows(out, shared, identity_.data(), gate_dev_.data(), rows, 1, C_, true);
  }
  void backward(int slot, ConstAct in, const float* dout, float* din, int rows) override {
    const std::vector<float>& g = gates_[size_t(slot)];
    routed_->backward(slot, in, dout, din, rows);
    // d(shared) = g x dout; dg = dout . shared, d(logit) = dg x g (1 - g).
    backend_.copy_from_host(gate_dev_.data(), g.data(), size_t(rows) * sizeof(float));
    backend_.combine_rows(d_shared_.data(), dout, identity_.data(), gate_dev_.data(), rows, 1, C_, false);
    backend_.row_dots(column_.data(), dout, shared_out_[size_t(slot)].data(), identity_.data(), rows, 1, C_);
    std::vector<float>& dlogit = dlogit_;
    backend_.copy_to_host(dlogit.data(), column_.data(), size_t(rows) * sizeof(float));
    for (int t = 0; t < rows; ++t) dlogit[size_t(t)] *= g[size_t(t)] * (1 - g[size_t(t)]);
    backend_.copy_from_host(column_.data(), dlogit.data(), size_t(rows) * sizeof(float));
    shared_->backward(slot, in, d_shared_.data(), d_in_.data(), rows);
    backend_.residual_forward(din, din, d_in_.data(), nullptr, rows, C_);
    backend_.linear_backward(d_in_.data(), gate_.grad, nullptr, column_.data(), in, gate_.value, rows, C_, 1);
    backend_.residual_forward(din, din, d_in_.data(), nullptr, rows, C_);
  }
  const float* output_bias() const override { return routed_->output_bias(); }
  size_t activation_bytes() const override {
    size_t n = routed_->activation_bytes() + shared_->activation_bytes();
    for (const auto& b : shared_out_) n += b.size() * sizeof(float);
    return n + (d_shared_.size() + d_in_.size() + 2 * column_.size()) * sizeof(float);
  }

 private:
  Backend& backend_;
  std::unique_ptr<MoeLayer> routed_;
  std::unique_ptr<DenseMLP> shared_;
  ParamRef gate_;
  int C_;
  std::vector<Buffer<float>> shared_out_;  // per slot: shared(x)
  std::vector<std::vector<float>> gates_;  // per slot: g, host
  std::vector<float> dlogit_;              // backward: dL/d(x . w_gate), host
  Buffer<float> d_shared_, d_in_, column_, gate_dev_;
  Buffer<int32_t> identity_;
};

}  // namespace

void FeedForward::forward_kept(int, ConstAct, int) {
  throw std::logic_error("FeedForward: this layer cannot run its forward again (full recompute)");
}

namespace {

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
  ActBuffer recompute_att, recompute_act;  // selective recompute: the recomputed blocks' shared outputs

  size_t bytes() const {
    size_t n = recompute_att.bytes() + recompute_act.bytes();
    for (const auto* v : {&delta, &dln, &datt, &dqkv, &dfc}) n += v->size() * sizeof(float);
    return n;
  }
};

// One block of the slice: its slots and, per activation set, what its backward reads.
struct GPT::Block {
  std::unique_ptr<NormLayer> ln1, ln2;
  std::unique_ptr<Attention> attn;
  std::unique_ptr<FeedForward> ffn;
  struct Acts {
    Buffer<float> res_mid;               // after the attention residual
    Buffer<float> ln1_stats, ln2_stats;  // the norms' statistics per row
    ActBuffer ln1, ln2;                  // the norms' outputs: BF16 in BF16 mode
  };
  std::vector<Acts> acts;  // per slot; under full recompute the first recomputed block's one set
  Acts* shared = nullptr;  // full recompute: that set, used by every recomputed block and micro-batch
  bool recompute_full = false;

  Acts& at(int slot) { return shared != nullptr ? *shared : acts[size_t(slot)]; }
  size_t bytes() const {
    size_t n = ffn->activation_bytes() + attn->activation_bytes();
    for (const Acts& a : acts) {
      for (const auto* v : {&a.res_mid, &a.ln1_stats, &a.ln2_stats}) n += v->size() * sizeof(float);
      for (const auto* v : {&a.ln1, &a.ln2}) n += v->bytes();
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
  // The value head's estimates and their gradient (Loss::values): [N] each, and their host copies.
  Buffer<float> values, dvalues;
  std::vector<float> values_host, dvalues_host;
  std::vector<int32_t> decode_host;  // decode(): tokens, positions, cache sequences
  Buffer<int32_t> decode;            // device backends: their copy

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&res, &lnf, &lnf_stats, &dlnf, &dres, &weights, &values, &dvalues})
      n += v->size() * sizeof(float);
    for (const auto* v : {&inputs, &targets, &positions, &doc_start, &decode})
      n += v->size() * sizeof(int32_t);
    return n;
  }
};

GPT::GPT(const ModelSpec& config, const ModelSetup& setup)
    : config_(config),
      slice_(setup.slice),
      batch_(setup.batch),
      shards_(setup.layers != nullptr ? setup.layers->sequence_shards() : 1),
      dtype_(setup.dtype),
      backend_(setup.backend != nullptr ? *setup.backend : cpu_backend()),
      loss_(setup.loss != nullptr ? setup.loss : std::make_shared<LmCrossEntropy>()) {
  Backend& backend = backend_;
  const LayerFactory& layers = setup.layers != nullptr ? *setup.layers : LayerFactory::whole();
  decode_link_ = layers.decode_link();
  const int batch = setup.batch;
  const size_t flat_multiple = setup.flat_multiple;
  if (slice_.last_layer < 0) slice_.last_layer = config.layers;
  params_ = parameter_table(config_, slice_, std::max<size_t>(flat_multiple, 1), setup.layer_align);
  frozen_ = setup.frozen;
  for (const ParamInfo& p : params_) {  // what a frozen run's zero_grad() zeroes
    if (!frozen_ || frozen_(p.name)) continue;
    if (!trained_.empty() && trained_.back().hi == p.offset)
      trained_.back().hi += p.numel;
    else
      trained_.push_back({p.offset, p.offset + p.numel});
  }
  if (batch < 1) throw std::invalid_argument("GPT: batch must be >= 1");
  chunks_ = slice_.chunks;
  if (setup.slots.size() != 1 && int(setup.slots.size()) != chunks_)
    throw std::invalid_argument("GPT: slots must hold one count, or one per model chunk");
  for (int c = 0; c < chunks_; ++c) {
    const int n = setup.slots[setup.slots.size() == 1 ? 0 : size_t(c)];
    if (n < 1) throw std::invalid_argument("GPT: slots must be >= 1");
    slot_base_.push_back(slot_base_.back() + n);
  }
  if (setup.recompute.kind == Recompute::Kind::kFull && config.ffn == Ffn::kMoe)
    throw std::invalid_argument("GPT: full recompute of MoE blocks (their routing would count twice)");
  const int tps = slice_.tp_size;
  if (config.heads % tps != 0 || (config.kv_heads % tps != 0 && tps % config.kv_heads != 0))
    throw std::invalid_argument(
        "GPT: the tensor-parallel size must divide heads, and divide kv_heads or be a multiple of it");
  layers_ = slice_.last_layer - slice_.first_layer;
  const ParamInfo& last = params_.back();
  const size_t m = std::max<size_t>(flat_multiple, 1);
  const size_t flat = (last.offset + last.numel + m - 1) / m * m;
  weights_ = backend.alloc<float>(flat);
  grads_ = backend.alloc<float>(flat);
  const bool bf16 = dtype_ == DType::kBF16;
  if (bf16) work_ = backend.alloc<float>(flat);

  // This rank's heads: tensor parallelism splits the query heads and the key/value heads alike; with
  // fewer key/value heads than ranks, each rank holds the one its query heads read.
  AttentionSettings attention{
      config.attention(), config.positions == Positions::kRotary, {}, config.qk_norm, config.norm_eps, bf16};
  attention.shape.heads /= tps;
  attention.shape.kv_heads = std::max(1, attention.shape.kv_heads / tps);
  if (attention.rotary) attention.rope = rope_table(config.rope, config.head_dim);
  const bool swiglu = config.activation == Activation::kSwiglu;
  const int ffn_width =
      config.dense_blocks() ? int(DenseMLP::scratch_width(swiglu, config.ffn_hidden / tps)) : 0;
  const int shared_width = int(DenseMLP::scratch_width(swiglu, config.shared_expert_hidden / tps));
  // N rows in the attention and FFN slots; R of them, this process's share, in the residual stream.
  const size_t L = size_t(layers_), C = size_t(config.d_model), N = size_t(rows());
  if (shards_ < 1 || N % size_t(shards_) != 0)
    throw std::invalid_argument("GPT: the rows of a micro-batch do not divide into the sequence shards");
  const size_t R = N / size_t(shards_);
  const size_t stats = NormLayer::stats_per_row(config.norm == Norm::kLayerNorm) * R;
  ws_ = std::make_unique<Workspace>();
  Workspace& w = *ws_;
  w.delta = backend.alloc<float>(R * C);
  w.dln = backend.alloc<float>(R * C);
  w.datt = backend.alloc<float>(N * size_t(attention.shape.q_width()));
  w.dqkv = backend.alloc<float>(N * size_t(attention.shape.qkv_width()));
  w.dfc = backend.alloc<float>(N * size_t(std::max(ffn_width, shared_width)));

  for (int s = 0; s < slot_base_.back(); ++s) {
    auto slot = std::make_unique<Slot>();
    slot->res = backend.alloc<float>((L + 1) * R * C);
    if (heads(place(s).chunk)) {
      slot->lnf = backend.alloc<float>(R * C);
      slot->lnf_stats = backend.alloc<float>(stats);
      slot->dlnf = backend.alloc<float>(R * C);
    }
    slot->dres = backend.alloc<float>(R * C);
    slots_.push_back(std::move(slot));
  }
  const auto norm = [&](const std::string& name) {
    const bool layernorm = config.norm == Norm::kLayerNorm;
    return layers.norm(backend, layernorm, config.norm_eps, ref(name + ".weight"),
                       layernorm ? ref(name + ".bias") : ParamRef{});
  };
  // Full recompute: the first recomputed block's layers hold the one activation set the others use.
  const Recompute& recompute = setup.recompute;
  Block* first_full = nullptr;
  DenseMLP* first_full_mlp = nullptr;
  // Block l's dense MLP for `slots` activation sets; l = -1: an MoE block's shared expert, never recomputed.
  const auto dense = [&](const std::string& name, int l, int slots) {
    const std::string fc = swiglu ? "gate_up" : "fc", proj = swiglu ? "down" : "proj";
    return std::make_unique<DenseMLP>(
        backend, layers.linear(backend, ref(name + fc + ".weight"), optional_ref(name + fc + ".bias"), false),
        layers.linear(backend, ref(name + proj + ".weight"), optional_ref(name + proj + ".bias"), false),
        swiglu, slots, int(N), bf16, w.dfc.data(), recompute.selective(l) ? &w.recompute_act : nullptr,
        recompute.full(l), first_full_mlp);
  };
  // Selective recompute: the recomputed blocks share one output buffer for their attention and one for
  // their SwiGLU activation.
  const std::vector<int> blocks = slice_.blocks(config.layers);
  for (const int l : blocks)
    if (recompute.selective(l)) {
      w.recompute_att = ActBuffer(backend, N * size_t(attention.shape.q_width()), bf16);
      if (swiglu && config.dense_blocks())
        w.recompute_act = ActBuffer(backend, N * size_t(config.ffn_hidden / tps), bf16);
      break;
    }
  for (const int l : blocks) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const int slots = chunk_sets(int(blocks_.size()) / std::max(layers_, 1));  // its chunk's
    auto block = std::make_unique<Block>();
    block->ln1 = norm(b + "ln1");
    block->ln2 = norm(b + "ln2");
    AttentionWeights aw;
    if (config.fused_qkv()) {
      aw.qkv = ref(b + "attn.qkv.weight");
      aw.qkv_bias = optional_ref(b + "attn.qkv.bias");
    } else {
      aw.qkv = fused_ref({b + "attn.q.weight", b + "attn.k.weight", b + "attn.v.weight"});
      if (config.qkv_bias) aw.qkv_bias = fused_ref({b + "attn.q.bias", b + "attn.k.bias", b + "attn.v.bias"});
    }
    aw.q_norm = optional_ref(b + "attn.q_norm.weight");
    aw.k_norm = optional_ref(b + "attn.k_norm.weight");
    aw.proj = ref(b + "attn.proj.weight");
    aw.proj_bias = optional_ref(b + "attn.proj.bias");
    AttentionSettings settings = attention;
    if (recompute.selective(l)) settings.recompute_out = &w.recompute_att;
    block->recompute_full = settings.recompute_full = recompute.full(l);
    if (first_full != nullptr) settings.activations_of = first_full->attn.get();
    block->attn = layers.attention(backend, settings, aw, settings.recompute_full ? 1 : slots, int(N),
                                   w.dqkv.data(), w.datt.data());
    if (config.moe_block(l)) {
      MoeSettings moe{config.experts,         config.top_k,         config.capacity_factor,
                      config.router_aux_coef, config.router_z_coef, bf16};
      moe.swiglu = swiglu;
      moe.renormalize = config.router_renormalize;
      // The router computes in FP32: its master weights, also in BF16 mode.
      ParamRef router = ref(b + "moe.router.weight");
      router.value = weights_.data() + router.info->offset;
      const std::string fc = swiglu ? "moe.gate_up" : "moe.fc", proj = swiglu ? "moe.down" : "moe.proj";
      auto layer = std::make_unique<MoeLayer>(backend, moe, l, router, ref(b + fc + ".weight"),
                                              optional_ref(b + fc + ".bias"), ref(b + proj + ".weight"),
                                              optional_ref(b + proj + ".bias"), layers.token_exchange(),
                                              slots, int(N));
      moe_layers_.push_back(layer.get());
      if (config.shared_expert_hidden > 0)
        block->ffn = std::make_unique<SharedExpertMoe>(
            backend, std::move(layer), dense(b + "moe.shared.", -1, slots), ref(b + "moe.shared_gate.weight"),
            slots, int(N), config.d_model);
      else
        block->ffn = std::move(layer);
    } else {
      auto mlp = dense(b + "mlp.", l, slots);
      if (block->recompute_full && first_full_mlp == nullptr) first_full_mlp = mlp.get();
      block->ffn = std::move(mlp);
    }
    const bool holds = !block->recompute_full || first_full == nullptr;
    for (int s = 0; s < (block->recompute_full ? int(holds) : slots); ++s) {
      Block::Acts a;
      a.res_mid = backend.alloc<float>(R * C);
      a.ln1_stats = backend.alloc<float>(stats);
      a.ln2_stats = backend.alloc<float>(stats);
      a.ln1 = ActBuffer(backend, R * C, bf16);
      a.ln2 = ActBuffer(backend, R * C, bf16);
      block->acts.push_back(std::move(a));
    }
    if (block->recompute_full) {
      if (first_full == nullptr) first_full = block.get();
      block->shared = &first_full->acts[0];
    }
    blocks_.push_back(std::move(block));
  }
  if (slice_.embedding) embedding_ = layers.embedding(backend, ref("wte.weight"), optional_ref("wpe.weight"));
  if (slice_.embedding && config.vision.enabled()) {
    if (shards_ != 1 || bf16)
      throw std::invalid_argument(
          "GPT: the vision tower runs in FP32 without sequence parallelism (for now)");
    const VisionSpec& v = config.vision;
    if (v.heads % tps != 0 || v.mlp_hidden % tps != 0 || v.projector_hidden % tps != 0)
      throw std::invalid_argument(
          "GPT: the tensor-parallel size must divide the vision tower's heads, MLP and projector widths");
    const int pictures = std::max(1, int(N) / v.tokens());
    vision_ = std::make_unique<VisionTower>(backend, layers, v, config.d_model, pictures, chunk_sets(0),
                                            [this](const std::string& name) { return ref(name); });
  }
  if (slice_.head) {
    classifier_ = layers.classifier(backend, ref(classifier_weight()));
    lnf_ = norm("lnf");
    if (config.value_head) {
      // Its estimates are of whole rows: the stream must not be cut (sequence parallelism).
      if (shards_ != 1) throw std::invalid_argument("GPT: a value head needs the whole rows of the stream");
      value_weight_ = ref("value_head.weight");
      value_bias_ = ref("value_head.bias");
    }
  }
}

GPT::~GPT() = default;

ParamRef GPT::ref(const std::string& name) {
  const ParamInfo& p = param(name);
  const float* values = (dtype_ == DType::kBF16 ? work_.data() : weights_.data()) + p.offset;
  return {&p, values, frozen_ && frozen_(name) ? nullptr : grads_.data() + p.offset};
}

ParamRef GPT::optional_ref(const std::string& name) {
  for (const auto& p : params_)
    if (p.name == name) return ref(name);
  return {};
}

ParamRef GPT::fused_ref(const std::vector<std::string>& names) {
  // The parameter table stores them back to back (params.cpp): one [sum of rows, ...] tensor.
  const ParamInfo& first = param(names.front());
  ParamInfo view = first;
  view.name = first.name + " (fused)";
  size_t end = first.offset + first.numel;
  for (size_t i = 1; i < names.size(); ++i) {
    const ParamInfo& p = param(names[i]);
    if (p.offset != end) throw std::logic_error("GPT: " + p.name + " does not follow " + names[i - 1]);
    end += p.numel;
    view.shape[0] += p.shape[0];
    view.local_shape[0] += p.local_shape[0];
  }
  view.numel = end - first.offset;
  views_.push_back(std::move(view));
  ParamRef r = ref(names.front());
  r.info = &views_.back();
  return r;
}

std::string GPT::classifier_weight() const {
  return config_.tied_embeddings ? "wte.weight" : "head.weight";
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
  if (!frozen_) return backend_.fill(grads_.data(), 0.0f, grads_.size());  // the padding too, as always
  for (const FlatRange& r : trained_) backend_.fill(grads_.data() + r.lo, 0.0f, r.hi - r.lo);
}

void GPT::weights_changed() {
  weights_changed({0, weights_.size()});
}

void GPT::weights_changed(FlatRange part) {
  if (dtype_ != DType::kBF16 || part.hi <= part.lo) return;
  backend_.round_to_bf16(work_.data() + part.lo, weights_.data() + part.lo, part.hi - part.lo);
  working_copy_changed(part);
}

void GPT::working_copy_changed(FlatRange part) {
  if (dtype_ == DType::kBF16 && part.hi > part.lo)
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
  if (vision_) n += vision_->activation_bytes();
  return n;
}

std::span<const float> GPT::output(int slot) const {
  const Slot& s = *slots_.at(size_t(slot));
  const size_t nc = size_t(stream_rows()) * size_t(config_.d_model);
  return {s.res.data() + size_t(layers_) * nc, nc};
}

std::span<const float> GPT::input_grad(int slot) const {
  return slots_.at(size_t(slot))->dres.span();
}

LossSums GPT::run_forward(int slot, const MicroBatch& batch, const float* input, float loss_scale,
                          bool backward, float* logits_out, bool classify, const WeightHooks& weights,
                          const Loss* loss_of) {
  const Loss& objective = loss_of != nullptr ? *loss_of : *loss_;
  Slot& s = *slots_.at(size_t(slot));
  const auto [chunk, set] = place(slot);
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

  const int B = batch_, T = config_.seq_len;
  if (weights.need) weights.need(-1);
  if (embeds(chunk)) {
    TraceSpan span("forward embedding", "compute");
    embedding_->forward(s.res.data(), s.batch.inputs, s.batch.positions, B, T);
    if (vision_ && batch.images() > 0) place_pictures(slot, batch.image_pixels.data(), batch.image_starts);
  } else {
    backend_.copy(s.res.data(), input, sizeof(float) * size_t(stream_rows()) * size_t(config_.d_model));
  }
  run_blocks(
      slot, B * T,
      [&](int l, ConstAct in, float* out) { blocks_[size_t(l)]->attn->forward(set, in, out, s.batch, B, T); },
      weights);
  const auto done = [&] {
    if (!weights.done) return;
    if (heads(chunk)) weights.done(config_.layers);
    weights.done(-1);
  };
  if (!heads(chunk) || !classify) {
    done();
    return {};
  }
  TraceSpan span("forward head + loss", "compute");
  const bool values = objective.values();
  if (values) form_values(s);
  s.batch.values = values ? s.values_host.data() : nullptr;
  s.batch.dvalues = values ? s.dvalues_host.data() : nullptr;
  const double loss = classifier_->forward_backward(backward ? s.dlnf.data() : nullptr, s.lnf.data(), s.batch,
                                                    int(rows()), objective, loss_scale, logits_out);
  if (values && backward) values_backward(s, loss_scale);
  done();
  return {loss, objective.weight(batch)};
}

void GPT::form_values(Slot& s) {
  if (!value_weight_.info)
    throw std::invalid_argument(
        "GPT: the objective reads a value head, and the model has none (model.value_head)");
  const int N = int(rows()), C = config_.d_model;
  if (s.values.size() != size_t(N)) {
    s.values = backend_.alloc<float>(size_t(N));
    s.dvalues = backend_.alloc<float>(size_t(N));
  }
  backend_.matmul_forward(Act(s.values.data()), ConstAct(s.lnf.data()), value_weight_.value,
                          value_bias_.value, N, C, 1);
  s.values_host.resize(size_t(N));
  backend_.copy_to_host(s.values_host.data(), s.values.data(), sizeof(float) * size_t(N));
  s.dvalues_host.assign(size_t(N), 0.0f);
}

void GPT::values_backward(Slot& s, float loss_scale) {
  const int N = int(rows()), C = config_.d_model;
  for (float& d : s.dvalues_host) d *= loss_scale;
  backend_.copy_from_host(s.dvalues.data(), s.dvalues_host.data(), sizeof(float) * size_t(N));
  // The head's share of the final norm's gradient, beside the classifier's (the workspace's delta is free
  // here, and [N, C]: the stream is whole).
  float* dx = ws_->delta.data();
  backend_.matmul_backward(dx, value_weight_.grad, value_bias_.grad, s.dvalues.data(), ConstAct(s.lnf.data()),
                           value_weight_.value, N, C, 1);
  backend_.residual_forward(s.dlnf.data(), s.dlnf.data(), dx, nullptr, N, C);
}

void GPT::run_blocks(int slot, int N, const std::function<void(int, ConstAct, float*)>& attention,
                     const WeightHooks& weights) {
  Slot& s = *slots_.at(size_t(slot));
  Workspace& w = *ws_;
  // The slot's chunk: blocks_[first, first + layers_).
  const auto [chunk, set] = place(slot);
  const int first = chunk * layers_;
  const bool head = heads(chunk);
  const auto need = [&](int l) {
    if (weights.need) weights.need(l < layers_ ? layer_of(first + l) : config_.layers);
  };
  const bool bf16 = dtype_ == DType::kBF16;
  // The attention and FFN slots take N rows; the stream, its norms and adds hold R of them (GPT::Slot).
  const int C = config_.d_model, L = layers_, R = N / shards_;
  const int64_t NC = int64_t(R) * C;
  // BF16 mode stores the inputs of the matrix products and of the attention as BF16 (ActBuffer), the ops
  // writing them rounded; the residual stream, statistics and all accumulation stay FP32. The final
  // LayerNorm's output stays BF16 values held in FP32: the classifier's chunks read it, one per slot.
  for (int l = 0; l < L; ++l) {
    TraceSpan span("forward block", "compute", layer_of(first + l));
    Block& k = *blocks_[size_t(first + l)];
    Block::Acts& a = k.at(set);
    float* x = s.res.data() + l * NC;
    need(l);
    if (l == 0) k.ln1->forward(a.ln1.at(), a.ln1_stats.data(), x, R, C);
    attention(first + l, a.ln1.at(), w.delta.data());
    k.ln2->residual_forward(a.res_mid.data(), a.ln2.at(), a.ln2_stats.data(), x, w.delta.data(),
                            k.attn->output_bias(), R, C);
    k.ffn->forward(set, a.ln2.at(), w.delta.data(), N);
    // The next norm (the next block's ln1, or lnf) is fused with this residual add; a stage's last block
    // without the head hands the plain stream to the next stage, which owns that norm.
    if (l + 1 < L || head) {
      const bool last = l + 1 == L;
      need(l + 1);  // its norm: the next block's, or the final one (layer config.layers)
      Block* next = last ? nullptr : blocks_[size_t(first + l) + 1].get();
      Block::Acts* na = last ? nullptr : &next->at(set);
      const Act ln_next = last ? Act(s.lnf.data()) : na->ln1.at();
      float* stats_next = last ? s.lnf_stats.data() : na->ln1_stats.data();
      (last ? *lnf_ : *next->ln1)
          .residual_forward(x + NC, ln_next, stats_next, a.res_mid.data(), w.delta.data(),
                            k.ffn->output_bias(), R, C);
      if (last && bf16) backend_.round_to_bf16(s.lnf.data(), s.lnf.data(), size_t(NC));
    } else {
      backend_.residual_forward(x + NC, a.res_mid.data(), w.delta.data(), k.ffn->output_bias(), R, C);
    }
    if (weights.done) weights.done(layer_of(first + l));
  }
  if (head && L == 0) {
    need(0);
    lnf_->forward(s.lnf.data(), s.lnf_stats.data(), s.res.data(), R, C);
    if (bf16) backend_.round_to_bf16(s.lnf.data(), s.lnf.data(), size_t(NC));
  }
}

LossSums GPT::forward(int slot, const MicroBatch& batch, const float* input, float loss_scale, bool backward,
                      const WeightHooks& weights, const Loss* loss) {
  return run_forward(slot, batch, input, loss_scale, backward, nullptr, true, weights, loss);
}

void GPT::backward(int slot, const float* d_output, const std::function<void(int)>& on_grads,
                   const WeightHooks& weights) {
  Slot& s = *slots_.at(size_t(slot));
  Workspace& w = *ws_;
  const int B = batch_, T = config_.seq_len, C = config_.d_model, L = layers_;
  const int N = B * T, R = N / shards_;  // as in run_blocks
  const auto [chunk, set] = place(slot);
  const int first = chunk * layers_;
  const int64_t NC = int64_t(R) * C;
  float* dres = s.dres.data();
  const auto need = [&](int layer) {
    if (weights.need) weights.need(layer);
  };
  const auto done = [&](int layer) {
    if (weights.done) weights.done(layer);
    if (on_grads) on_grads(layer);
  };
  if (heads(chunk)) {
    TraceSpan span("backward head", "compute");
    backend_.fill(dres, 0.0f, size_t(NC));
    // s.dlnf holds dL/d(lnf output) from the classifier.
    need(config_.layers);
    lnf_->backward(dres, s.dlnf.data(), s.res.data() + L * NC, s.lnf_stats.data(), R, C);
    done(config_.layers);
  } else {
    backend_.copy(dres, d_output, sizeof(float) * size_t(NC));
  }
  for (int l = L - 1; l >= 0; --l) {
    const int layer = layer_of(first + l);
    TraceSpan span("backward block", "compute", layer);
    Block& k = *blocks_[size_t(first + l)];
    Block::Acts& a = k.at(set);
    const float* x = s.res.data() + l * NC;
    need(layer);
    if (k.recompute_full) {
      // The block's forward again from its input, into the shared set: what its backward reads. ln1 is
      // computed here on its own; the forward fused it with the previous block's residual add (the same
      // arithmetic). The FFN's output, which the backward does not read, is not formed.
      TraceSpan again("recompute block", "compute", layer);
      k.ln1->forward(a.ln1.at(), a.ln1_stats.data(), x, R, C);
      k.attn->forward(set, a.ln1.at(), w.delta.data(), s.batch, B, T);
      k.ln2->residual_forward(a.res_mid.data(), a.ln2.at(), a.ln2_stats.data(), x, w.delta.data(),
                              k.attn->output_bias(), R, C);
      k.ffn->forward_kept(set, a.ln2.at(), N);
    }
    // dres = dL/d(block output) = dL/d(FFN output): FFN backward, then its norm.
    k.ffn->backward(set, a.ln2.at(), dres, w.dln.data(), N);
    k.ln2->backward(dres, w.dln.data(), a.res_mid.data(), a.ln2_stats.data(), R, C);
    // dres = dL/d(res_mid): attention backward, then its norm.
    k.attn->backward(set, a.ln1.at(), dres, w.dln.data(), s.batch, B, T);
    k.ln1->backward(dres, w.dln.data(), x, a.ln1_stats.data(), R, C);
    done(layer);
  }
  if (embeds(chunk)) {
    TraceSpan span("backward embedding", "compute");
    // A picture's placeholder tokens gave their embeddings no part in the forward: their rows' gradient
    // goes to the vision tower instead.
    const bool pictures = vision_ && s.batch.host->images() > 0;
    if (pictures) {
      const MicroBatch& batch = *s.batch.host;
      const int64_t run = int64_t(config_.vision.tokens()) * C;
      for (size_t k = 0; k < batch.images(); ++k) {
        float* rows = dres + batch.image_starts[k] * C;
        backend_.copy(vision_->d_features() + int64_t(k) * run, rows, sizeof(float) * size_t(run));
        backend_.fill(rows, 0.0f, size_t(run));
      }
    }
    embedding_->backward(dres, s.batch.inputs, s.batch.positions, B, T);
    if (pictures && vision_->trains()) vision_->backward(slot, vision_->d_features());
    if (on_grads) on_grads(-1);
  }
}

void GPT::place_pictures(int slot, const uint8_t* pixels, std::span<const int64_t> starts) {
  Slot& s = *slots_.at(size_t(slot));
  const int64_t C = config_.d_model, run = int64_t(config_.vision.tokens()) * C;
  const float* features = vision_->forward(slot, pixels, int(starts.size()));
  for (size_t k = 0; k < starts.size(); ++k)
    backend_.copy(s.res.data() + starts[k] * C, features + int64_t(k) * run, sizeof(float) * size_t(run));
}

void GPT::check_batch(const MicroBatch& batch, int rows, const ModelSpec& config) {
  if (batch.rows != rows || batch.seq_len != config.seq_len)
    fail(ExitCode::kData,
         "a micro-batch of {} x {} positions, but the model trains {} x {} (data.batch x "
         "model.seq_len)",
         batch.rows, batch.seq_len, rows, config.seq_len);
  if (const auto problem = batch.problem(config.vocab, config.max_positions))
    fail(ExitCode::kData, "{}", *problem);
  const VisionSpec& v = config.vision;
  if (batch.images() > 0 && !v.enabled())
    fail(ExitCode::kData,
         "a micro-batch with {} pictures, but the model has no vision tower: set vision.layers "
         "(docs/TRAINER.md)",
         batch.images());
  if (batch.images() > 0 && (batch.image_size != v.image_size || batch.image_tokens != v.tokens()))
    fail(
        ExitCode::kData,
        "the micro-batch's pictures are {0} x {0} pixels of {1} tokens, but the vision tower takes {2} x {2} "
        "of {3} (vision.image_size, vision.patch): prepare the data with --image.size={2} and "
        "--image.patch={4}",
        batch.image_size, batch.image_tokens, v.image_size, v.tokens(), v.patch);
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

LossSums GPT::forward_loss(const MicroBatch& batch, const Loss* loss) {
  check_whole(batch);
  return run_forward(0, batch, nullptr, 1.0f, false, nullptr, true, {}, loss);
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
  const ModelSpec& c = model.config();
  if (sequences < 1 || max_len < 1 || max_len > c.max_positions)
    throw std::invalid_argument("KvCache: needs >= 1 sequence and 1 to max_positions positions");
  // The key and value heads of every position this process holds: kv_heads of them (a grouped-query
  // model's cache is heads / kv_heads times smaller), a tensor-parallel rank's share (at least the one its
  // query heads read), as the attention slot holds them.
  const int kv = std::max(1, c.kv_heads / model.slice().tp_size);
  const size_t n = size_t(sequences) * size_t(max_len) * size_t(kv) * size_t(c.head_dim);
  const size_t blocks = model.slice().blocks(c.layers).size();
  for (size_t l = 0; l < blocks; ++l) {
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
                 std::span<float> logits, std::span<const DecodePicture> pictures) {
  if ((!slice_.embedding || !slice_.head) && decode_link_ == nullptr)
    throw std::invalid_argument(
        "GPT::decode: needs every layer in this process (a tensor-parallel share of each), or a pipeline "
        "stage's with the link to the others");
  if (cache.keys_.size() != blocks_.size())
    throw std::invalid_argument("GPT::decode: the cache was made for another model");
  if (chunks_ > 1)
    throw std::invalid_argument("GPT::decode: an interleaved pipeline stage's model chunks do not decode");
  const int N = int(rows.size()), C = config_.d_model, V = config_.vocab;
  if (N > this->rows()) throw std::invalid_argument("GPT::decode: at most rows() rows at a time");
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
  // A row's position is both the position embedding's row and its place in the cache. A later pipeline
  // stage takes the stream from the one before.
  if (slice_.embedding)
    embedding_->forward(s.res.data(), host, host + N, 1, N);
  else
    decode_link_->receive(s.res.data(), size_t(N) * size_t(C));
  if (!pictures.empty() && slice_.embedding) {
    if (!vision_) throw std::invalid_argument("GPT::decode: pictures, but the model has no vision tower");
    const VisionSpec& v = config_.vision;
    const size_t bytes = size_t(v.image_size) * size_t(v.image_size) * 3;
    std::vector<uint8_t> pixels(pictures.size() * bytes);
    std::vector<int64_t> starts;
    for (size_t k = 0; k < pictures.size(); ++k) {
      const int first = pictures[k].row, end = first + v.tokens();
      if (first < 0 || end > N)
        throw std::invalid_argument("GPT::decode: a picture's rows are outside the call's rows");
      for (int r = first + 1; r < end; ++r)
        if (rows[size_t(r)].sequence != rows[size_t(first)].sequence ||
            rows[size_t(r)].position != rows[size_t(r) - 1].position + 1)
          throw std::invalid_argument(
              "GPT::decode: a picture's rows are not consecutive positions of a sequence");
      std::copy(pictures[k].rgb, pictures[k].rgb + bytes, pixels.begin() + ptrdiff_t(k * bytes));
      starts.push_back(first);
    }
    place_pictures(0, pixels.data(), starts);
  }
  run_blocks(0, N, [&](int l, ConstAct in, float* out) {
    blocks_[size_t(l)]->attn->decode(in, out, cache.keys_[size_t(l)].data(), cache.values_[size_t(l)].data(),
                                     host + 2 * N, host + N, N, cache.max_len());
  });
  const int M = int(logit_rows.size());
  if (!slice_.head) {
    decode_link_->send(s.res.data() + int64_t(layers_) * N * C, size_t(N) * size_t(C));
    share_logits(logits);
    return;
  }
  // The classifier of the rows asked for: gathered next to each other, one product.
  float* gathered = ws_->delta.data();
  for (int i = 0; i < M; ++i) {
    const int r = logit_rows[size_t(i)];
    if (r < 0 || r >= N) throw std::invalid_argument("GPT::decode: a logit row outside the rows");
    backend_.copy(gathered + int64_t(i) * C, s.lnf.data() + int64_t(r) * C, sizeof(float) * size_t(C));
  }
  classifier_->logits(logits.data(), gathered, M);
  share_logits(logits);
}

bool GPT::decoding(bool mine) {
  return decode_link_ != nullptr ? decode_link_->any(mine) : mine;
}

void GPT::share_logits(std::span<float> logits) {
  if (decode_link_ == nullptr || (slice_.embedding && slice_.head)) return;  // no pipeline
  if (backend_.host_memory()) return decode_link_->share_logits(logits.data(), logits.size());
  // A device backend's communicator moves its memory: through a copy there (the last stage's own logits
  // go in, the others' come out).
  backend_.grow(shared_logits_, logits.size());
  const size_t bytes = logits.size() * sizeof(float);
  if (slice_.head) backend_.copy_from_host(shared_logits_.data(), logits.data(), bytes);
  decode_link_->share_logits(shared_logits_.data(), logits.size());
  if (!slice_.head) backend_.copy_to_host(logits.data(), shared_logits_.data(), bytes);
}

void GPT::forward_features(const MicroBatch& batch) {
  if (!slice_.embedding || !slice_.head || batch.rows != batch_ || batch.seq_len != config_.seq_len)
    throw std::invalid_argument("GPT::forward_features: a batch of another shape, or a slice of the model");
  TraceSpan span("teacher forward", "compute");
  run_forward(0, batch, nullptr, 1.0f, false, nullptr, false);
}

void GPT::feature_logits(float* out, int row0, int rows, int vocab_begin, int V) {
  if (slice_.tp_size != 1 || row0 < 0 || rows < 0 || row0 + rows > this->rows() || vocab_begin < 0 ||
      vocab_begin + V > config_.vocab)
    throw std::invalid_argument("GPT::feature_logits: positions or columns outside the whole model");
  const int C = config_.d_model;
  const ParamRef wte = ref(classifier_weight());
  // The classifier's product (Classifier::forward_backward), on the columns asked for.
  backend_.matmul_forward(out, slots_[0]->lnf.data() + int64_t(row0) * C,
                          wte.value + int64_t(vocab_begin) * C, nullptr, rows, C, V);
}

}  // namespace forge::trainer
