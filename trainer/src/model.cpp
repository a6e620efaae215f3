// The GPT's forward and backward passes over the CPU kernels, and its buffers.
#include "forge/trainer/model.h"

#include "cpu/kernels.h"
#include "forge/common/error.h"

#include <algorithm>
#include <stdexcept>

namespace forge::trainer {

namespace {

struct LayerOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fc2w, fc2b;
};

}  // namespace

// Activations of one micro-batch. Per layer: what backward needs. Scratch: reused by every layer.
struct GPT::Acts {
  int64_t N, C;
  std::vector<float> res;       // (L + 1) x [N, C]: residual stream entering each block, and the final one
  std::vector<float> res_mid;   // L x [N, C]: after the attention residual
  std::vector<float> ln1, ln2;  // L x [N, C]
  std::vector<float> ln1_stats, ln2_stats;               // L x 2 x [N] (mean, rstd)
  std::vector<float> qkv;                                // L x [N, 3C]
  std::vector<float> att;                                // L x [N, C]
  std::vector<float> lse;                                // L x [B, NH, T]
  std::vector<float> fc_pre, fc_act;                     // L x [N, 4C]
  std::vector<float> lnf, lnf_stats;                     // [N, C], 2 x [N]
  std::vector<float> delta, dres, dln, datt, dqkv, dfc;  // scratch
  std::vector<LayerOffsets> layer;
  size_t wte, wpe, lnfw, lnfb;

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&res, &res_mid, &ln1, &ln2, &ln1_stats, &ln2_stats, &qkv, &att, &lse, &fc_pre,
                          &fc_act, &lnf, &lnf_stats, &delta, &dres, &dln, &datt, &dqkv, &dfc})
      n += v->size() * sizeof(float);
    return n;
  }
};

GPT::GPT(const ModelConfig& config, int batch, DType dtype, const ModelSlice& slice)
    : config_(config), slice_(slice), batch_(batch), dtype_(dtype) {
  params_ = parameter_table(config_, slice_);
  const bool whole = slice.first_layer == 0 && (slice.last_layer < 0 || slice.last_layer == config.layers) &&
                     slice.embedding && slice.head && slice.tp_size == 1;
  if (!whole)
    throw std::invalid_argument("GPT: this build runs only the whole model (all layers, tp_size 1)");
  if (batch < 1) throw std::invalid_argument("GPT: batch must be >= 1");
  const ParamInfo& last = params_.back();
  weights_.assign(last.offset + last.numel, 0.0f);
  grads_.assign(weights_.size(), 0.0f);
  if (dtype_ == DType::kBF16) work_.assign(weights_.size(), 0.0f);

  const int64_t L = config.layers, C = config.d_model, N = int64_t(batch) * config.seq_len;
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  a.N = N;
  a.C = C;
  a.res.resize(size_t((L + 1) * N * C));
  a.res_mid.resize(size_t(L * N * C));
  a.ln1.resize(size_t(L * N * C));
  a.ln2.resize(size_t(L * N * C));
  a.ln1_stats.resize(size_t(L * 2 * N));
  a.ln2_stats.resize(size_t(L * 2 * N));
  a.qkv.resize(size_t(L * N * 3 * C));
  a.att.resize(size_t(L * N * C));
  a.lse.resize(size_t(L * N * config.heads));
  a.fc_pre.resize(size_t(L * N * 4 * C));
  a.fc_act.resize(size_t(L * N * 4 * C));
  a.lnf.resize(size_t(N * C));
  a.lnf_stats.resize(size_t(2 * N));
  a.delta.resize(size_t(N * C));
  a.dres.resize(size_t(N * C));
  a.dln.resize(size_t(N * C));
  a.datt.resize(size_t(N * C));
  a.dqkv.resize(size_t(N * 3 * C));
  a.dfc.resize(size_t(N * 4 * C));
  a.wte = param("wte.weight").offset;
  a.wpe = param("wpe.weight").offset;
  a.lnfw = param("lnf.weight").offset;
  a.lnfb = param("lnf.bias").offset;
  for (int l = 0; l < L; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const auto at = [&](const char* n) { return param(b + n).offset; };
    a.layer.push_back({at("ln1.weight"), at("ln1.bias"), at("attn.qkv.weight"), at("attn.qkv.bias"),
                       at("attn.proj.weight"), at("attn.proj.bias"), at("ln2.weight"), at("ln2.bias"),
                       at("mlp.fc.weight"), at("mlp.fc.bias"), at("mlp.proj.weight"), at("mlp.proj.bias")});
  }
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
  return acts_->bytes();
}

void GPT::check_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets) const {
  const size_t n = size_t(batch_) * size_t(config_.seq_len);
  if (tokens.size() != n || (!targets.empty() && targets.size() != n))
    fail(ExitCode::kData, "GPT: expected {} tokens (batch {} x seq_len {}), got {} inputs and {} targets", n,
         batch_, config_.seq_len, tokens.size(), targets.size());
  for (const auto* s : {&tokens, &targets})
    for (int32_t t : *s)
      if (t < 0 || t >= config_.vocab)
        fail(ExitCode::kData, "GPT: token id {} is outside the vocabulary [0, {})", t, config_.vocab);
}

void GPT::forward_blocks(const int32_t* tokens) {
  Acts& a = *acts_;
  const bool bf16 = dtype_ == DType::kBF16;
  const float* w = bf16 ? work_.data() : weights_.data();
  const int B = batch_, T = config_.seq_len, C = config_.d_model, NH = config_.heads, L = config_.layers;
  const int N = B * T;
  const int64_t NC = int64_t(N) * C;
  // BF16 mode stores what backward reads from the matrix products (their inputs) as BF16 values; the
  // residual stream, statistics and all accumulation stay FP32.
  const auto store = [&](float* data, int64_t n) {
    if (bf16) cpu::round_to_bf16(data, n);
  };
  cpu::embedding_forward(a.res.data(), tokens, w + a.wte, w + a.wpe, B, T, C);
  for (int l = 0; l < L; ++l) {
    const LayerOffsets& o = a.layer[size_t(l)];
    float* x = a.res.data() + l * NC;
    float* ln1 = a.ln1.data() + l * NC;
    float* ln1s = a.ln1_stats.data() + int64_t(l) * 2 * N;
    float* qkv = a.qkv.data() + l * 3 * NC;
    float* att = a.att.data() + l * NC;
    float* mid = a.res_mid.data() + l * NC;
    float* ln2 = a.ln2.data() + l * NC;
    float* ln2s = a.ln2_stats.data() + int64_t(l) * 2 * N;
    float* fc_pre = a.fc_pre.data() + l * 4 * NC;
    float* fc_act = a.fc_act.data() + l * 4 * NC;
    if (l == 0) {
      cpu::layernorm_forward(ln1, ln1s, ln1s + N, x, w + o.ln1w, w + o.ln1b, N, C);
      store(ln1, NC);
    }
    cpu::matmul_forward(qkv, ln1, w + o.qkvw, w + o.qkvb, N, C, 3 * C);
    store(qkv, 3 * NC);
    cpu::attention_forward(att, a.lse.data() + int64_t(l) * N * NH, qkv, B, T, C, NH);
    store(att, NC);
    cpu::matmul_forward(a.delta.data(), att, w + o.projw, nullptr, N, C, C);
    cpu::residual_layernorm_forward(mid, ln2, ln2s, ln2s + N, x, a.delta.data(), w + o.projb, w + o.ln2w,
                                    w + o.ln2b, N, C);
    store(ln2, NC);
    cpu::matmul_forward(fc_pre, ln2, w + o.fcw, nullptr, N, C, 4 * C);
    cpu::bias_gelu_forward(fc_act, fc_pre, w + o.fcb, N, 4 * C);
    store(fc_pre, 4 * NC);
    store(fc_act, 4 * NC);
    cpu::matmul_forward(a.delta.data(), fc_act, w + o.fc2w, nullptr, N, 4 * C, C);
    // The next LayerNorm (the next block's ln1, or lnf) is fused with this residual add.
    const bool last = l + 1 == L;
    const LayerOffsets* next = last ? nullptr : &a.layer[size_t(l) + 1];
    float* ln_next = last ? a.lnf.data() : a.ln1.data() + (l + 1) * NC;
    float* stats_next = last ? a.lnf_stats.data() : a.ln1_stats.data() + int64_t(l + 1) * 2 * N;
    cpu::residual_layernorm_forward(x + NC, ln_next, stats_next, stats_next + N, mid, a.delta.data(),
                                    w + o.fc2b, w + (last ? a.lnfw : next->ln1w),
                                    w + (last ? a.lnfb : next->ln1b), N, C);
    store(ln_next, NC);
  }
  if (L == 0) {
    cpu::layernorm_forward(a.lnf.data(), a.lnf_stats.data(), a.lnf_stats.data() + N, a.res.data(), w + a.lnfw,
                           w + a.lnfb, N, C);
    store(a.lnf.data(), NC);
  }
}

float GPT::classifier(const int32_t* targets, float* logits_out, bool backward, float grad_scale) {
  Acts& a = *acts_;
  const float* w = dtype_ == DType::kBF16 ? work_.data() : weights_.data();
  const int N = batch_ * config_.seq_len;
  const double total = cpu::classifier_forward_backward(
      backward ? a.dln.data() : nullptr, grads_.data() + a.wte, a.lnf.data(), w + a.wte, targets, N,
      config_.d_model, config_.vocab, grad_scale / float(N), logits_out);
  return float(total / N);
}

void GPT::backward_blocks(const int32_t* tokens) {
  Acts& a = *acts_;
  const float* w = dtype_ == DType::kBF16 ? work_.data() : weights_.data();
  float* g = grads_.data();
  const int B = batch_, T = config_.seq_len, C = config_.d_model, NH = config_.heads, L = config_.layers;
  const int N = B * T;
  const int64_t NC = int64_t(N) * C;
  float* dres = a.dres.data();
  std::fill(a.dres.begin(), a.dres.end(), 0.0f);
  // a.dln holds dL/d(lnf output) from the classifier.
  cpu::layernorm_backward(dres, g + a.lnfw, g + a.lnfb, a.dln.data(), a.res.data() + L * NC, w + a.lnfw,
                          a.lnf_stats.data(), a.lnf_stats.data() + N, N, C);
  for (int l = L - 1; l >= 0; --l) {
    const LayerOffsets& o = a.layer[size_t(l)];
    const float* x = a.res.data() + l * NC;
    const float* ln1 = a.ln1.data() + l * NC;
    const float* ln1s = a.ln1_stats.data() + int64_t(l) * 2 * N;
    const float* qkv = a.qkv.data() + l * 3 * NC;
    const float* att = a.att.data() + l * NC;
    const float* mid = a.res_mid.data() + l * NC;
    const float* ln2 = a.ln2.data() + l * NC;
    const float* ln2s = a.ln2_stats.data() + int64_t(l) * 2 * N;
    const float* fc_pre = a.fc_pre.data() + l * 4 * NC;
    const float* fc_act = a.fc_act.data() + l * 4 * NC;
    // dres = dL/d(block output) = dL/d(mlp delta): MLP backward.
    cpu::matmul_backward(a.dfc.data(), g + o.fc2w, g + o.fc2b, dres, fc_act, w + o.fc2w, N, 4 * C, C);
    cpu::gelu_backward(a.dfc.data(), fc_pre, N, 4 * C);
    cpu::matmul_backward(a.dln.data(), g + o.fcw, g + o.fcb, a.dfc.data(), ln2, w + o.fcw, N, C, 4 * C);
    cpu::layernorm_backward(dres, g + o.ln2w, g + o.ln2b, a.dln.data(), mid, w + o.ln2w, ln2s, ln2s + N, N,
                            C);
    // dres = dL/d(res_mid): attention backward.
    cpu::matmul_backward(a.datt.data(), g + o.projw, g + o.projb, dres, att, w + o.projw, N, C, C);
    cpu::attention_backward(a.dqkv.data(), a.datt.data(), qkv, att, a.lse.data() + int64_t(l) * N * NH, B, T,
                            C, NH);
    cpu::matmul_backward(a.dln.data(), g + o.qkvw, g + o.qkvb, a.dqkv.data(), ln1, w + o.qkvw, N, C, 3 * C);
    cpu::layernorm_backward(dres, g + o.ln1w, g + o.ln1b, a.dln.data(), x, w + o.ln1w, ln1s, ln1s + N, N, C);
  }
  cpu::embedding_backward(g + a.wte, g + a.wpe, dres, tokens, B, T, C);
}

float GPT::forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                            float grad_scale) {
  check_tokens(tokens, targets);
  forward_blocks(tokens.data());
  const float loss = classifier(targets.data(), nullptr, true, grad_scale);
  backward_blocks(tokens.data());
  return loss;
}

float GPT::forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  check_tokens(tokens, targets);
  forward_blocks(tokens.data());
  return classifier(targets.data(), nullptr, false, 1.0f);
}

void GPT::forward_logits(std::span<const int32_t> tokens, std::span<float> logits) {
  check_tokens(tokens, {});
  if (logits.size() != size_t(batch_) * config_.seq_len * config_.vocab)
    throw std::invalid_argument("GPT::forward_logits: logits must hold batch x seq_len x vocab values");
  forward_blocks(tokens.data());
  // Targets only feed the loss, which is discarded here: class 0 for every row.
  std::vector<int32_t> zeros(size_t(batch_) * config_.seq_len, 0);
  classifier(zeros.data(), logits.data(), false, 1.0f);
}

}  // namespace forge::trainer
