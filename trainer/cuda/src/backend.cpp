// The CUDA backend (backend.h): device memory and one op per call on the context's stream. Ops whose
// semantics ops.h's kernels already have (argument order, accumulate or overwrite) call them with T = float;
// the rest call backend_kernels.cu. Only the ops that return a value to the host (the losses, sum_squares)
// and the host copies synchronize.
#include "forge/trainer/cuda/backend.h"
#include "backend_kernels.h"

#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cuda_runtime.h>

#include <vector>

namespace forge::trainer::cuda {

namespace {

// Zero-filled on the stream, so every op queued after it sees zeros; freed by cudaFree (DeviceBuffer), which
// waits for the device, so no queued op still reads it.
class DeviceAllocation final : public Allocation {
 public:
  explicit DeviceAllocation(size_t bytes) : buffer_(bytes) { buffer_.zero(); }
  void* data() override { return buffer_.as<void>(); }

 private:
  DeviceBuffer buffer_;
};

// Page-locked host memory: device copies into it run at the bus's speed and need no bounce buffer.
class PinnedAllocation final : public Allocation {
 public:
  explicit PinnedAllocation(size_t bytes) {
    if (bytes > 0) check_cuda(cudaMallocHost(&data_, bytes), "cudaMallocHost");
  }
  ~PinnedAllocation() override {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  void* data() override { return data_; }

 private:
  void* data_ = nullptr;
};

// The BF16 mode's products on TF32 for one call of this backend (gemm.cpp's switch is the process's: other
// users of ops.h, as forge-cuda-check's CudaTrainer, keep FP32 products).
class Tf32Products {
 public:
  explicit Tf32Products(bool on) { set_fp32_products_tf32(on); }
  ~Tf32Products() { set_fp32_products_tf32(false); }
  Tf32Products(const Tf32Products&) = delete;
  Tf32Products& operator=(const Tf32Products&) = delete;
};

// Device scratch that only grows (the losses' row statistics).
template <class T>
T* scratch(DeviceBuffer& buffer, size_t n) {
  if (buffer.bytes() < n * sizeof(T)) buffer = DeviceBuffer(n * sizeof(T));
  return buffer.as<T>();
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  bool host_memory() const override { return false; }
  bool device_memory(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer is host memory; clear the sticky error
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  size_t device_bytes_in_use() const override { return device_memory_used(); }
  void set_bf16_products(bool on) override { bf16_products_ = on; }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }
  std::unique_ptr<Allocation> allocate(size_t bytes) override {
    return std::make_unique<DeviceAllocation>(bytes);
  }
  std::unique_ptr<Allocation> allocate_host(size_t bytes) override {
    return std::make_unique<PinnedAllocation>(bytes);
  }
  // Both host copies return with the copy done: the host may reuse or read its buffer at once.
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) to_device(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0) to_host(host_dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
               "cudaMemcpyAsync (device to device)");
  }
  void fill(float* x, float value, size_t n) override { seam::fill(x, value, n); }

  // ---- layers
  void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                         const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) override {
    seam::embedding_forward(out, tokens, positions, wte, wpe, B, T, C, vocab_begin, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          const int32_t* positions, int B, int T, int C, int vocab_begin,
                          int vocab_end) override {
    seam::embedding_backward(dwte, dwpe, dout, tokens, positions, B, T, C, vocab_begin, vocab_end);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, int N, int C) override {
    if (N > 0) cuda::layernorm_forward<float>(out, mean, rstd, in, weight, bias, N, C);
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    if (N > 0)
      cuda::layernorm_backward<float>(din, nullptr, dweight, dbias, dout, in, weight, mean, rstd, N, C);
  }
  void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd,
                                  const float* res_in, const float* delta, const float* delta_bias,
                                  const float* weight, const float* bias, int N, int C) override {
    if (N > 0)
      cuda::residual_layernorm_forward<float>(res_out, ln_out, mean, rstd, res_in, delta, delta_bias, weight,
                                              bias, N, C);
  }
  void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias,
                        int N, int C) override {
    seam::residual_forward(res_out, res_in, delta, delta_bias, N, C);
  }
  void matmul_forward(float* out, const float* in, const float* w, const float* bias, int N, int C,
                      int OC) override {
    if (N == 0 || OC == 0) return;
    if (C == 0) {  // an empty product: out = bias (or 0); cuBLASLt takes no k = 0
      seam::fill(out, 0.0f, size_t(N) * size_t(OC));
      if (bias != nullptr) seam::add_bias(out, bias, N, OC);
      return;
    }
    const Tf32Products tf32(bf16_products_);
    cuda::matmul_forward<float, float>(out, in, w, bias, N, C, OC);
  }
  void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in,
                       const float* w, int N, int C, int OC) override {
    if (N == 0 || OC == 0) {  // dout is empty: dw and dbias get nothing, din (if any) is a zero product
      if (din != nullptr) seam::fill(din, 0.0f, size_t(N) * size_t(C));
      return;
    }
    if (C == 0) {
      if (dbias != nullptr) cuda::bias_backward<float>(dbias, dout, N, OC);
      return;
    }
    const Tf32Products tf32(bf16_products_);
    cuda::matmul_backward<float>(din, dw, dbias, dout, in, w, N, C, OC);
  }
  void add_bias(float* out, const float* bias, int N, int OC) override { seam::add_bias(out, bias, N, OC); }
  void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                         int C, int NH) override {
    seam::attention_forward(out, lse, qkv, doc_start, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, const int32_t* doc_start, int B, int T, int C, int NH) override {
    seam::attention_backward(dqkv, dout, qkv, out, lse, doc_start, B, T, C, NH);
  }
  void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                        const int32_t* pos, int rows, int max_len, int C, int NH) override {
    seam::attention_decode(out, qkv, k_cache, v_cache, seq, pos, rows, max_len, C, NH);
  }
  void bias_gelu_forward(float* out, float* pre, const float* bias, int N, int C) override {
    if (int64_t(N) * C > 0) cuda::bias_gelu_forward<float>(out, pre, bias, N, C);
  }
  void gelu_backward(float* dinout, const float* pre, int N, int C) override {
    if (int64_t(N) * C > 0) cuda::gelu_backward<float>(dinout, pre, N, C);
  }

  // ---- Mixture-of-Experts
  void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows,
                   int C) override {
    seam::gather_rows(out, in, index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k,
                    int C, bool accumulate) override {
    seam::combine_rows(out, in, index, weight, N, k, C, accumulate);
  }
  void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                int C) override {
    seam::row_dots(dot, a, b, index, N, k, C);
  }

  // ---- the loss: the kernels' passes with the group's reductions (host buffers) between them, as the CPU
  // op does; each row's weighted loss comes back as a double and is summed here in row order. No early return
  // for an empty chunk: the group's reductions are collectives, called on every rank of the group alike.
  double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                       int vocab_begin, float scale, bool backward, VocabGroup* group, float* nll) override {
    float* mx = scratch<float>(stats_, size_t(3) * size_t(rows));
    float* sum_tgt = mx + rows;
    double* row_loss = scratch<double>(row_loss_, size_t(rows));
    seam::cross_entropy_max(mx, logits, rows, V);
    if (group != nullptr) combine(group, &VocabGroup::max, mx, rows);
    seam::cross_entropy_exp(sum_tgt, logits, mx, targets, rows, V, vocab_begin);
    if (group != nullptr) combine(group, &VocabGroup::sum, sum_tgt, 2 * rows);
    seam::cross_entropy_finish(row_loss, nll, logits, mx, sum_tgt, targets, weights, rows, V, vocab_begin,
                               scale, backward);
    return sum_rows(row_loss, size_t(rows), 1)[0];
  }
  double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights, int rows,
                      int V, int vocab_begin, float temperature, float alpha, float scale, bool backward,
                      VocabGroup* group, double* kl_sum) override {
    float* mx = scratch<float>(stats_, size_t(7) * size_t(rows));
    float* sums = mx + 2 * rows;
    double* row_loss = scratch<double>(row_loss_, size_t(2) * size_t(rows));
    seam::distillation_max(mx, logits, teacher, rows, V);
    if (group != nullptr) combine(group, &VocabGroup::max, mx, 2 * rows);
    seam::distillation_sums(sums, logits, teacher, mx, targets, weights, rows, V, vocab_begin, temperature);
    if (group != nullptr) combine(group, &VocabGroup::sum, sums, 5 * rows);
    seam::distillation_finish(row_loss, logits, teacher, mx, sums, targets, weights, rows, V, vocab_begin,
                              temperature, alpha, scale, backward);
    const auto total = sum_rows(row_loss, size_t(rows), 2);
    if (kl_sum != nullptr) *kl_sum = total[1];
    return total[0];
  }

  // ---- precision
  void round_to_bf16(float* out, const float* in, size_t n) override { seam::round_to_bf16(out, in, n); }
  void to_bf16(uint16_t* out, float* values, size_t n) override { seam::to_bf16(out, values, n); }
  void from_bf16(float* out, const uint16_t* in, size_t n) override { seam::from_bf16(out, in, n); }

  // ---- the optimizer step
  double sum_squares(const float* x, std::span<const FlatRange> ranges) override {
    double* sum = scratch<double>(sum_, 1);
    check_cuda(cudaMemsetAsync(sum, 0, sizeof(double), stream()), "cudaMemsetAsync");
    for (const FlatRange& r : ranges)
      if (r.hi > r.lo) cuda::sum_squares(sum, x + r.lo, r.hi - r.lo);
    double host = 0;
    to_host(&host, sum, sizeof(double));
    return host;
  }
  void scale(float* x, float factor, std::span<const FlatRange> ranges) override {
    for (const FlatRange& r : ranges)
      if (r.hi > r.lo) seam::scale(x + r.lo, factor, r.hi - r.lo);
  }
  // ops.h's AdamW kernel is the CPU's update term for term; a gradient scale of 1 leaves the gradient as is.
  void adamw(float* w, const float* g, float* m, float* v, std::span<const AdamWSegment> segments,
             const AdamWStep& step) override {
    for (const AdamWSegment& s : segments) {
      if (s.hi <= s.lo) continue;
      cuda::adamw_update<float>(w + s.lo, nullptr, g + s.lo, m + s.at, v + s.at, s.hi - s.lo, 1.0f,
                                step.beta1, step.beta2, step.eps, s.decay ? step.keep : 1.0f, step.step_size,
                                step.inv_sqrt_bc2);
    }
  }

 private:
  // A group's reduction of n device floats: through host memory, which VocabGroup works on.
  void combine(VocabGroup* group, void (VocabGroup::*reduce)(float*, int), float* values, int n) {
    host_stats_.resize(size_t(n));
    if (n > 0) to_host(host_stats_.data(), values, sizeof(float) * size_t(n));
    (group->*reduce)(host_stats_.data(), n);
    if (n > 0) to_device(values, host_stats_.data(), sizeof(float) * size_t(n));
  }
  // Column sums, in row order, of `rows` x `width` device doubles.
  std::vector<double> sum_rows(const double* values, size_t rows, size_t width) {
    host_loss_.resize(rows * width);
    if (rows > 0) to_host(host_loss_.data(), values, sizeof(double) * rows * width);
    std::vector<double> total(width, 0.0);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < width; ++j) total[j] += host_loss_[i * width + j];
    return total;
  }

  bool bf16_products_ = false;  // set_bf16_products
  DeviceBuffer stats_, row_loss_, sum_;
  std::vector<float> host_stats_;
  std::vector<double> host_loss_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  stream();  // the context (stream, cuBLASLt) now, on this device, so that its failure is reported here
  return std::make_unique<CudaBackend>();
}

}  // namespace forge::trainer::cuda
