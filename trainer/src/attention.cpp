// The attention slot (attention.h): the order of its ops and the activations its backward reads.
#include "forge/trainer/attention.h"

#include "forge/trainer/loss.h"

#include "forge/common/error.h"

namespace forge::trainer {

Attention::Attention(Backend& backend, const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
                     std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots, int rows,
                     float* dqkv, float* datt)
    : backend_(backend),
      settings_(settings),
      qkv_(std::move(qkv)),
      proj_(std::move(proj)),
      q_norm_(weights.q_norm),
      k_norm_(weights.k_norm),
      dqkv_(dqkv),
      datt_(datt) {
  const AttentionShape& s = settings_.shape;
  const size_t N = size_t(rows);
  if (settings_.rotary) {
    const std::vector<float>& f = settings_.rope.inv_freq;
    inv_freq_ = backend.alloc<float>(f.size());
    backend.copy_from_host(inv_freq_.data(), f.data(), f.size() * sizeof(float));
  }
  // Under full recompute only the first recomputed layer holds the (one) set.
  const int sets = settings_.recompute_full ? (settings_.activations_of == nullptr ? 1 : 0) : slots;
  for (int i = 0; i < sets; ++i) {
    Acts a;
    a.qkv = ActBuffer(backend, N * size_t(s.qkv_width()), settings_.bf16);
    if (settings_.recompute_out == nullptr)
      a.att = ActBuffer(backend, N * size_t(s.q_width()), settings_.bf16);
    a.lse = backend.alloc<float>(N * size_t(s.heads));
    if (settings_.qk_norm) {
      a.qk_saved = backend.alloc<float>(N * size_t(s.heads + s.kv_heads) * size_t(s.head_dim));
      a.qk_rstd = backend.alloc<float>(N * size_t(s.heads + s.kv_heads));
    }
    acts_.push_back(std::move(a));
  }
}

size_t Attention::activation_bytes() const {
  size_t n = 0;
  for (const Acts& a : acts_)
    n +=
        a.qkv.bytes() + a.att.bytes() + (a.lse.size() + a.qk_saved.size() + a.qk_rstd.size()) * sizeof(float);
  return n;
}

Attention::Acts& Attention::acts(int slot) {
  if (!settings_.recompute_full) return acts_[size_t(slot)];
  return settings_.activations_of != nullptr ? settings_.activations_of->acts_.at(0) : acts_.at(0);
}

void Attention::project(int slot, ConstAct in, Act qkv, const int32_t* positions, int rows, int T) {
  Acts& a = acts(slot);
  qkv_->forward(qkv, in, rows);
  if (settings_.qk_norm)
    backend_.head_rmsnorm_forward(qkv, a.qk_saved.data(), a.qk_rstd.data(), q_norm_.value, k_norm_.value,
                                  settings_.norm_eps, rows, settings_.shape);
  if (settings_.rotary)
    backend_.rope(qkv, positions, inv_freq_.data(), settings_.rope.magnitude, rows, T, settings_.shape,
                  false);
}

Act Attention::output(int slot) {
  return settings_.recompute_out != nullptr ? settings_.recompute_out->at() : acts(slot).att.at();
}

void Attention::forward(int slot, ConstAct in, float* out, const DeviceBatch& batch, int B, int T) {
  Acts& a = acts(slot);
  project(slot, in, a.qkv.at(), batch.positions, B * T, T);
  attend_forward(own_slot(slot), output(slot), a.lse.data(), a.qkv.at(), batch, B, T);
  proj_->forward(out, output(slot), B * T);
}

void Attention::backward(int slot, ConstAct in, const float* dout, float* din, const DeviceBatch& batch,
                         int B, int T) {
  Acts& a = acts(slot);
  const int N = B * T;
  // Recomputed: the same kernel on the same q, k, v gives the forward's output (and lse) bit for bit.
  if (settings_.recompute_out != nullptr)
    attend_forward(own_slot(slot), output(slot), a.lse.data(), a.qkv.at(), batch, B, T);
  proj_->backward(datt_, dout, output(slot), N);
  attend_backward(own_slot(slot), dqkv_, datt_, a.qkv.at(), output(slot), a.lse.data(), batch, B, T);
  // The gradients of the rotated q and k turn back (the rotation is orthogonal), then through the norm.
  if (settings_.rotary)
    backend_.rope(dqkv_, batch.positions, inv_freq_.data(), settings_.rope.magnitude, N, T, settings_.shape,
                  true);
  if (settings_.qk_norm)
    backend_.head_rmsnorm_backward(dqkv_, q_norm_.grad, k_norm_.grad, a.qk_saved.data(), a.qk_rstd.data(),
                                   q_norm_.value, k_norm_.value, N, settings_.shape);
  qkv_->backward(din, dqkv_, in, N);
}

void Attention::decode(ConstAct in, float* out, float* k_cache, float* v_cache, const int32_t* seq,
                       const int32_t* pos, int rows, int max_len) {
  Acts& a = acts(0);
  project(0, in, a.qkv.at(), pos, rows, max_len);
  backend_.attention_decode(output(0), a.qkv.at(), k_cache, v_cache, seq, pos, rows, max_len,
                            settings_.shape);
  proj_->forward(out, output(0), rows);
}

void Attention::attend_forward(int, Act out, float* lse, ConstAct qkv, const DeviceBatch& batch, int B,
                               int T) {
  backend_.attention_forward(out, lse, qkv, batch.doc_start, B, T, settings_.shape);
}

void Attention::attend_backward(int, float* dqkv, const float* dout, ConstAct qkv, ConstAct out,
                                const float* lse, const DeviceBatch& batch, int B, int T) {
  backend_.attention_backward(dqkv, dout, qkv, out, lse, batch.doc_start, B, T, settings_.shape);
}

void Backend::attention_chunk_forward(const AttentionChunks&, ChunkRows, float*) {
  fail(ExitCode::kUsage, "parallel.cp > 1: context parallelism is not available on the {} backend yet",
       name());
}

void Backend::attention_chunk_backward(const AttentionChunks&, ChunkRows, const float*, const float*,
                                       ChunkRows, ChunkRows, ChunkRows) {
  fail(ExitCode::kUsage, "parallel.cp > 1: context parallelism is not available on the {} backend yet",
       name());
}

void Backend::attention_delta(float*, const float*, const float*, int, int, const AttentionShape&) {
  fail(ExitCode::kUsage, "parallel.cp > 1: context parallelism is not available on the {} backend yet",
       name());
}

void Backend::copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int width,
                        int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) copy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * size_t(width));
}

void Backend::convert(Act out, ConstAct in, size_t n) {
  if (out.bf16 != in.bf16)
    fail(ExitCode::kUsage, "the {} backend cannot convert between BF16 and FP32 activations", name());
  copy(out.data, in.data, n * (in.bf16 ? sizeof(uint16_t) : sizeof(float)));
}

namespace {
[[noreturn]] void no_sequence_parallel(const Backend& backend) {
  fail(ExitCode::kUsage,
       "parallel.sequence_parallel: sequence parallelism is not available on the {} backend yet: set it to "
       "false",
       backend.name());
}
}  // namespace

void Backend::rmsnorm_backward_partials(float*, float*, const float*, const float*, const float*,
                                        const float*, int, int) {
  no_sequence_parallel(*this);
}

void Backend::layernorm_backward_partials(float*, float*, const float*, const float*, const float*,
                                          const float*, const float*, int, int) {
  no_sequence_parallel(*this);
}

void Backend::add_chunk_sums(float*, const float*, int64_t, int, int) {
  no_sequence_parallel(*this);
}

}  // namespace forge::trainer
