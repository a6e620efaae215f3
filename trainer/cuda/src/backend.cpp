// The CUDA backend (backend.h): device memory and one op per call on the context's stream. Ops whose
// semantics ops.h's kernels already have (argument order, accumulate or overwrite) call them with T = float;
// the Llama-family ops (RMSNorm, SwiGLU, rotary positions, qk-norm) call llama_kernels.cu; sequence
// parallelism's norm partials and chunk sums, sequence_kernels.cu; the rest call backend_kernels.cu. Only
// the ops that return a value to the host (the losses, sum_squares) and the host copies synchronize.
//
// BF16 products (set_bf16_products, the model's BF16 mode): the matrix products and the attention run on
// BF16 tensor cores (ops.h with T = bf16: cuBLASLt, the mma.sync attention). The activations the model
// stores as BF16 (Act) go in and come out as they are; weights come from the copy bf16_working_copy keeps
// of the working copy (BF16 values held in FP32, so the copy is exact); an FP32 operand holding BF16 values
// is converted per call. Gradients entering a product are rounded to BF16 there, as llm.c's and every
// BF16 trainer's are. The tensor-core attention takes grouped-query heads and a sliding window, head dims
// 32, 64 and 128; a batch with documents (doc_start) or another head dim keeps the FP32 kernel, with its
// BF16 operands widened. The element-wise and row ops read and write BF16 activations as they are.
#include "forge/trainer/cuda/backend.h"
#include "backend_kernels.h"
#include "llama_kernels.h"
#include "mapped_memory.h"

#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <vector>

namespace forge::trainer::cuda {

namespace {

// Zero-filled on the stream, so every op queued after it sees zeros; freed by cudaFree (DeviceBuffer), which
// waits for the device, so no queued op still reads it. `freed` is told first (the backend then forgets
// the BF16 copies it kept of what the memory held).
class DeviceAllocation final : public Allocation {
 public:
  DeviceAllocation(size_t bytes, std::function<void(const void*, size_t)> freed)
      : buffer_(bytes), freed_(std::move(freed)) {
    buffer_.zero();
  }
  ~DeviceAllocation() override { freed_(buffer_.as<void>(), buffer_.bytes()); }
  void* data() override { return buffer_.as<void>(); }

 private:
  DeviceBuffer buffer_;
  std::function<void(const void*, size_t)> freed_;
};

// Memory whose granules Backend::release hands back (mapped_memory.h); `freed` as above, and the backend
// forgets where it lies.
class MappedAllocation final : public Allocation {
 public:
  MappedAllocation(size_t bytes, std::function<void(const void*, size_t)> freed)
      : memory_(bytes), freed_(std::move(freed)) {}
  ~MappedAllocation() override { freed_(memory_.data(), memory_.bytes()); }
  void* data() override { return memory_.data(); }
  MappedMemory& memory() { return memory_; }

 private:
  MappedMemory memory_;
  std::function<void(const void*, size_t)> freed_;
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
  void mark_step_start() override {
    if (step_start_ == nullptr) {
      check_cuda(cudaEventCreate(&step_start_), "cudaEventCreate");
      check_cuda(cudaEventCreate(&step_end_), "cudaEventCreate");
    }
    check_cuda(cudaEventRecord(step_start_, stream()), "cudaEventRecord");
  }
  double step_seconds() override {
    if (step_start_ == nullptr) return -1;
    check_cuda(cudaEventRecord(step_end_, stream()), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(step_end_), "cudaEventSynchronize");
    MappedMemory::unmap_released(false);  // the step's releases: the device is done with them
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, step_start_, step_end_), "cudaEventElapsedTime");
    return double(ms) / 1e3;
  }
  ~CudaBackend() override {
    for (cudaEvent_t e : {step_start_, step_end_})
      if (e != nullptr) cudaEventDestroy(e);
  }
  // A whole number of granules, or enough of them that rounding up costs little (3%), is mapped memory
  // (mapped_memory.h): under ZeRO-2/3 the flat buffers of weights, gradients and their shards are sized
  // so, and release hands their granules back. The rest is cudaMalloc's.
  std::unique_ptr<Allocation> allocate(size_t bytes) override { return allocate_device(bytes, true); }
  // What is released of the weights' working copy goes from its BF16 copy too (bf16_working_copy).
  void release(float* x, size_t n) override {
    if (n == 0) return;
    if (!on_mapped(x, n * sizeof(float), &MappedMemory::release)) fill(x, 0.0f, n);
    if (bf16* copy = kept_copy(x, n)) {
      if (!on_mapped(copy, n * sizeof(bf16), &MappedMemory::release))
        check_cuda(cudaMemsetAsync(copy, 0, n * sizeof(bf16), stream()), "cudaMemsetAsync");
    }
  }
  void acquire(float* x, size_t n) override {
    if (n == 0) return;
    on_mapped(x, n * sizeof(float), &MappedMemory::acquire);
    if (bf16* copy = kept_copy(x, n)) on_mapped(copy, n * sizeof(bf16), &MappedMemory::acquire);
  }
  size_t release_floats() const override { return granule() > 0 ? kDeviceReleaseFloats : kReleaseFloats; }
  size_t resident_bytes(const float* x, size_t n) const override {
    const auto [memory, offset] = mapping(x);
    return memory != nullptr ? memory->mapped_bytes(offset, n * sizeof(float)) : n * sizeof(float);
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
  void layernorm_forward(Act out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, float eps, int N, int C) override {
    if (N <= 0) return;
    if (out.bf16)
      cuda::layernorm_forward<bf16>(half(out), mean, rstd, in, weights_bf16(weight, size_t(C), w_),
                                    weights_bf16(bias, size_t(C), w2_), eps, N, C);
    else
      cuda::layernorm_forward<float>(out.f32(), mean, rstd, in, weight, bias, eps, N, C);
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    if (N > 0)
      cuda::layernorm_backward<float>(din, nullptr, dweight, dbias, dout, in, weight, mean, rstd, N, C);
  }
  // Sequence parallelism: din from the norms' backward kernels with no weight gradient (din +=), then the
  // weight gradients' terms per chunk of kNormChunkRows rows into partial (overwritten).
  void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* rstd, int N, int C) override {
    if (N <= 0 || C <= 0) return;
    llama::rmsnorm_backward(din, nullptr, dout, in, weight, rstd, N, C, grad_partial_);
    seam::rmsnorm_chunk_partials(partial, dout, in, rstd, N, C);
  }
  void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                   const float* weight, const float* mean, const float* rstd, int N,
                                   int C) override {
    if (N <= 0 || C <= 0) return;
    cuda::layernorm_backward<float>(din, nullptr, nullptr, nullptr, dout, in, weight, mean, rstd, N, C);
    seam::layernorm_chunk_partials(partial, dout, in, mean, rstd, N, C);
  }
  void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride) override {
    seam::add_chunk_sums(grad, partial, chunks, width, stride);
  }
  void residual_layernorm_forward(float* res_out, Act ln_out, float* mean, float* rstd, const float* res_in,
                                  const float* delta, const float* delta_bias, const float* weight,
                                  const float* bias, float eps, int N, int C) override {
    if (N <= 0) return;
    if (ln_out.bf16)
      cuda::residual_layernorm_forward<bf16>(
          res_out, half(ln_out), mean, rstd, res_in, delta, weights_bf16(delta_bias, size_t(C), w_),
          weights_bf16(weight, size_t(C), w2_), weights_bf16(bias, size_t(C), w3_), eps, N, C);
    else
      cuda::residual_layernorm_forward<float>(res_out, ln_out.f32(), mean, rstd, res_in, delta, delta_bias,
                                              weight, bias, eps, N, C);
  }
  void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias,
                        int N, int C) override {
    seam::residual_forward(res_out, res_in, delta, delta_bias, N, C);
  }
  void matmul_forward(Act out, ConstAct in, const float* w, const float* bias, int N, int C,
                      int OC) override {
    if (N == 0 || OC == 0) return;
    const size_t n = size_t(N) * size_t(OC);
    if (C > 0 && (bf16_products_ || in.bf16)) {
      const bf16* x = bf16_operand(in, size_t(N) * size_t(C), in_);
      const bf16* wb = weights_bf16(w, size_t(OC) * size_t(C), w_);
      if (out.bf16)
        cuda::matmul_forward<bf16, bf16>(half(out), x, wb, weights_bf16(bias, size_t(OC), w2_), N, C, OC);
      else
        cuda::matmul_forward<bf16, float>(out.f32(), x, wb, bias, N, C, OC);
      return;
    }
    float* o = target(out, n, wide_);
    if (C == 0) {  // an empty product: out = bias (or 0); cuBLASLt takes no k = 0
      seam::fill(o, 0.0f, n);
      if (bias != nullptr) seam::add_bias(o, bias, N, OC);
    } else {
      cuda::matmul_forward<float, float>(o, in.f32(), w, bias, N, C, OC);
    }
    narrow(out, o, n);
  }
  // BF16: one cuBLASLt product with the GELU_AUX_BIAS epilogue. Otherwise the product, then the bias and
  // GELU kernel, in FP32 (a BF16 result rounded after).
  void matmul_bias_gelu_forward(Act out, Act pre, ConstAct in, const float* w, const float* bias, int N,
                                int C, int OC) override {
    if (out.bf16 != pre.bf16) usage_fail("CUDA matmul_bias_gelu_forward: out and pre in different formats");
    if (N == 0 || OC == 0) return;
    const size_t n = size_t(N) * size_t(OC);
    if (C > 0 && out.bf16) {
      cuda::matmul_bias_gelu_forward<bf16>(half(out), half(pre), bf16_operand(in, size_t(N) * size_t(C), in_),
                                           weights_bf16(w, size_t(OC) * size_t(C), w_),
                                           weights_bf16(bias, size_t(OC), w2_), N, C, OC);
      return;
    }
    float* p = target(pre, n, wide_);
    float* o = target(out, n, wide2_);
    matmul_forward(p, in, w, nullptr, N, C, OC);
    cuda::bias_gelu_forward<float>(o, p, bias, N, OC);
    narrow(pre, p, n);
    narrow(out, o, n);
  }
  void matmul_backward(float* din, float* dw, float* dbias, const float* dout, ConstAct in, const float* w,
                       int N, int C, int OC) override {
    if (N == 0 || OC == 0) {  // dout is empty: dw and dbias get nothing, din (if any) is a zero product
      if (din != nullptr) seam::fill(din, 0.0f, size_t(N) * size_t(C));
      return;
    }
    if (C == 0) {
      if (dbias != nullptr) cuda::bias_backward<float>(dbias, dout, N, OC);
      return;
    }
    if (bf16_products_ || in.bf16)
      cuda::matmul_backward<bf16, float>(
          din, dw, dbias, bf16_copy(dout_, dout, size_t(N) * size_t(OC)),
          dw != nullptr ? bf16_operand(in, size_t(N) * size_t(C), in_) : nullptr,
          weights_bf16(w, size_t(OC) * size_t(C), w_), N, C, OC);
    else
      cuda::matmul_backward<float>(din, dw, dbias, dout, in.f32(), w, N, C, OC);
  }
  void add_bias(float* out, const float* bias, int N, int OC) override { seam::add_bias(out, bias, N, OC); }
  void attention_forward(Act out, float* lse, ConstAct qkv, const int32_t* doc_start, int B, int T,
                         const AttentionShape& shape) override {
    require_causal(shape);
    const size_t rows = size_t(B) * size_t(T), n = rows * size_t(shape.q_width());
    const size_t n_qkv = rows * size_t(shape.qkv_width());
    if (tensor_core_attention(qkv.bf16, doc_start, B, T, shape)) {
      bf16* o = out.bf16 ? half(out) : scratch<bf16>(out_, n);
      cuda::attention_forward<bf16>(o, lse, bf16_operand(qkv, n_qkv, in_), B, T, shape);
      if (!out.bf16) seam::from_bf16(out.f32(), reinterpret_cast<const uint16_t*>(o), n);
      return;
    }
    float* o = target(out, n, wide_);
    seam::attention_forward(o, lse, widen(qkv, n_qkv, wide2_), doc_start, B, T, shape);
    narrow(out, o, n);
  }
  void attention_backward(float* dqkv, const float* dout, ConstAct qkv, ConstAct out, const float* lse,
                          const int32_t* doc_start, int B, int T, const AttentionShape& shape) override {
    require_causal(shape);
    const size_t rows = size_t(B) * size_t(T), n = rows * size_t(shape.q_width());
    const size_t n_qkv = rows * size_t(shape.qkv_width());
    if (!tensor_core_attention(qkv.bf16, doc_start, B, T, shape))
      return seam::attention_backward(dqkv, dout, widen(qkv, n_qkv, wide_), widen(out, n, wide2_), lse,
                                      doc_start, B, T, shape);
    bf16* dqkv_b = scratch<bf16>(dqkv_, n_qkv);
    cuda::attention_backward<bf16>(dqkv_b,
                                   scratch<float>(delta_, size_t(B) * size_t(shape.heads) * size_t(T)),
                                   bf16_copy(dout_, dout, n), bf16_operand(qkv, n_qkv, in_),
                                   bf16_operand(out, n, out_), lse, B, T, shape);
    seam::from_bf16(dqkv, reinterpret_cast<const uint16_t*>(dqkv_b), n_qkv);
  }
  // Context parallelism (context_parallel.h): the chunk attention and the backward's delta on CUDA cores in
  // FP32 (context_attention.cu), and its data movement on the stream.
  void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse) override {
    seam::attention_chunk_forward(c, out, lse);
  }
  void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse,
                                const float* delta, ChunkRows dq, ChunkRows dk, ChunkRows dv) override {
    seam::attention_chunk_backward(c, dout, lse, delta, dq, dk, dv);
  }
  void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                       const AttentionShape& shape) override {
    seam::attention_delta(delta, out, dout, B, T, shape);
  }
  void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int width,
                 int64_t rows) override {
    if (rows <= 0 || width <= 0) return;
    const size_t bytes = sizeof(float) * size_t(width);
    if (rows == 1) return copy(dst, src, bytes);  // the pitches of a single row may be anything
    check_cuda(cudaMemcpy2DAsync(dst, sizeof(float) * size_t(dst_ld), src, sizeof(float) * size_t(src_ld),
                                 bytes, size_t(rows), cudaMemcpyDeviceToDevice, stream()),
               "cudaMemcpy2DAsync (copy_rows)");
  }
  void convert(Act out, ConstAct in, size_t n) override {
    if (n == 0) return;
    if (in.bf16 && !out.bf16)
      seam::from_bf16(out.f32(), static_cast<const uint16_t*>(in.data), n);
    else if (!in.bf16 && out.bf16)
      seam::narrow_bf16(static_cast<uint16_t*>(out.data), in.f32(), n);
    else
      copy(out.data, in.data, n * (in.bf16 ? sizeof(uint16_t) : sizeof(float)));
  }
  void attention_decode(Act out, ConstAct qkv, float* k_cache, float* v_cache, const int32_t* seq,
                        const int32_t* pos, int rows, int max_len, const AttentionShape& shape) override {
    const size_t n = size_t(rows) * size_t(shape.q_width());
    float* o = target(out, n, wide_);
    seam::attention_decode(o, widen(qkv, size_t(rows) * size_t(shape.qkv_width()), wide2_), k_cache, v_cache,
                           seq, pos, rows, max_len, shape);
    narrow(out, o, n);
  }
  void rope(Act qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
            const AttentionShape& shape, bool inverse) override {
    if (qkv.bf16)
      llama::rope<bf16>(half(qkv), positions, inv_freq, magnitude, N, T, shape, inverse);
    else
      llama::rope<float>(qkv.f32(), positions, inv_freq, magnitude, N, T, shape, inverse);
  }
  void head_rmsnorm_forward(Act qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                            float eps, int N, const AttentionShape& shape) override {
    if (qkv.bf16)
      llama::head_rmsnorm_forward<bf16>(half(qkv), saved, rstd, q_weight, k_weight, eps, N, shape);
    else
      llama::head_rmsnorm_forward<float>(qkv.f32(), saved, rstd, q_weight, k_weight, eps, N, shape);
  }
  void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                             const float* rstd, const float* q_weight, const float* k_weight, int N,
                             const AttentionShape& shape) override {
    llama::head_rmsnorm_backward(dqkv, dq_weight, dk_weight, saved, rstd, q_weight, k_weight, N, shape,
                                 grad_partial_);
  }
  void swiglu_forward(Act out, ConstAct in, int N, int H) override {
    const auto run = [&](auto* o) {
      if (in.bf16)
        llama::swiglu_forward(o, static_cast<const bf16*>(in.data), N, H);
      else
        llama::swiglu_forward(o, in.f32(), N, H);
    };
    if (out.bf16)
      run(half(out));
    else
      run(out.f32());
  }
  void swiglu_backward(float* din, const float* dout, ConstAct in, int N, int H) override {
    if (in.bf16)
      llama::swiglu_backward(din, dout, static_cast<const bf16*>(in.data), N, H);
    else
      llama::swiglu_backward(din, dout, in.f32(), N, H);
  }
  void rmsnorm_forward(Act out, float* rstd, const float* in, const float* weight, float eps, int N,
                       int C) override {
    if (out.bf16)
      llama::rmsnorm_forward<bf16>(half(out), rstd, in, weight, eps, N, C);
    else
      llama::rmsnorm_forward<float>(out.f32(), rstd, in, weight, eps, N, C);
  }
  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                        const float* rstd, int N, int C) override {
    llama::rmsnorm_backward(din, dweight, dout, in, weight, rstd, N, C, grad_partial_);
  }
  void residual_rmsnorm_forward(float* res_out, Act out, float* rstd, const float* res_in, const float* delta,
                                const float* delta_bias, const float* weight, float eps, int N,
                                int C) override {
    if (out.bf16)
      llama::residual_rmsnorm_forward<bf16>(res_out, half(out), rstd, res_in, delta, delta_bias, weight, eps,
                                            N, C);
    else
      llama::residual_rmsnorm_forward<float>(res_out, out.f32(), rstd, res_in, delta, delta_bias, weight, eps,
                                             N, C);
  }
  void gelu_backward(float* dinout, ConstAct pre, int N, int C) override {
    const size_t n = size_t(N) * size_t(C);
    if (n == 0) return;
    if (pre.bf16)
      cuda::gelu_backward<float, bf16>(dinout, static_cast<const bf16*>(pre.data), N, C);
    else
      cuda::gelu_backward<float>(dinout, pre.f32(), N, C);
  }

  // ---- Mixture-of-Experts
  void gather_rows(float* out, ConstAct in, const int32_t* index, const float* scale, int rows,
                   int C) override {
    if (in.bf16)
      seam::gather_rows(out, static_cast<const uint16_t*>(in.data), index, scale, rows, C);
    else
      seam::gather_rows(out, in.f32(), index, scale, rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k,
                    int C, bool accumulate) override {
    seam::combine_rows(out, in, index, weight, N, k, C, accumulate);
  }
  void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                int C) override {
    seam::row_dots(dot, a, b, index, N, k, C);
  }

  // ---- the loss
  // As many positions as 1 GiB of FP32 logits holds (5120 at vocabulary 50304, a GPT-2 step in 4 chunks):
  // every chunk's loss is a host read, which drains the stream.
  int classifier_chunk_rows(int vocab) const override {
    constexpr size_t kBytes = size_t(1) << 30;
    const size_t rows = kBytes / (sizeof(float) * size_t(std::max(vocab, 1))) / 256 * 256;
    return int(std::clamp<size_t>(rows, 256, 1 << 20));
  }
  // The kernels' passes with the group's reductions (host buffers) between them, as the CPU
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
  void bf16_working_copy(const float* values, size_t n) override {
    if (n == 0) return;
    bf16* copy = kept_copy(values, n);  // a part of a kept copy (ZeRO-1 refreshes bucket by bucket)
    if (copy == nullptr) {
      // A new working copy, which may reuse the memory of one that is gone: drop every copy it overlaps.
      auto it = weight_copies_.lower_bound(values);
      if (it != weight_copies_.begin() && std::prev(it)->first + std::prev(it)->second.n > values) --it;
      while (it != weight_copies_.end() && it->first < values + n) it = weight_copies_.erase(it);
      WeightCopy& kept = weight_copies_[values];
      kept.n = n;
      kept.values =
          allocate_device(n * sizeof(bf16), false);  // mapped as the working copy is: released with it
      copy = static_cast<bf16*>(kept.values->data());
    }
    cuda::convert<bf16>(copy, values, int64_t(n));
  }
  void round_to_bf16(float* out, const float* in, size_t n) override { seam::round_to_bf16(out, in, n); }

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

  // The BF16 copy of `n` values for a product or the attention, in `buffer` (one per operand of an op).
  const bf16* bf16_copy(DeviceBuffer& buffer, const float* values, size_t n) {
    bf16* copy = scratch<bf16>(buffer, n);
    cuda::convert<bf16>(copy, values, int64_t(n));
    return copy;
  }
  static bf16* half(Act a) { return static_cast<bf16*>(a.data); }
  // `n` activations as a BF16 operand: their own values, or FP32 ones converted into `buffer`.
  const bf16* bf16_operand(ConstAct a, size_t n, DeviceBuffer& buffer) {
    return a.bf16 ? static_cast<const bf16*>(a.data) : bf16_copy(buffer, a.f32(), n);
  }
  // `n` activations as FP32 for a kernel that has only that form: their own, or BF16 widened into `buffer`.
  const float* widen(ConstAct a, size_t n, DeviceBuffer& buffer) {
    if (!a.bf16) return a.f32();
    float* wide = scratch<float>(buffer, n);
    seam::from_bf16(wide, static_cast<const uint16_t*>(a.data), n);
    return wide;
  }
  // Where such a kernel writes `n` activations: their own memory, or `buffer` for narrow() to round into
  // them (the CPU's rounding, bit for bit).
  static float* target(Act a, size_t n, DeviceBuffer& buffer) {
    return a.bf16 ? scratch<float>(buffer, n) : a.f32();
  }
  static void narrow(Act a, float* values, size_t n) {
    if (a.bf16) seam::to_bf16(static_cast<uint16_t*>(a.data), values, n);
  }
  // `holds_copies`: freeing it drops the kept copies of what it held (a kept copy's own memory holds none).
  std::unique_ptr<Allocation> allocate_device(size_t bytes, bool holds_copies) {
    auto freed = [this, holds_copies](const void* p, size_t n) {
      if (holds_copies) forget_copies(p, n);
      mapped_.erase(reinterpret_cast<uintptr_t>(p));
    };
    const size_t g = granule();
    if (g == 0 || bytes == 0 || (bytes % g != 0 && bytes < 32 * g))
      return std::make_unique<DeviceAllocation>(bytes, std::move(freed));
    auto a = std::make_unique<MappedAllocation>(bytes, std::move(freed));
    mapped_[reinterpret_cast<uintptr_t>(a->data())] = &a->memory();
    return a;
  }
  static size_t granule() {
    static const size_t g = MappedMemory::granule();
    return g;
  }
  // The mapped memory holding `p`, and where in it; null when cudaMalloc's.
  std::pair<MappedMemory*, size_t> mapping(const void* p) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = mapped_.upper_bound(at);
    if (it == mapped_.begin()) return {nullptr, 0};
    --it;
    if (at - it->first >= it->second->bytes()) return {nullptr, 0};
    return {it->second, at - it->first};
  }
  // Calls `op` (release or acquire) on [p, p + bytes) when mapped memory holds it: whether it did.
  bool on_mapped(const void* p, size_t bytes, void (MappedMemory::*op)(size_t, size_t)) {
    const auto [memory, offset] = mapping(p);
    if (memory == nullptr) return false;
    (memory->*op)(offset, bytes);
    return true;
  }
  // Drops the kept copies of working copies in [p, p + bytes), memory being freed: a later allocation there
  // holds something else.
  void forget_copies(const void* p, size_t bytes) {
    const auto* lo = static_cast<const float*>(p);
    const auto* hi = reinterpret_cast<const float*>(static_cast<const char*>(p) + bytes);
    for (auto it = weight_copies_.lower_bound(lo); it != weight_copies_.end() && it->first < hi;)
      it = weight_copies_.erase(it);
  }
  // Where the kept copy holds [values, values + n): null when no kept copy holds all of them.
  bf16* kept_copy(const float* values, size_t n) {
    auto it = weight_copies_.upper_bound(values);
    if (it == weight_copies_.begin()) return nullptr;
    --it;
    const size_t at = size_t(values - it->first);
    return at + n <= it->second.n ? static_cast<bf16*>(it->second.values->data()) + at : nullptr;
  }
  // `n` weights at `w` (null: none) in BF16: from the kept copy of the working copy they lie in, else
  // converted now into `buffer` (weights no model announced, as a test's or the MoE router's).
  const bf16* weights_bf16(const float* w, size_t n, DeviceBuffer& buffer) {
    if (w == nullptr) return nullptr;
    const bf16* kept = kept_copy(w, n);
    return kept != nullptr ? kept : bf16_copy(buffer, w, n);
  }
  // The kernels here are causal; a vision encoder's bidirectional attention runs on the CPU backend.
  static void require_causal(const AttentionShape& shape) {
    if (!shape.causal)
      throw std::invalid_argument(
          "the CUDA backend has no bidirectional attention yet (a vision encoder): train it with "
          "run.device = cpu");
  }
  // Whether the attention runs on the tensor-core kernels: BF16 products or operands, no documents, and a
  // head dim that they have (any grouping of the query heads, any window).
  bool tensor_core_attention(bool bf16_operands, const int32_t* doc_start, int B, int T,
                             const AttentionShape& shape) const {
    if (!(bf16_products_ || bf16_operands) || doc_start != nullptr || int64_t(B) * T == 0 ||
        shape.heads <= 0 || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0)
      return false;
    return shape.head_dim == 32 || shape.head_dim == 64 || shape.head_dim == 128;
  }

  struct WeightCopy {
    size_t n = 0;
    std::unique_ptr<Allocation> values;  // bf16
  };
  cudaEvent_t step_start_ = nullptr, step_end_ = nullptr;  // mark_step_start, step_seconds
  bool bf16_products_ = false;                             // set_bf16_products
  // The mapped allocations by their start (declared first: the kept copies' memory, freed with
  // weight_copies_, erases itself here).
  std::map<uintptr_t, MappedMemory*> mapped_;
  std::map<const float*, WeightCopy> weight_copies_;  // bf16_working_copy, by the working copy's start
  DeviceBuffer in_, dout_, w_, w2_, w3_, out_, dqkv_, delta_;  // BF16 operands (and the attention's delta)
  DeviceBuffer wide_, wide2_;                                  // FP32 forms of BF16 activations
  DeviceBuffer grad_partial_;  // the RMSNorms' per-block weight-gradient partials (llama_kernels.h)
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
