// CudaGPT: the CPU model's forward and backward (trainer/src/model.cpp) over the CUDA ops, op for op.
#include "forge/trainer/cuda/gpt.h"

#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <type_traits>

namespace forge::trainer::cuda {

namespace {

struct LayerOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fc2w, fc2b;
};

}  // namespace

struct CudaGPT::Impl {
  ModelConfig cfg;
  int B;
  DType dtype;
  std::vector<ParamInfo> params;
  size_t P = 0;
  int64_t N = 0, NC = 0;
  size_t esize = 4;  // bytes per activation element (T)
  DeviceBuffer weights, grads, work, m, v, norm;
  DeviceBuffer tokens, targets;
  // Activations (see GPT::Acts).
  DeviceBuffer res, res_mid, ln1, ln2, ln1_stats, ln2_stats, qkv, att, lse, fc_pre, fc_act, lnf, lnf_stats;
  DeviceBuffer delta, dres, dres_t, dln, datt, dqkv, dfc, attn_scratch;
  std::vector<LayerOffsets> layer;
  size_t wte = 0, wpe = 0, lnfw = 0, lnfb = 0;
  size_t bytes = 0;

  DeviceBuffer alloc(size_t n, size_t elem) {
    bytes += n * elem;
    return DeviceBuffer(n * elem);
  }

  size_t offset(const std::string& name) const {
    for (const auto& p : params)
      if (p.name == name) return p.offset;
    throw std::invalid_argument("CudaGPT: no parameter named '" + name + "'");
  }

  template <class T>
  T* at(const DeviceBuffer& buf, int64_t elements) const {
    return buf.as<T>() + elements;
  }

  template <class T>
  const T* w() const {
    if constexpr (std::is_same_v<T, float>)
      return weights.as<float>();
    else
      return work.as<T>();
  }

  template <class T>
  void forward(const int32_t* tok);
  template <class T>
  float classifier(const int32_t* tgt, bool backward, float grad_scale);
  template <class T>
  void backward(const int32_t* tok);
};

CudaGPT::CudaGPT(const ModelConfig& config, int batch, DType dtype) : impl_(std::make_unique<Impl>()) {
  Impl& a = *impl_;
  if (batch < 1) throw std::invalid_argument("CudaGPT: batch must be >= 1");
  a.cfg = config;
  a.B = batch;
  a.dtype = dtype;
  a.params = parameter_table(config);
  a.P = a.params.back().offset + a.params.back().numel;
  a.esize = dtype == DType::kBF16 ? sizeof(bf16) : sizeof(float);
  const int64_t L = config.layers, C = config.d_model;
  a.N = int64_t(batch) * config.seq_len;
  a.NC = a.N * C;
  const size_t N = size_t(a.N), NC = size_t(a.NC), e = a.esize, f = sizeof(float);
  a.weights = a.alloc(a.P, f);
  a.grads = a.alloc(a.P, f);
  if (dtype == DType::kBF16) a.work = a.alloc(a.P, e);
  a.m = a.alloc(a.P, f);
  a.v = a.alloc(a.P, f);
  a.m.zero();
  a.v.zero();
  a.norm = a.alloc(1, sizeof(double));
  a.tokens = a.alloc(N, sizeof(int32_t));
  a.targets = a.alloc(N, sizeof(int32_t));
  a.res = a.alloc(size_t(L + 1) * NC, f);
  a.res_mid = a.alloc(size_t(L) * NC, f);
  a.ln1 = a.alloc(size_t(L) * NC, e);
  a.ln2 = a.alloc(size_t(L) * NC, e);
  a.ln1_stats = a.alloc(size_t(L) * 2 * N, f);
  a.ln2_stats = a.alloc(size_t(L) * 2 * N, f);
  a.qkv = a.alloc(size_t(L) * 3 * NC, e);
  a.att = a.alloc(size_t(L) * NC, e);
  a.lse = a.alloc(size_t(L) * N * size_t(config.heads), f);
  a.fc_pre = a.alloc(size_t(L) * 4 * NC, e);
  a.fc_act = a.alloc(size_t(L) * 4 * NC, e);
  a.lnf = a.alloc(NC, e);
  a.lnf_stats = a.alloc(2 * N, f);
  a.delta = a.alloc(NC, f);
  a.dres = a.alloc(NC, f);
  if (dtype == DType::kBF16) a.dres_t = a.alloc(NC, e);
  a.dln = a.alloc(NC, e);
  a.datt = a.alloc(NC, e);
  a.dqkv = a.alloc(3 * NC, e);
  a.dfc = a.alloc(4 * NC, e);
  a.attn_scratch = a.alloc(N * size_t(config.heads), f);
  a.wte = a.offset("wte.weight");
  a.wpe = a.offset("wpe.weight");
  a.lnfw = a.offset("lnf.weight");
  a.lnfb = a.offset("lnf.bias");
  for (int l = 0; l < L; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const auto o = [&](const char* n) { return a.offset(b + n); };
    a.layer.push_back({o("ln1.weight"), o("ln1.bias"), o("attn.qkv.weight"), o("attn.qkv.bias"),
                       o("attn.proj.weight"), o("attn.proj.bias"), o("ln2.weight"), o("ln2.bias"),
                       o("mlp.fc.weight"), o("mlp.fc.bias"), o("mlp.proj.weight"), o("mlp.proj.bias")});
  }
  a.grads.zero();
}

CudaGPT::~CudaGPT() = default;

const ModelConfig& CudaGPT::config() const {
  return impl_->cfg;
}
int CudaGPT::batch() const {
  return impl_->B;
}
DType CudaGPT::dtype() const {
  return impl_->dtype;
}
const std::vector<ParamInfo>& CudaGPT::params() const {
  return impl_->params;
}
size_t CudaGPT::num_params() const {
  return impl_->P;
}
float* CudaGPT::weights() {
  return impl_->weights.as<float>();
}
float* CudaGPT::grads() {
  return impl_->grads.as<float>();
}
size_t CudaGPT::device_bytes() const {
  return impl_->bytes;
}

void CudaGPT::init(uint64_t seed) {
  std::vector<float> host(impl_->P);
  for (const auto& p : impl_->params) init_parameter(p, {}, seed, {host.data() + p.offset, p.numel});
  set_weights(host);
}

void CudaGPT::set_weights(std::span<const float> host) {
  if (host.size() != impl_->P) throw std::invalid_argument("CudaGPT::set_weights: wrong parameter count");
  to_device(impl_->weights.as<float>(), host.data(), host.size_bytes());
  weights_changed();
}

void CudaGPT::get_weights(std::span<float> host) const {
  if (host.size() != impl_->P) throw std::invalid_argument("CudaGPT::get_weights: wrong parameter count");
  to_host(host.data(), impl_->weights.as<float>(), host.size_bytes());
}

void CudaGPT::get_grads(std::span<float> host) const {
  if (host.size() != impl_->P) throw std::invalid_argument("CudaGPT::get_grads: wrong parameter count");
  to_host(host.data(), impl_->grads.as<float>(), host.size_bytes());
}

void CudaGPT::zero_grad() {
  impl_->grads.zero();
}

void CudaGPT::weights_changed() {
  if (impl_->dtype == DType::kBF16)
    convert<bf16>(impl_->work.as<bf16>(), impl_->weights.as<float>(), int64_t(impl_->P));
}

template <class T>
void CudaGPT::Impl::forward(const int32_t* tok) {
  const T* W = w<T>();
  const int Bi = B, T_ = cfg.seq_len, C = cfg.d_model, NH = cfg.heads, L = cfg.layers, Ni = int(N);
  float* dl = delta.as<float>();
  embedding_forward<T>(res.as<float>(), tok, W + wte, W + wpe, Bi, T_, C);
  for (int l = 0; l < L; ++l) {
    const LayerOffsets& o = layer[size_t(l)];
    float* x = at<float>(res, l * NC);
    T* l1 = at<T>(ln1, l * NC);
    float* l1s = at<float>(ln1_stats, int64_t(l) * 2 * N);
    T* q = at<T>(qkv, l * 3 * NC);
    T* y = at<T>(att, l * NC);
    float* mid = at<float>(res_mid, l * NC);
    T* l2 = at<T>(ln2, l * NC);
    float* l2s = at<float>(ln2_stats, int64_t(l) * 2 * N);
    T* pre = at<T>(fc_pre, l * 4 * NC);
    T* act = at<T>(fc_act, l * 4 * NC);
    if (l == 0) layernorm_forward<T>(l1, l1s, l1s + N, x, W + o.ln1w, W + o.ln1b, Ni, C);
    matmul_forward<T, T>(q, l1, W + o.qkvw, W + o.qkvb, Ni, C, 3 * C);
    attention_forward<T>(y, at<float>(lse, int64_t(l) * N * NH), q, Bi, T_, C, NH);
    matmul_forward<T, float>(dl, y, W + o.projw, nullptr, Ni, C, C);
    residual_layernorm_forward<T>(mid, l2, l2s, l2s + N, x, dl, W + o.projb, W + o.ln2w, W + o.ln2b, Ni, C);
    matmul_bias_gelu_forward<T>(act, pre, l2, W + o.fcw, W + o.fcb, Ni, C, 4 * C);
    matmul_forward<T, float>(dl, act, W + o.fc2w, nullptr, Ni, 4 * C, C);
    const bool last = l + 1 == L;
    T* ln_next = last ? lnf.as<T>() : at<T>(ln1, (l + 1) * NC);
    float* stats_next = last ? lnf_stats.as<float>() : at<float>(ln1_stats, int64_t(l + 1) * 2 * N);
    const size_t nw = last ? lnfw : layer[size_t(l) + 1].ln1w, nb = last ? lnfb : layer[size_t(l) + 1].ln1b;
    residual_layernorm_forward<T>(x + NC, ln_next, stats_next, stats_next + N, mid, dl, W + o.fc2b, W + nw,
                                  W + nb, Ni, C);
  }
  if (L == 0)
    layernorm_forward<T>(lnf.as<T>(), lnf_stats.as<float>(), lnf_stats.as<float>() + N, res.as<float>(),
                         W + lnfw, W + lnfb, Ni, C);
}

template <class T>
float CudaGPT::Impl::classifier(const int32_t* tgt, bool backward, float grad_scale) {
  const double total = classifier_forward_backward<T>(backward ? dln.as<T>() : nullptr,
                                                      grads.as<float>() + wte, lnf.as<T>(), w<T>() + wte, tgt,
                                                      int(N), cfg.d_model, cfg.vocab, grad_scale / float(N));
  return float(total / double(N));
}

template <class T>
void CudaGPT::Impl::backward(const int32_t* tok) {
  const T* W = w<T>();
  float* g = grads.as<float>();
  const int Bi = B, T_ = cfg.seq_len, C = cfg.d_model, NH = cfg.heads, L = cfg.layers, Ni = int(N);
  float* dr = dres.as<float>();
  // The residual gradient stays FP32; the matrix products read it as T, a copy every LayerNorm backward
  // (the last op to change it before each product) writes.
  T* dr_t = std::is_same_v<T, float> ? reinterpret_cast<T*>(dr) : dres_t.as<T>();
  T* dr_copy = std::is_same_v<T, float> ? nullptr : dr_t;
  dres.zero();
  layernorm_backward<T>(dr, dr_copy, g + lnfw, g + lnfb, dln.as<T>(), at<float>(res, L * NC), W + lnfw,
                        lnf_stats.as<float>(), lnf_stats.as<float>() + N, Ni, C);
  for (int l = L - 1; l >= 0; --l) {
    const LayerOffsets& o = layer[size_t(l)];
    const float* x = at<float>(res, l * NC);
    const T* l1 = at<T>(ln1, l * NC);
    const float* l1s = at<float>(ln1_stats, int64_t(l) * 2 * N);
    const T* q = at<T>(qkv, l * 3 * NC);
    const T* y = at<T>(att, l * NC);
    const float* mid = at<float>(res_mid, l * NC);
    const T* l2 = at<T>(ln2, l * NC);
    const float* l2s = at<float>(ln2_stats, int64_t(l) * 2 * N);
    const T* pre = at<T>(fc_pre, l * 4 * NC);
    const T* act = at<T>(fc_act, l * 4 * NC);
    matmul_backward<T>(dfc.as<T>(), g + o.fc2w, g + o.fc2b, dr_t, act, W + o.fc2w, Ni, 4 * C, C, pre);
    matmul_backward<T>(dln.as<T>(), g + o.fcw, g + o.fcb, dfc.as<T>(), l2, W + o.fcw, Ni, C, 4 * C);
    layernorm_backward<T>(dr, dr_copy, g + o.ln2w, g + o.ln2b, dln.as<T>(), mid, W + o.ln2w, l2s, l2s + N, Ni,
                          C);
    matmul_backward<T>(datt.as<T>(), g + o.projw, g + o.projb, dr_t, y, W + o.projw, Ni, C, C);
    attention_backward<T>(dqkv.as<T>(), attn_scratch.as<float>(), datt.as<T>(), q, y,
                          at<float>(lse, int64_t(l) * N * NH), Bi, T_, C, NH);
    matmul_backward<T>(dln.as<T>(), g + o.qkvw, g + o.qkvb, dqkv.as<T>(), l1, W + o.qkvw, Ni, C, 3 * C);
    layernorm_backward<T>(dr, dr_copy, g + o.ln1w, g + o.ln1b, dln.as<T>(), x, W + o.ln1w, l1s, l1s + N, Ni,
                          C);
  }
  embedding_backward(g + wte, g + wpe, dr, tok, Bi, T_, C);
}

namespace {

void check_tokens(const ModelConfig& cfg, int B, std::span<const int32_t> tokens,
                  std::span<const int32_t> targets) {
  const size_t n = size_t(B) * size_t(cfg.seq_len);
  if (tokens.size() != n || targets.size() != n)
    fail(ExitCode::kData, "CudaGPT: expected {} tokens (batch {} x seq_len {}), got {} inputs and {} targets",
         n, B, cfg.seq_len, tokens.size(), targets.size());
  for (const auto* s : {&tokens, &targets})
    for (int32_t t : *s)
      if (t < 0 || t >= cfg.vocab)
        fail(ExitCode::kData, "CudaGPT: token id {} is outside the vocabulary [0, {})", t, cfg.vocab);
}

}  // namespace

float CudaGPT::forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                float grad_scale) {
  Impl& a = *impl_;
  check_tokens(a.cfg, a.B, tokens, targets);
  to_device(a.tokens.as<int32_t>(), tokens.data(), tokens.size_bytes());
  to_device(a.targets.as<int32_t>(), targets.data(), targets.size_bytes());
  const int32_t* tok = a.tokens.as<int32_t>();
  if (a.dtype == DType::kBF16) {
    a.forward<bf16>(tok);
    const float loss = a.classifier<bf16>(a.targets.as<int32_t>(), true, grad_scale);
    a.backward<bf16>(tok);
    return loss;
  }
  a.forward<float>(tok);
  const float loss = a.classifier<float>(a.targets.as<int32_t>(), true, grad_scale);
  a.backward<float>(tok);
  return loss;
}

float CudaGPT::forward_loss(std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  Impl& a = *impl_;
  check_tokens(a.cfg, a.B, tokens, targets);
  to_device(a.tokens.as<int32_t>(), tokens.data(), tokens.size_bytes());
  to_device(a.targets.as<int32_t>(), targets.data(), targets.size_bytes());
  if (a.dtype == DType::kBF16) {
    a.forward<bf16>(a.tokens.as<int32_t>());
    return a.classifier<bf16>(a.targets.as<int32_t>(), false, 1.0f);
  }
  a.forward<float>(a.tokens.as<int32_t>());
  return a.classifier<float>(a.targets.as<int32_t>(), false, 1.0f);
}

double CudaGPT::grad_norm() {
  Impl& a = *impl_;
  a.norm.zero();
  sum_squares(a.norm.as<double>(), a.grads.as<float>(), a.P);
  double sum = 0;
  to_host(&sum, a.norm.as<double>(), sizeof(sum));
  return std::sqrt(sum);
}

void CudaGPT::adamw_step(const OptimConfig& o, int64_t t, double lr, float clip) {
  Impl& a = *impl_;
  const double bc1 = 1.0 - std::pow(o.beta1, double(t));
  const double bc2 = 1.0 - std::pow(o.beta2, double(t));
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  for (const auto& p : a.params) {
    const float keep = p.decay ? float(1.0 - lr * o.weight_decay) : 1.0f;
    float* w = a.weights.as<float>() + p.offset;
    const float* g = a.grads.as<float>() + p.offset;
    float* m = a.m.as<float>() + p.offset;
    float* v = a.v.as<float>() + p.offset;
    if (a.dtype == DType::kBF16)
      adamw_update<bf16>(w, a.work.as<bf16>() + p.offset, g, m, v, p.numel, clip, float(o.beta1),
                         float(o.beta2), float(o.eps), keep, step_size, inv_sqrt_bc2);
    else
      adamw_update<float>(w, nullptr, g, m, v, p.numel, clip, float(o.beta1), float(o.beta2), float(o.eps),
                          keep, step_size, inv_sqrt_bc2);
  }
}

CudaTrainer::CudaTrainer(const TrainSpec& spec) : spec_(spec), model_(spec.model, spec.batch, spec.dtype) {
  model_.init(spec.seed);
  inputs_.resize(size_t(spec.batch) * spec.model.seq_len);
  targets_.resize(inputs_.size());
}

size_t CudaTrainer::tokens_per_step() const {
  return size_t(spec_.microbatches) * size_t(spec_.batch) * size_t(spec_.model.seq_len + 1);
}

StepStats CudaTrainer::step(std::span<const int32_t> tokens) {
  if (tokens.size() != tokens_per_step())
    throw std::invalid_argument("CudaTrainer::step: expected microbatches x batch x (seq_len + 1) tokens");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = steps_ + 1;
  const int T = spec_.model.seq_len;
  const size_t row = size_t(T) + 1;
  model_.zero_grad();
  double loss = 0;
  for (int mb = 0; mb < spec_.microbatches; ++mb) {
    // Rows of seq_len + 1 tokens: the first seq_len are the inputs, the last seq_len the targets.
    for (size_t r = 0; r < size_t(spec_.batch); ++r) {
      const int32_t* src = tokens.data() + (size_t(mb) * size_t(spec_.batch) + r) * row;
      std::copy(src, src + T, inputs_.begin() + int64_t(r) * T);
      std::copy(src + 1, src + 1 + T, targets_.begin() + int64_t(r) * T);
    }
    loss += model_.forward_backward(inputs_, targets_, 1.0f / float(spec_.microbatches));
  }
  loss /= spec_.microbatches;
  if (!std::isfinite(loss))
    fail(ExitCode::kNumeric, "step {}: loss is {}; weights left unchanged (lower optim.lr or check the data)",
         step, std::isnan(loss) ? "NaN" : "infinite");
  const double norm = model_.grad_norm();
  if (!std::isfinite(norm))
    fail(ExitCode::kNumeric, "step {}: gradient norm is {} (loss {}); weights left unchanged", step,
         std::isnan(norm) ? "NaN" : "infinite", loss);
  const double max_norm = spec_.optim.grad_clip;
  const double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
  const double lr = learning_rate(spec_.optim, step - 1, spec_.steps);
  model_.adamw_step(spec_.optim, step, lr, coef < 1.0 ? float(coef) : 1.0f);
  synchronize();
  steps_ = step;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {step, loss, norm, lr, seconds, int64_t(spec_.microbatches) * spec_.batch * T};
}

}  // namespace forge::trainer::cuda
