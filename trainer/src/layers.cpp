// The whole (unsplit) layers and the language-model loss. Split versions: parallel/tensor_parallel.cpp.
#include "forge/trainer/layers.h"

#include "forge/trainer/attention.h"
#include "forge/trainer/model.h"

#include <algorithm>

namespace forge::trainer {

Linear::Linear(Backend& backend, ParamRef weight, ParamRef bias, bool add_bias)
    : backend_(backend),
      weight_(weight),
      bias_(bias),
      add_bias_(add_bias),
      in_(int(weight.info->local_shape[1])),
      out_(int(weight.info->local_shape[0])) {}

void Linear::forward(Act out, ConstAct in, int rows) {
  backend_.matmul_forward(out, in, weight_.value, add_bias_ ? bias_.value : nullptr, rows, in_, out_);
}

void Linear::forward_gelu(Act out, Act pre, ConstAct in, int rows) {
  backend_.matmul_bias_gelu_forward(out, pre, in, weight_.value, bias_.value, rows, in_, out_);
}

void Linear::backward(float* din, const float* dout, ConstAct in, int rows) {
  backend_.linear_backward(din, weight_.grad, bias_.grad, dout, in, weight_.value, rows, in_, out_);
}

void Backend::linear_backward(float* din, float* dw, float* dbias, const float* dout, ConstAct in,
                              const float* w, int N, int C, int OC) {
  if (deferred_ == nullptr || (dw == nullptr && dbias == nullptr))
    return matmul_backward(din, dw, dbias, dout, in, w, N, C, OC);
  if (din != nullptr) matmul_backward(din, nullptr, nullptr, dout, in, w, N, C, OC);
  deferred_->add(dw, dbias, dout, in, N, C, OC);
}

void WeightGradQueue::add(float* dw, float* dbias, const float* dout, ConstAct in, int N, int C, int OC) {
  if (queued_ == products_.size()) products_.emplace_back();
  Product& p = products_[queued_++];
  const size_t out_n = size_t(N) * size_t(OC), in_n = dw != nullptr ? size_t(N) * size_t(C) : 0;
  backend_->grow(p.dout, out_n);
  if (p.in.size() < in_n || (in_n > 0 && p.in.at().bf16 != in.bf16))
    p.in = ActBuffer(*backend_, in_n, in.bf16);
  backend_->copy(p.dout.data(), dout, out_n * sizeof(float));
  if (in_n > 0) backend_->copy(p.in.at().data, in.data, in_n * (in.bf16 ? sizeof(uint16_t) : sizeof(float)));
  p.dw = dw;
  p.dbias = dbias;
  p.N = N;
  p.C = C;
  p.OC = OC;
}

void WeightGradQueue::run() {
  // A product without din reads neither the weights nor their gradient's other terms.
  for (size_t i = 0; i < queued_; ++i) {
    Product& p = products_[i];
    backend_->matmul_backward(nullptr, p.dw, p.dbias, p.dout.data(), p.in.at(), nullptr, p.N, p.C, p.OC);
  }
  queued_ = 0;
}

size_t WeightGradQueue::bytes() const {
  size_t n = 0;
  for (const Product& p : products_) n += p.dout.size() * sizeof(float) + p.in.bytes();
  return n;
}

NormLayer::NormLayer(Backend& backend, bool layernorm, float eps, ParamRef weight, ParamRef bias)
    : backend_(backend), layernorm_(layernorm), eps_(eps), w_(weight), b_(bias) {}

void NormLayer::forward(Act out, float* st, const float* in, int N, int C) const {
  if (layernorm_)
    backend_.layernorm_forward(out, st, st + N, in, w_.value, b_.value, eps_, N, C);
  else
    backend_.rmsnorm_forward(out, st, in, w_.value, eps_, N, C);
}

void NormLayer::residual_forward(float* res_out, Act out, float* st, const float* res_in, const float* delta,
                                 const float* delta_bias, int N, int C) const {
  if (layernorm_)
    backend_.residual_layernorm_forward(res_out, out, st, st + N, res_in, delta, delta_bias, w_.value,
                                        b_.value, eps_, N, C);
  else
    backend_.residual_rmsnorm_forward(res_out, out, st, res_in, delta, delta_bias, w_.value, eps_, N, C);
}

void NormLayer::backward(float* din, const float* dout, const float* in, const float* st, int N, int C) {
  if (layernorm_)
    backend_.layernorm_backward(din, w_.grad, b_.grad, dout, in, w_.value, st, st + N, N, C);
  else
    backend_.rmsnorm_backward(din, w_.grad, dout, in, w_.value, st, N, C);
}

Embedding::Embedding(Backend& backend, ParamRef wte, ParamRef wpe, int vocab_begin, int vocab_end)
    : backend_(backend),
      wte_(wte),
      wpe_(wpe),
      vocab_begin_(vocab_begin),
      vocab_end_(vocab_end),
      C_(int(wte.info->local_shape[1])) {}

void Embedding::forward(float* out, const int32_t* tokens, const int32_t* positions, int B, int T) {
  backend_.embedding_forward(out, tokens, positions, wte_.value, wpe_.value, B, T, C_, vocab_begin_,
                             vocab_end_);
}

void Embedding::backward(const float* dout, const int32_t* tokens, const int32_t* positions, int B, int T) {
  if (wte_.grad == nullptr) return;  // frozen: the embeddings' gradients are all it forms
  backend_.embedding_backward(wte_.grad, wpe_.grad, dout, tokens, positions, B, T, C_, vocab_begin_,
                              vocab_end_);
}

Classifier::Classifier(Backend& backend, ParamRef wte, int vocab_begin, VocabGroup* group)
    : backend_(backend),
      wte_(wte),
      vocab_begin_(vocab_begin),
      V_(int(wte.info->local_shape[0])),
      C_(int(wte.info->local_shape[1])),
      vocab_group_(group) {}

double Classifier::forward_backward(float* dx, const float* x, const DeviceBatch& batch, int rows,
                                    const Loss& loss, float scale, float* logits_out) {
  const int chunk_rows = backend_.classifier_chunk_rows(V_);
  if (const size_t need = size_t(std::min(rows, chunk_rows)) * size_t(V_); chunk_.size() < need)
    chunk_ = backend_.alloc<float>(need);
  float* logits = chunk_.data();
  loss.begin(batch);
  double total = 0;
  const float* coeff = nullptr;  // a sequence loss's per-position gradient weights (second pass)
  if (loss.per_sequence()) {
    // First pass: the targets' negative log-likelihoods, chunk by chunk (the logits are formed twice: no
    // [rows, V] buffer ever exists); then the loss and each position's weight, on the host.
    backend_.grow(nll_, size_t(rows));
    nll_host_.resize(size_t(rows));
    coeff_host_.resize(size_t(rows));
    for (int r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int n = std::min(chunk_rows, rows - r0);
      backend_.matmul_forward(logits, x + int64_t(r0) * C_, wte_.value, nullptr, n, C_, V_);
      backend_.cross_entropy(logits, batch.targets + r0,
                             batch.weights != nullptr ? batch.weights + r0 : nullptr, n, V_, vocab_begin_,
                             1.0f, false, vocab_group_, nll_.data() + r0);
    }
    backend_.copy_to_host(nll_host_.data(), nll_.data(), sizeof(float) * size_t(rows));
    total = loss.sequences(batch, nll_host_.data(), coeff_host_.data(), row_group_);
    if (dx == nullptr && logits_out == nullptr) return total;
    if (backend_.host_memory()) {
      coeff = coeff_host_.data();
    } else {
      backend_.grow(coeff_, size_t(rows));
      backend_.copy_from_host(coeff_.data(), coeff_host_.data(), sizeof(float) * size_t(rows));
      coeff = coeff_.data();
    }
  }
  for (int r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int n = std::min(chunk_rows, rows - r0);
    const float* xr = x + int64_t(r0) * C_;
    backend_.matmul_forward(logits, xr, wte_.value, nullptr, n, C_, V_);
    if (logits_out != nullptr)
      backend_.copy_to_host(logits_out + int64_t(r0) * V_, logits, sizeof(float) * size_t(n) * size_t(V_));
    if (coeff != nullptr)  // the gradient of the sequence loss: cross-entropy's, weighted by `coeff`
      backend_.cross_entropy(logits, batch.targets + r0, coeff + r0, n, V_, vocab_begin_, scale,
                             dx != nullptr, vocab_group_);
    else
      total +=
          loss.chunk(backend_, logits, batch, r0, n, V_, vocab_begin_, scale, dx != nullptr, vocab_group_);
    if (dx == nullptr) continue;
    // dx = dlogits wte, dwte += dlogits^T x: the classifier's matrix product backward.
    backend_.matmul_backward(dx + int64_t(r0) * C_, wte_.grad, nullptr, logits, xr, wte_.value, n, C_, V_);
  }
  return total;
}

void Classifier::logits(float* out, const float* x, int rows) {
  if (backend_.host_memory()) return backend_.matmul_forward(out, x, wte_.value, nullptr, rows, C_, V_);
  const size_t n = size_t(rows) * size_t(V_);
  backend_.grow(decoded_, n);
  backend_.matmul_forward(decoded_.data(), x, wte_.value, nullptr, rows, C_, V_);
  backend_.copy_to_host(out, decoded_.data(), n * sizeof(float));
}

double LmCrossEntropy::chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows,
                             int V, int vocab_begin, float scale, bool backward, VocabGroup* group) const {
  return backend.cross_entropy(logits, batch.targets + row0,
                               batch.weights != nullptr ? batch.weights + row0 : nullptr, rows, V,
                               vocab_begin, scale, backward, group);
}

std::unique_ptr<Linear> LayerFactory::linear(Backend& backend, ParamRef weight, ParamRef bias,
                                             bool add_bias) const {
  return std::make_unique<Linear>(backend, weight, bias, add_bias);
}

std::unique_ptr<Embedding> LayerFactory::embedding(Backend& backend, ParamRef wte, ParamRef wpe) const {
  return std::make_unique<Embedding>(backend, wte, wpe, 0, int(wte.info->shape[0]));
}

std::unique_ptr<Classifier> LayerFactory::classifier(Backend& backend, ParamRef wte) const {
  return std::make_unique<Classifier>(backend, wte, 0);
}

void TokenExchange::exchange_counts(const int64_t* send, int64_t* recv, int per_rank) {
  std::copy(send, send + per_rank, recv);
}

void TokenExchange::exchange_rows(Backend& backend, const float* in, const int64_t* send_rows, float* out,
                                  const int64_t* recv_rows, int C) {
  if (send_rows[0] != recv_rows[0]) throw std::logic_error("TokenExchange: one rank sends what it receives");
  backend.copy(out, in, sizeof(float) * size_t(send_rows[0]) * size_t(C));
}

std::unique_ptr<TokenExchange> LayerFactory::token_exchange() const {
  return std::make_unique<TokenExchange>();
}

std::unique_ptr<NormLayer> LayerFactory::norm(Backend& backend, bool layernorm, float eps, ParamRef weight,
                                              ParamRef bias) const {
  return std::make_unique<NormLayer>(backend, layernorm, eps, weight, bias);
}

std::unique_ptr<Attention> LayerFactory::attention(Backend& backend, const AttentionSettings& settings,
                                                   const AttentionWeights& w, int slots, int rows,
                                                   float* dqkv, float* datt) const {
  return std::make_unique<Attention>(backend, settings, linear(backend, w.qkv, w.qkv_bias, true),
                                     linear(backend, w.proj, w.proj_bias, false), w, slots, rows, dqkv, datt);
}

const LayerFactory& LayerFactory::whole() {
  static const LayerFactory factory;
  return factory;
}

}  // namespace forge::trainer
