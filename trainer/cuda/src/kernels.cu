// The memory-bound ops: embedding, LayerNorm (plain and fused with the residual add), bias + GELU, bias
// gradients, cross-entropy over a logits chunk, AdamW and the gradient norm. Math in FP32 whatever the
// storage type; one warp per row for the row-wise ops (rows are short: C <= a few thousand).
#include "device_math.cuh"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <algorithm>
#include <cstdint>

namespace forge::trainer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

int blocks_for(int64_t n, int threads = kThreads) {
  return int(std::min<int64_t>((n + threads - 1) / threads, int64_t(1) << 30));
}

template <class T>
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int T_, int C, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = i / C;
  const int c = int(i % C), t = int(row % T_);
  out[i] = to_f(wte[int64_t(tokens[row]) * C + c]) + to_f(wpe[int64_t(t) * C + c]);
}

__global__ void embedding_backward_wte(float* dwte, const float* dout, const int32_t* tokens, int C,
                                       int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = i / C;
  atomicAdd(dwte + int64_t(tokens[row]) * C + i % C, dout[i]);
}

__global__ void embedding_backward_wpe(float* dwpe, const float* dout, int B, int T_, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over T x C
  if (i >= int64_t(T_) * C) return;
  float s = 0;
  for (int b = 0; b < B; ++b) s += dout[int64_t(b) * T_ * C + i];
  dwpe[i] += s;
}

// One warp per row: mean and rstd in two passes over the row (it stays in L1), then the normalized output.
template <class T>
__device__ void layernorm_row(T* out, float* mean, float* rstd, const float* x, const T* w, const T* b,
                              int64_t r, int C, float eps) {
  const int lane = threadIdx.x % 32;
  float s = 0;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float rs = rsqrtf(warp_sum(v) / C + eps);
  for (int c = lane; c < C; c += 32) out[c] = from_f<T>((x[c] - m) * rs * to_f(w[c]) + to_f(b[c]));
  if (lane == 0) mean[r] = m, rstd[r] = rs;
}

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const float* in, const T* w,
                                         const T* b, float eps, int N, int C) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= N) return;
  layernorm_row(out + r * C, mean, rstd, in + r * C, w, b, r, C, eps);
}

template <class T>
__global__ void residual_layernorm_kernel(float* res_out, T* ln_out, float* mean, float* rstd,
                                          const float* res_in, const float* delta, const T* delta_bias,
                                          const T* w, const T* b, float eps, int N, int C) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= N) return;
  const int lane = threadIdx.x % 32;
  float* x = res_out + r * C;
  for (int c = lane; c < C; c += 32)
    x[c] = res_in[r * C + c] + delta[r * C + c] + (delta_bias != nullptr ? to_f(delta_bias[c]) : 0.0f);
  __syncwarp();
  layernorm_row(ln_out + r * C, mean, rstd, x, w, b, r, C, eps);
}

// A grid-stride set of warps, one row at a time, V columns per lane access. Each warp sums the weight and
// bias gradients of its rows into its own slice of shared memory (its lanes own disjoint columns, so no
// atomics; column c sits at (c % V) * (C / V) + c / V, so a warp's stores hit distinct banks); the block
// adds the slices and adds once per column to the global gradients.
template <class T, int V>
__global__ void layernorm_backward_kernel(float* din, T* din_t, float* dweight, float* dbias, const T* dout,
                                          const float* in, const T* weight, const float* mean,
                                          const float* rstd, int N, int C) {
  extern __shared__ float acc[];  // [warps][2][C]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, CV = C / V;
  float* gw = acc + size_t(warp) * 2 * C;
  float* gb = gw + C;
  for (int c = lane; c < 2 * C; c += 32) gw[c] = 0;
  __syncwarp();
  for (int64_t r = int64_t(blockIdx.x) * warps + warp; r < N; r += int64_t(gridDim.x) * warps) {
    const float* x = in + r * C;
    const T* g = dout + r * C;
    const float m = mean[r], rs = rstd[r];
    float sum_d = 0, sum_dn = 0;
    for (int c = lane * V; c < C; c += 32 * V) {
      float xv[V], gv[V], wv[V];
      load_vec<V>(xv, x + c), load_vec<V>(gv, g + c), load_vec<V>(wv, weight + c);
      for (int k = 0; k < V; ++k) {
        const float n = (xv[k] - m) * rs, d = gv[k] * wv[k];
        sum_d += d;
        sum_dn += d * n;
        gw[k * CV + c / V] += gv[k] * n;
        gb[k * CV + c / V] += gv[k];
      }
    }
    sum_d = warp_sum(sum_d) / C;
    sum_dn = warp_sum(sum_dn) / C;
    for (int c = lane * V; c < C; c += 32 * V) {
      float xv[V], gv[V], wv[V], dv[V];
      load_vec<V>(xv, x + c), load_vec<V>(gv, g + c), load_vec<V>(wv, weight + c),
          load_vec<V>(dv, din + r * C + c);
      for (int k = 0; k < V; ++k) dv[k] += rs * (gv[k] * wv[k] - sum_d - (xv[k] - m) * rs * sum_dn);
      store_vec<V>(din + r * C + c, dv);
      if (din_t != nullptr) store_vec<V>(din_t + r * C + c, dv);
    }
  }
  __syncthreads();
  if (dweight == nullptr) return;  // a frozen norm: only din is wanted
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int at = (c % V) * CV + c / V;
    float sw = 0, sb = 0;
    for (int w = 0; w < warps; ++w) sw += acc[size_t(w) * 2 * C + at], sb += acc[size_t(w) * 2 * C + C + at];
    atomicAdd(dweight + c, sw);
    atomicAdd(dbias + c, sb);
  }
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

template <class T>
__global__ void bias_gelu_kernel(T* out, T* pre, const T* bias, int C, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const T x = from_f<T>(to_f(pre[i]) + to_f(bias[i % C]));
  pre[i] = x;
  out[i] = from_f<T>(gelu(to_f(x)));
}

template <class T, class P>
__global__ void gelu_backward_kernel(T* dinout, const P* pre, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = to_f(pre[i]);
  const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  dinout[i] = from_f<T>(to_f(dinout[i]) * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du));
}

// Block (x: 32 columns, y: 8 row lanes) sums a slab of rows of 32 columns; one atomic per column per block.
template <class T>
__global__ void bias_backward_kernel(float* dbias, const T* dout, int N, int OC, int rows_per_block) {
  __shared__ float part[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_block, r1 = min(N, r0 + rows_per_block);
  float s = 0;
  if (c < OC)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) s += to_f(dout[int64_t(r) * OC + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    for (int y = 1; y < 8; ++y) s += part[y][threadIdx.x];
    atomicAdd(dbias + c, s);
  }
}

__global__ void add_kernel(float* dst, const float* src, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

template <class T>
__global__ void convert_kernel(T* out, const float* in, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f<T>(in[i]);
}

template <class T>
__global__ void cross_entropy_kernel(T* dlogits, float* losses, const float* logits, const int32_t* targets,
                                     int V, float grad_scale) {
  __shared__ float scratch_m[32], scratch_s[32];
  const int64_t r = blockIdx.x;
  const float* row = logits + r * V;
  // One pass for the maximum and the sum of exponentials (online softmax), one for the gradient: the row
  // (50 K FP32 logits at GPT-2 scale) is read twice, not three times, four values per load when aligned.
  float mx = -INFINITY, sum = 0;
  const auto add = [&](float x) {
    if (x > mx)
      sum = sum * expf(mx - x) + 1.0f, mx = x;
    else
      sum += expf(x - mx);
  };
  const bool vec = V % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec)
    for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
      float x[4];
      load_vec<4>(x, row + 4 * j);
      add(x[0]), add(x[1]), add(x[2]), add(x[3]);
    }
  else
    for (int j = threadIdx.x; j < V; j += blockDim.x) add(row[j]);
  // Combine (max, sum) pairs over the warp, then over the block; an empty pair is (-inf, 0).
  const auto combine = [](float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    s = mn == -INFINITY ? 0.0f : s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
  };
  for (int o = 16; o > 0; o >>= 1)
    combine(mx, sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) scratch_m[warp] = mx, scratch_s[warp] = sum;
  __syncthreads();
  mx = lane < warps ? scratch_m[lane] : -INFINITY;
  sum = lane < warps ? scratch_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1)
    combine(mx, sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
  const int target = targets[r];
  if (threadIdx.x == 0) losses[r] = logf(sum) - (row[target] - mx);
  if (dlogits == nullptr) return;
  const float inv = grad_scale / sum;
  T* d = dlogits + r * V;
  const auto grad = [&](int j, float x) { return expf(x - mx) * inv - (j == target ? grad_scale : 0.0f); };
  if (vec)
    for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
      const int c = 4 * j;
      float x[4];
      load_vec<4>(x, row + c);
      for (int k = 0; k < 4; ++k) d[c + k] = from_f<T>(grad(c + k, x[k]));
    }
  else
    for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = from_f<T>(grad(j, row[j]));
}

template <class T>
__global__ void adamw_kernel(float* w, T* work, const float* g, float* m, float* v, size_t n,
                             float grad_scale, float b1, float b2, float eps, float keep, float step_size,
                             float inv_sqrt_bc2) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * grad_scale;
  const float mi = b1 * m[i] + (1.0f - b1) * gi;
  const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float wi = w[i] * keep - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  w[i] = wi;
  if (work != nullptr) work[i] = from_f<T>(wi);
}

__global__ void sum_squares_kernel(double* out, const float* g, size_t n) {
  __shared__ double part[kThreads / 32];
  double s = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * double(g[i]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) s += part[w];
    atomicAdd(out, s);
  }
}

int row_blocks(int N) {
  return (N + kThreads / 32 - 1) / (kThreads / 32);
}

}  // namespace

template <class T>
void embedding_forward(float* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C) {
  const int64_t n = int64_t(B) * T_ * C;
  embedding_forward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, tokens, wte, wpe, T_, C, n);
  check_launch("embedding_forward");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_,
                        int C) {
  const int64_t n = int64_t(B) * T_ * C;
  embedding_backward_wte<<<blocks_for(n), kThreads, 0, stream()>>>(dwte, dout, tokens, C, n);
  check_launch("embedding_backward (wte)");
  embedding_backward_wpe<<<blocks_for(int64_t(T_) * C), kThreads, 0, stream()>>>(dwpe, dout, B, T_, C);
  check_launch("embedding_backward (wpe)");
}

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const float* in, const T* weight, const T* bias,
                       float eps, int N, int C) {
  layernorm_forward_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(out, mean, rstd, in, weight, bias, eps,
                                                                     N, C);
  check_launch("layernorm_forward");
}

template <class T, int V>
void launch_layernorm_backward(float* din, T* din_t, float* dweight, float* dbias, const T* dout,
                               const float* in, const T* weight, const float* mean, const float* rstd, int N,
                               int C) {
  // Eight warps a block while their gradient slices fit in 48 KiB (C <= 768), fewer for wider rows.
  const size_t slice = sizeof(float) * 2 * size_t(C);
  const int warps = int(std::clamp<size_t>(48 * 1024 / slice, 1, 8));
  const size_t smem = slice * size_t(warps);
  if (smem > max_shared_memory()) usage_fail("CUDA layernorm_backward: d_model too large for shared memory");
  allow_smem(layernorm_backward_kernel<T, V>, smem, "cudaFuncSetAttribute (layernorm_backward)");
  const int blocks = int(std::min<int64_t>((int64_t(N) + warps - 1) / warps, 4 * int64_t(sm_count())));
  layernorm_backward_kernel<T, V><<<blocks, 32 * warps, smem, stream()>>>(din, din_t, dweight, dbias, dout,
                                                                          in, weight, mean, rstd, N, C);
  check_launch("layernorm_backward");
}

template <class T>
void layernorm_backward(float* din, T* din_t, float* dweight, float* dbias, const T* dout, const float* in,
                        const T* weight, const float* mean, const float* rstd, int N, int C) {
  // Four columns per access when every row and vector starts 16-byte aligned (C % 4 == 0 and cudaMalloc'd
  // bases; parameter views are offsets of whole tensors whose sizes are multiples of C).
  const bool vec4 = C % 4 == 0 && aligned_to(din, 16) && aligned_to(in, 16) &&
                    aligned_to(dout, 4 * sizeof(T)) && aligned_to(weight, 4 * sizeof(T)) &&
                    (din_t == nullptr || aligned_to(din_t, 4 * sizeof(T)));
  if (vec4)
    launch_layernorm_backward<T, 4>(din, din_t, dweight, dbias, dout, in, weight, mean, rstd, N, C);
  else
    launch_layernorm_backward<T, 1>(din, din_t, dweight, dbias, dout, in, weight, mean, rstd, N, C);
}

template <class T>
void residual_layernorm_forward(float* res_out, T* ln_out, float* mean, float* rstd, const float* res_in,
                                const float* delta, const T* delta_bias, const T* weight, const T* bias,
                                float eps, int N, int C) {
  residual_layernorm_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(
      res_out, ln_out, mean, rstd, res_in, delta, delta_bias, weight, bias, eps, N, C);
  check_launch("residual_layernorm_forward");
}

template <class T>
void bias_gelu_forward(T* out, T* pre, const T* bias, int N, int C) {
  const int64_t n = int64_t(N) * C;
  bias_gelu_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, pre, bias, C, n);
  check_launch("bias_gelu_forward");
}

template <class T, class P>
void gelu_backward(T* dinout, const P* pre, int N, int C) {
  const int64_t n = int64_t(N) * C;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(dinout, pre, n);
  check_launch("gelu_backward");
}

template <class T>
void bias_backward(float* dbias, const T* dout, int N, int OC) {
  constexpr int kRows = 256;
  const dim3 grid((OC + 31) / 32, (N + kRows - 1) / kRows);
  bias_backward_kernel<<<grid, dim3(32, 8), 0, stream()>>>(dbias, dout, N, OC, kRows);
  check_launch("bias_backward");
}

template <class T>
void convert(T* out, const float* in, int64_t n) {
  convert_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, in, n);
  check_launch("convert");
}

void add_to(float* dst, const float* src, int64_t n) {
  add_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(dst, src, n);
  check_launch("add_to");
}

template <class T>
void cross_entropy_rows(T* dlogits, float* losses, const float* logits, const int32_t* targets, int rows,
                        int V, float grad_scale) {
  cross_entropy_kernel<<<rows, 512, 0, stream()>>>(dlogits, losses, logits, targets, V, grad_scale);
  check_launch("cross_entropy_rows");
}

template <class T>
void adamw_update(float* w, T* work, const float* g, float* m, float* v, size_t n, float grad_scale, float b1,
                  float b2, float eps, float keep, float step_size, float inv_sqrt_bc2) {
  adamw_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(w, work, g, m, v, n, grad_scale, b1, b2,
                                                                  eps, keep, step_size, inv_sqrt_bc2);
  check_launch("adamw_update");
}

void sum_squares(double* out, const float* g, size_t n) {
  sum_squares_kernel<<<std::min(blocks_for(int64_t(n)), 1024), kThreads, 0, stream()>>>(out, g, n);
  check_launch("sum_squares");
}

#define FORGE_INSTANTIATE(T)                                                                                 \
  template void embedding_forward<T>(float*, const int32_t*, const T*, const T*, int, int, int);             \
  template void layernorm_forward<T>(T*, float*, float*, const float*, const T*, const T*, float, int, int); \
  template void layernorm_backward<T>(float*, T*, float*, float*, const T*, const float*, const T*,          \
                                      const float*, const float*, int, int);                                 \
  template void residual_layernorm_forward<T>(float*, T*, float*, float*, const float*, const float*,        \
                                              const T*, const T*, const T*, float, int, int);                \
  template void bias_gelu_forward<T>(T*, T*, const T*, int, int);                                            \
  template void gelu_backward<T, T>(T*, const T*, int, int);                                                 \
  template void bias_backward<T>(float*, const T*, int, int);                                                \
  template void convert<T>(T*, const float*, int64_t);                                                       \
  template void cross_entropy_rows<T>(T*, float*, const float*, const int32_t*, int, int, float);            \
  template void adamw_update<T>(float*, T*, const float*, float*, float*, size_t, float, float, float,       \
                                float, float, float, float);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(bf16)
#undef FORGE_INSTANTIATE
template void gelu_backward<float, bf16>(float*, const bf16*, int, int);

}  // namespace forge::trainer::cuda
