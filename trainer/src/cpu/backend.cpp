// The CPU backend: host memory in huge pages (huge_buffer.h) and the OpenMP/OpenBLAS kernels of
// kernels.h, one op per call. The kernels are FP32: BF16 activations (Act) are widened into scratch before
// an op and its FP32 results rounded into them after, which rounds exactly where the model rounded when it
// stored FP32 results as BF16 itself.
#include "forge/common/huge_buffer.h"
#include "kernels.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace forge::trainer {

namespace {

const size_t kPageBytes = size_t(sysconf(_SC_PAGESIZE));

// FP32 scratch of one op's BF16 operands, per thread (ops run on the calling thread), kept between ops, in
// the memory the backend's own buffers use (64-byte aligned, huge pages from 2 MiB).
struct Scratch {
  HugeBuffer<float> in, in2, out, out2;
};
thread_local Scratch scratch;

float* reserve(HugeBuffer<float>& buffer, size_t n) {
  if (buffer.size() < n) buffer = HugeBuffer<float>(n);
  return buffer.data();
}
// The FP32 values of `n` activations: their own, or their BF16 values widened into `buffer`.
const float* widen(ConstAct a, size_t n, HugeBuffer<float>& buffer) {
  if (!a.bf16) return a.f32();
  float* wide = reserve(buffer, n);
  cpu::from_bf16(wide, static_cast<const uint16_t*>(a.data), int64_t(n));
  return wide;
}
// Where an op writes `n` activations in FP32: their own memory, or `buffer` for narrow() to round.
float* target(Act a, size_t n, HugeBuffer<float>& buffer) {
  return a.bf16 ? reserve(buffer, n) : a.f32();
}
void narrow(Act a, float* values, size_t n) {
  if (a.bf16) cpu::to_bf16(static_cast<uint16_t*>(a.data), values, int64_t(n));
}
// The FP32 values of activations an op changes in place: their own, or their BF16 values widened into
// `buffer` (narrow() rounds them back).
float* in_place(Act a, size_t n, HugeBuffer<float>& buffer) {
  if (!a.bf16) return a.f32();
  float* wide = reserve(buffer, n);
  cpu::from_bf16(wide, static_cast<const uint16_t*>(a.data), int64_t(n));
  return wide;
}

class HostAllocation final : public Allocation {
 public:
  explicit HostAllocation(size_t bytes) : buffer_(bytes) {}
  void* data() override { return buffer_.data(); }

 private:
  HugeBuffer<unsigned char> buffer_;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  bool device_memory(const void*) const override { return false; }
  std::unique_ptr<Allocation> allocate(size_t bytes) override {
    return std::make_unique<HostAllocation>(bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void fill(float* x, float value, size_t n) override { std::fill(x, x + n, value); }
  void release(float* x, size_t n) override {
    const uintptr_t page = uintptr_t(kPageBytes), lo = uintptr_t(x), hi = lo + n * sizeof(float);
    const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
    if (first >= last) return fill(x, 0.0f, n);
    std::memset(x, 0, first - lo);
    std::memset(reinterpret_cast<void*>(last), 0, hi - last);
    // A private anonymous mapping reads as zeros after MADV_DONTNEED. Huge pages are kept where the
    // kernel can: turning them off for the released ranges (MADV_NOHUGEPAGE) was measured to cost ZeRO-2
    // 40% of its step in TLB misses and faults (bench/zero.sh, 2026-12-05), for a finer release.
    void* p = reinterpret_cast<void*>(first);
    if (madvise(p, last - first, MADV_DONTNEED) != 0) std::memset(p, 0, last - first);
  }
  size_t resident_bytes(const float* x, size_t n) const override {
    const uintptr_t page = uintptr_t(kPageBytes), lo = uintptr_t(x) / page * page, hi = uintptr_t(x + n);
    std::vector<unsigned char> in((hi - lo + page - 1) / page);
    if (n == 0 || mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()) != 0) return n * sizeof(float);
    // The range's own bytes in each resident page: the first and last pages are shared with neighbours,
    // and counting them whole (then clamping to n) let a release look a page smaller than it was.
    const uintptr_t begin = uintptr_t(x);
    size_t bytes = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!(in[i] & 1)) continue;
      const uintptr_t page_lo = lo + i * page;
      bytes += std::min(hi, page_lo + page) - std::max(begin, page_lo);
    }
    return bytes;
  }

  void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                         const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) override {
    cpu::embedding_forward(out, tokens, positions, wte, wpe, B, T, C, vocab_begin, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          const int32_t* positions, int B, int T, int C, int vocab_begin,
                          int vocab_end) override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, positions, B, T, C, vocab_begin, vocab_end);
  }
  void layernorm_forward(Act out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, float eps, int N, int C) override {
    const size_t n = size_t(N) * size_t(C);
    float* o = target(out, n, scratch.out);
    cpu::layernorm_forward(o, mean, rstd, in, weight, bias, eps, N, C);
    narrow(out, o, n);
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, N, C);
  }
  void residual_layernorm_forward(float* res_out, Act ln_out, float* mean, float* rstd, const float* res_in,
                                  const float* delta, const float* delta_bias, const float* weight,
                                  const float* bias, float eps, int N, int C) override {
    const size_t n = size_t(N) * size_t(C);
    float* ln = target(ln_out, n, scratch.out);
    cpu::residual_layernorm_forward(res_out, ln, mean, rstd, res_in, delta, delta_bias, weight, bias, eps, N,
                                    C);
    narrow(ln_out, ln, n);
  }
  void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias,
                        int N, int C) override {
    cpu::residual_forward(res_out, res_in, delta, delta_bias, N, C);
  }
  void matmul_forward(Act out, ConstAct in, const float* w, const float* bias, int N, int C,
                      int OC) override {
    const size_t n = size_t(N) * size_t(OC);
    float* o = target(out, n, scratch.out);
    cpu::matmul_forward(o, widen(in, size_t(N) * size_t(C), scratch.in), w, bias, N, C, OC);
    narrow(out, o, n);
  }
  void matmul_bias_gelu_forward(Act out, Act pre, ConstAct in, const float* w, const float* bias, int N,
                                int C, int OC) override {
    const size_t n = size_t(N) * size_t(OC);
    float* p = target(pre, n, scratch.out);
    float* o = target(out, n, scratch.out2);
    cpu::matmul_forward(p, widen(in, size_t(N) * size_t(C), scratch.in), w, nullptr, N, C, OC);
    cpu::bias_gelu_forward(o, p, bias, N, OC);
    narrow(pre, p, n);
    narrow(out, o, n);
  }
  void matmul_backward(float* din, float* dw, float* dbias, const float* dout, ConstAct in, const float* w,
                       int N, int C, int OC) override {
    const float* x = dw != nullptr ? widen(in, size_t(N) * size_t(C), scratch.in) : nullptr;
    cpu::matmul_backward(din, dw, dbias, dout, x, w, N, C, OC);
  }
  void add_bias(float* out, const float* bias, int N, int OC) override { cpu::add_bias(out, bias, N, OC); }
  void attention_forward(Act out, float* lse, ConstAct qkv, const int32_t* doc_start, int B, int T,
                         const AttentionShape& shape) override {
    const size_t rows = size_t(B) * size_t(T), n = rows * size_t(shape.q_width());
    float* o = target(out, n, scratch.out);
    cpu::attention_forward(o, lse, widen(qkv, rows * size_t(shape.qkv_width()), scratch.in), doc_start, B, T,
                           shape);
    narrow(out, o, n);
  }
  void attention_backward(float* dqkv, const float* dout, ConstAct qkv, ConstAct out, const float* lse,
                          const int32_t* doc_start, int B, int T, const AttentionShape& shape) override {
    const size_t rows = size_t(B) * size_t(T);
    cpu::attention_backward(dqkv, dout, widen(qkv, rows * size_t(shape.qkv_width()), scratch.in),
                            widen(out, rows * size_t(shape.q_width()), scratch.in2), lse, doc_start, B, T,
                            shape);
  }
  void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse) override {
    cpu::attention_chunk_forward(c, out, lse);
  }
  void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse,
                                const float* delta, ChunkRows dq, ChunkRows dk, ChunkRows dv) override {
    cpu::attention_chunk_backward(c, dout, lse, delta, dq, dk, dv);
  }
  void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                       const AttentionShape& shape) override {
    cpu::attention_delta(delta, out, dout, B, T, shape);
  }
  void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int width,
                 int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * size_t(width));
  }
  void convert(Act out, ConstAct in, size_t n) override {
    if (in.bf16 && !out.bf16)
      cpu::from_bf16(out.f32(), static_cast<const uint16_t*>(in.data), int64_t(n));
    else if (!in.bf16 && out.bf16)
      cpu::to_bf16(static_cast<uint16_t*>(out.data), in.f32(), int64_t(n));
    else
      Backend::convert(out, in, n);
  }
  void attention_decode(Act out, ConstAct qkv, float* k_cache, float* v_cache, const int32_t* seq,
                        const int32_t* pos, int rows, int max_len, const AttentionShape& shape) override {
    const size_t n = size_t(rows) * size_t(shape.q_width());
    float* o = target(out, n, scratch.out);
    cpu::attention_decode(o, widen(qkv, size_t(rows) * size_t(shape.qkv_width()), scratch.in), k_cache,
                          v_cache, seq, pos, rows, max_len, shape);
    narrow(out, o, n);
  }
  void rope(Act qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
            const AttentionShape& shape, bool inverse) override {
    const size_t n = size_t(N) * size_t(shape.qkv_width());
    float* x = in_place(qkv, n, scratch.in);
    cpu::rope(x, positions, inv_freq, magnitude, N, T, shape, inverse);
    narrow(qkv, x, n);
  }
  void head_rmsnorm_forward(Act qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                            float eps, int N, const AttentionShape& shape) override {
    const size_t n = size_t(N) * size_t(shape.qkv_width());
    float* x = in_place(qkv, n, scratch.in);
    cpu::head_rmsnorm_forward(x, saved, rstd, q_weight, k_weight, eps, N, shape);
    narrow(qkv, x, n);
  }
  void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                             const float* rstd, const float* q_weight, const float* k_weight, int N,
                             const AttentionShape& shape) override {
    cpu::head_rmsnorm_backward(dqkv, dq_weight, dk_weight, saved, rstd, q_weight, k_weight, N, shape);
  }
  void swiglu_forward(Act out, ConstAct in, int N, int H) override {
    const size_t n = size_t(N) * size_t(H);
    float* o = target(out, n, scratch.out);
    cpu::swiglu_forward(o, widen(in, 2 * n, scratch.in), N, H);
    narrow(out, o, n);
  }
  void swiglu_backward(float* din, const float* dout, ConstAct in, int N, int H) override {
    cpu::swiglu_backward(din, dout, widen(in, 2 * size_t(N) * size_t(H), scratch.in), N, H);
  }
  void rmsnorm_forward(Act out, float* rstd, const float* in, const float* weight, float eps, int N,
                       int C) override {
    const size_t n = size_t(N) * size_t(C);
    float* o = target(out, n, scratch.out);
    cpu::rmsnorm_forward(o, rstd, in, weight, eps, N, C);
    narrow(out, o, n);
  }
  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                        const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(din, dweight, dout, in, weight, rstd, N, C);
  }
  void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward_partials(din, partial, dout, in, weight, rstd, N, C);
  }
  void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                   const float* weight, const float* mean, const float* rstd, int N,
                                   int C) override {
    cpu::layernorm_backward_partials(din, partial, dout, in, weight, mean, rstd, N, C);
  }
  void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride) override {
    cpu::add_chunk_sums(grad, partial, chunks, width, stride);
  }
  void residual_rmsnorm_forward(float* res_out, Act out, float* rstd, const float* res_in, const float* delta,
                                const float* delta_bias, const float* weight, float eps, int N,
                                int C) override {
    const size_t n = size_t(N) * size_t(C);
    float* o = target(out, n, scratch.out);
    cpu::residual_rmsnorm_forward(res_out, o, rstd, res_in, delta, delta_bias, weight, eps, N, C);
    narrow(out, o, n);
  }
  void gather_rows(float* out, ConstAct in, const int32_t* index, const float* scale, int rows,
                   int C) override {
    if (in.bf16)
      cpu::gather_rows(out, static_cast<const uint16_t*>(in.data), index, scale, rows, C);
    else
      cpu::gather_rows(out, in.f32(), index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k,
                    int C, bool accumulate) override {
    cpu::combine_rows(out, in, index, weight, N, k, C, accumulate);
  }
  void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                int C) override {
    cpu::row_dots(dot, a, b, index, N, k, C);
  }
  void gelu_backward(float* dinout, ConstAct pre, int N, int C) override {
    cpu::gelu_backward(dinout, widen(pre, size_t(N) * size_t(C), scratch.in), N, C);
  }
  double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                       int vocab_begin, float scale, bool backward, VocabGroup* group, float* nll) override {
    return cpu::cross_entropy(logits, targets, weights, rows, V, vocab_begin, scale, backward, group, nll);
  }
  double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights, int rows,
                      int V, int vocab_begin, float temperature, float alpha, float scale, bool backward,
                      VocabGroup* group, double* kl_sum) override {
    return cpu::distillation(logits, teacher, targets, weights, rows, V, vocab_begin, temperature, alpha,
                             scale, backward, group, kl_sum);
  }
  void round_to_bf16(float* out, const float* in, size_t n) override {
    cpu::round_to_bf16(out, in, int64_t(n));
  }
  double sum_squares(const float* x, std::span<const FlatRange> ranges) override {
    return cpu::sum_squares(x, ranges);
  }
  void scale(float* x, float factor, std::span<const FlatRange> ranges) override {
    cpu::scale(x, factor, ranges);
  }
  void adamw(float* w, const float* g, float* m, float* v, std::span<const AdamWSegment> segments,
             const AdamWStep& step) override {
    cpu::adamw(w, g, m, v, segments, step);
  }
};

}  // namespace

std::unique_ptr<Allocation> Backend::allocate_host(size_t bytes) {
  return std::make_unique<HostAllocation>(bytes);
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace forge::trainer
