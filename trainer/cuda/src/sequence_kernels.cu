// Sequence parallelism's norm ops (backend_kernels.h, namespace seam): the weight gradients' terms of a
// norm's backward summed per chunk of kNormChunkRows rows (Backend::rmsnorm_backward_partials,
// layernorm_backward_partials), and the chunks' partials added to a gradient in chunk order
// (Backend::add_chunk_sums). The input gradient itself comes from the norms' backward kernels
// (llama_kernels.cu, kernels.cu), called with no weight gradient. Written to be checked against the CPU
// (trainer/src/cpu/rmsnorm.cpp, layernorm.cpp, row_chunks.h) line by line: one thread per (chunk, column),
// adding its chunk's rows in row order from zero, the CPU's order; the chunk sums in double, in chunk
// order, as the CPU's.
#include "backend_kernels.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/cuda/context.h"

#include <algorithm>
#include <cstdint>

namespace forge::trainer::cuda::seam {

namespace {

constexpr int kThreads = 256;

// Element-wise kernels stride over the grid, so a capped grid still covers any n.
int blocks_for(int64_t n) {
  return int(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16));
}
__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

int64_t row_chunks(int64_t N) {
  return (N + kNormChunkRows - 1) / kNormChunkRows;
}

// partial [chunks, C]: item i = (chunk k, column c); rows [32 k, min(N, 32 k + 32)). dw += g x rs, as
// rmsnorm.cpp's backward_row.
__global__ void rmsnorm_chunk_partials_kernel(float* partial, const float* dout, const float* in,
                                              const float* rstd, int64_t N, int C, int64_t items) {
  for (int64_t i = first_index(); i < items; i += grid_stride()) {
    const int64_t k = i / C;
    const int c = int(i % C);
    const int64_t lo = k * kNormChunkRows, hi = lo + kNormChunkRows < N ? lo + kNormChunkRows : N;
    float dw = 0;
    for (int64_t r = lo; r < hi; ++r) dw += dout[r * C + c] * in[r * C + c] * rstd[r];
    partial[i] = dw;
  }
}

// partial [chunks, 2C]: the weight's terms g n (n = (x - mean) rstd) in columns [0, C), the bias's g in
// [C, 2C), as layernorm.cpp's.
__global__ void layernorm_chunk_partials_kernel(float* partial, const float* dout, const float* in,
                                                const float* mean, const float* rstd, int64_t N, int C,
                                                int64_t items) {
  for (int64_t i = first_index(); i < items; i += grid_stride()) {
    const int64_t k = i / C;
    const int c = int(i % C);
    const int64_t lo = k * kNormChunkRows, hi = lo + kNormChunkRows < N ? lo + kNormChunkRows : N;
    float pw = 0, pb = 0;
    for (int64_t r = lo; r < hi; ++r) {
      const float g = dout[r * C + c];
      const float n = (in[r * C + c] - mean[r]) * rstd[r];
      pw += g * n;
      pb += g;
    }
    partial[k * 2 * C + c] = pw;
    partial[k * 2 * C + C + c] = pb;
  }
}

// grad[c] = grad[c] + (the sum of column c over the chunks, in chunk order from zero), in double.
__global__ void add_chunk_sums_kernel(float* grad, const float* partial, int64_t chunks, int width,
                                      int64_t stride) {
  for (int64_t c = first_index(); c < width; c += grid_stride()) {
    double sum = 0;
    for (int64_t k = 0; k < chunks; ++k) sum += double(partial[k * stride + c]);
    grad[c] = float(double(grad[c]) + sum);
  }
}

}  // namespace

void rmsnorm_chunk_partials(float* partial, const float* dout, const float* in, const float* rstd, int N,
                            int C) {
  if (N <= 0 || C <= 0) return;
  const int64_t items = row_chunks(N) * C;
  rmsnorm_chunk_partials_kernel<<<blocks_for(items), kThreads, 0, stream()>>>(partial, dout, in, rstd, N, C,
                                                                              items);
  check_launch("rmsnorm_backward_partials (chunk partials)");
}

void layernorm_chunk_partials(float* partial, const float* dout, const float* in, const float* mean,
                              const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const int64_t items = row_chunks(N) * C;
  layernorm_chunk_partials_kernel<<<blocks_for(items), kThreads, 0, stream()>>>(partial, dout, in, mean, rstd,
                                                                                N, C, items);
  check_launch("layernorm_backward_partials (chunk partials)");
}

void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride) {
  if (grad == nullptr || width <= 0 || chunks <= 0) return;  // null: a frozen weight; no chunks: adds 0
  add_chunk_sums_kernel<<<blocks_for(width), kThreads, 0, stream()>>>(grad, partial, chunks, width, stride);
  check_launch("add_chunk_sums");
}

}  // namespace forge::trainer::cuda::seam
