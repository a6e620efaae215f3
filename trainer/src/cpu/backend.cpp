// The CPU backend: host memory in huge pages (huge_buffer.h) and the OpenMP/OpenBLAS kernels of
// kernels.h, one op per call.
#include "forge/common/huge_buffer.h"
#include "kernels.h"

#include <algorithm>
#include <cstring>

namespace forge::trainer {

namespace {

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

  void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                         const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) override {
    cpu::embedding_forward(out, tokens, positions, wte, wpe, B, T, C, vocab_begin, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          const int32_t* positions, int B, int T, int C, int vocab_begin,
                          int vocab_end) override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, positions, B, T, C, vocab_begin, vocab_end);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, int N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, in, weight, bias, N, C);
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_backward(din, dweight, dbias, dout, in, weight, mean, rstd, N, C);
  }
  void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd,
                                  const float* res_in, const float* delta, const float* delta_bias,
                                  const float* weight, const float* bias, int N, int C) override {
    cpu::residual_layernorm_forward(res_out, ln_out, mean, rstd, res_in, delta, delta_bias, weight, bias, N,
                                    C);
  }
  void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias,
                        int N, int C) override {
    cpu::residual_forward(res_out, res_in, delta, delta_bias, N, C);
  }
  void matmul_forward(float* out, const float* in, const float* w, const float* bias, int N, int C,
                      int OC) override {
    cpu::matmul_forward(out, in, w, bias, N, C, OC);
  }
  void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                       const float* w, int N, int C, int OC) override {
    cpu::matmul_backward(din, dw, dbias, dout, in, w, N, C, OC);
  }
  void add_bias(float* out, const float* bias, int N, int OC) override { cpu::add_bias(out, bias, N, OC); }
  void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                         int C, int NH) override {
    cpu::attention_forward(out, lse, qkv, doc_start, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, const int32_t* doc_start, int B, int T, int C, int NH) override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH);
  }
  void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                        const int32_t* pos, int rows, int max_len, int C, int NH) override {
    cpu::attention_decode(out, qkv, k_cache, v_cache, seq, pos, rows, max_len, C, NH);
  }
  void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows,
                   int C) override {
    cpu::gather_rows(out, in, index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k,
                    int C, bool accumulate) override {
    cpu::combine_rows(out, in, index, weight, N, k, C, accumulate);
  }
  void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                int C) override {
    cpu::row_dots(dot, a, b, index, N, k, C);
  }
  void bias_gelu_forward(float* out, float* pre, const float* bias, int N, int C) override {
    cpu::bias_gelu_forward(out, pre, bias, N, C);
  }
  void gelu_backward(float* dinout, const float* pre, int N, int C) override {
    cpu::gelu_backward(dinout, pre, N, C);
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
  void to_bf16(uint16_t* out, float* values, size_t n) override { cpu::to_bf16(out, values, int64_t(n)); }
  void from_bf16(float* out, const uint16_t* in, size_t n) override { cpu::from_bf16(out, in, int64_t(n)); }
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
