// The Llama-family blocks' memory-bound ops (llama_kernels.h): RMSNorm and its residual-fused form, the
// per-head RMSNorm of q and k, SwiGLU and rotary positions, each one pass over its data. Math in FP32 in the
// CPU ops' order of operations (trainer/src/cpu/rmsnorm.cpp, swiglu.cpp, rope.cpp), so that FP32 results
// agree to rounding; BF16 storage is widened on load and rounded once on store.
//
// Rows are short (C up to a few thousand, a head up to 256): one warp per row or head, the row in
// registers, four columns per lane access where the tensors allow (as kernels.cu's LayerNorm backward).
// Weight gradients are sums over rows, taken deterministically: each lane sums its own columns over its
// warp's rows, the block adds its warps in warp order into one partial row, and a second kernel adds a
// fixed number of partial rows (kGradBlocks, not one per SM: the same bits on every GPU) in a fixed order.
#include "device_math.cuh"
#include "forge/trainer/backend.h"
#include "llama_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace forge::trainer::cuda::llama {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGradBlocks = 256;
// RMSNorm rows in registers: up to kMaxChunks four-column chunks per lane (C <= 8192); the backward, which
// holds a row and its gradient, up to kMaxBackwardChunks (C <= 4096). Wider or unaligned rows take the
// kernels that loop over the row.
constexpr int kMaxChunks = 16;
constexpr int kMaxBackwardChunks = 8;
// A head in registers: up to kHeadPerLane values per lane.
constexpr int kHeadPerLane = 8;
constexpr int kMaxHeadDim = 32 * kHeadPerLane;

__device__ __forceinline__ int lane_id() {
  return int(threadIdx.x % 32);
}
__device__ __forceinline__ int warp_in_block() {
  return int(threadIdx.x / 32);
}
__device__ __forceinline__ int64_t warp_index() {
  return int64_t(blockIdx.x) * kWarps + warp_in_block();
}
__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

// Element-wise kernels stride over the grid, so a capped grid still covers any n.
int blocks_for(int64_t n) {
  return int(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16));
}
int warp_blocks(int64_t items) {
  return int((items + kWarps - 1) / kWarps);
}
// Blocks of a weight-gradient kernel over `items` rows: one warp per row at most.
int grad_blocks(int64_t items) {
  return int(std::min<int64_t>(warp_blocks(items), kGradBlocks));
}

// Calls f(std::integral_constant<int, K>()) with K the smallest power of two not below `chunks`, at most
// Max (the caller has checked chunks <= Max).
template <int Max, int K = 1, class F>
void with_chunks(int chunks, F&& f) {
  if constexpr (K < Max) {
    if (chunks > K) return with_chunks<Max, 2 * K>(chunks, f);
  }
  f(std::integral_constant<int, K>());
}

template <class T>
bool vec4_aligned(const T* p) {
  return p == nullptr || aligned_to(p, 4 * sizeof(T));
}

// dst[c] += the sum of column c over `rows` partial rows (row stride `stride`), c < n. A block takes 32
// columns with 8 row lanes: lane y sums rows y, y + 8, ... in order, then row lane 0 adds the eight in
// order. In double, as the CPU adds its chunk partials.
__global__ void add_column_sums_kernel(float* dst, const float* partial, int rows, int n, int64_t stride) {
  __shared__ double part[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  double s = 0;
  if (c < n)
    for (int b = threadIdx.y; b < rows; b += 8) s += partial[int64_t(b) * stride + c];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    for (int y = 1; y < 8; ++y) s += part[y][threadIdx.x];
    dst[c] = float(double(dst[c]) + s);
  }
}

void add_column_sums(float* dst, const float* partial, int rows, int n, int64_t stride) {
  if (dst == nullptr || n <= 0 || rows <= 0) return;  // null: a frozen weight
  add_column_sums_kernel<<<(n + 31) / 32, dim3(32, 8), 0, stream()>>>(dst, partial, rows, n, stride);
  check_launch("weight gradient (column sums)");
}

float* grow(DeviceBuffer& buffer, size_t n) {
  if (buffer.bytes() < n * sizeof(float)) buffer = DeviceBuffer(n * sizeof(float));
  return buffer.as<float>();
}

// ---- RMSNorm: out = (x x rstd) x w, rstd = 1 / sqrt(mean(x^2) + eps); with kResidual, x = res_in + delta
// (+ delta_bias) is formed first and stored to res_out.

// Lane l holds columns 4 (l + 32 j) .. + 3 of its row, j < K: the row is read once.
template <class O, int K, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(float* res_out, O* out, float* rstd, const float* in, const float* delta,
                   const float* delta_bias, const float* weight, float eps, int N, int C) {
  const int64_t r = warp_index();
  if (r >= N) return;
  const int lane = lane_id();
  float x[K][4];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const int c = 4 * (lane + 32 * j);
    if (c < C) {
      load_vec<4>(x[j], in + r * C + c);
      if constexpr (kResidual) {
        float d[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        load_vec<4>(d, delta + r * C + c);
        if (delta_bias != nullptr) load_vec<4>(b, delta_bias + c);
#pragma unroll
        for (int k = 0; k < 4; ++k) x[j][k] = delta_bias != nullptr ? x[j][k] + d[k] + b[k] : x[j][k] + d[k];
        store_vec<4>(res_out + r * C + c, x[j]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) ss += x[j][k] * x[j][k];
    }
  }
  const float rs = rsqrtf(warp_sum(ss) / float(C) + eps);
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const int c = 4 * (lane + 32 * j);
    if (c < C) {
      float w[4], y[4];
      load_vec<4>(w, weight + c);
#pragma unroll
      for (int k = 0; k < 4; ++k) y[k] = x[j][k] * rs * w[k];
      store_vec<4>(out + r * C + c, y);
    }
  }
  if (lane == 0) rstd[r] = rs;
}

// Any row: two loops over it, the second reading what the first read (or, residual, wrote) from L1.
template <class O, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_loop_kernel(float* res_out, O* out, float* rstd, const float* in, const float* delta,
                        const float* delta_bias, const float* weight, float eps, int N, int C) {
  const int64_t r = warp_index();
  if (r >= N) return;
  const int lane = lane_id();
  const float* x = in + r * C;
  float ss = 0;
  if constexpr (kResidual) {
    float* y = res_out + r * C;
    for (int c = lane; c < C; c += 32) {
      const float v =
          delta_bias != nullptr ? x[c] + delta[r * C + c] + delta_bias[c] : x[c] + delta[r * C + c];
      y[c] = v;
      ss += v * v;
    }
    x = y;  // each lane reads back only its own columns
  } else {
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  }
  const float rs = rsqrtf(warp_sum(ss) / float(C) + eps);
  for (int c = lane; c < C; c += 32) out[r * C + c] = from_f<O>(x[c] * rs * weight[c]);
  if (lane == 0) rstd[r] = rs;
}

template <class O, bool kResidual>
void launch_rmsnorm(float* res_out, O* out, float* rstd, const float* in, const float* delta,
                    const float* delta_bias, const float* weight, float eps, int N, int C, const char* op) {
  if (N <= 0) return;
  const int chunks = (C + 127) / 128;
  const bool vec = C % 4 == 0 && chunks <= kMaxChunks && vec4_aligned(out) && vec4_aligned(in) &&
                   vec4_aligned(weight) && vec4_aligned(res_out) && vec4_aligned(delta) &&
                   vec4_aligned(delta_bias);
  if (vec)
    with_chunks<kMaxChunks>(chunks, [&](auto k) {
      rmsnorm_kernel<O, decltype(k)::value, kResidual><<<warp_blocks(N), kThreads, 0, stream()>>>(
          res_out, out, rstd, in, delta, delta_bias, weight, eps, N, C);
    });
  else
    rmsnorm_loop_kernel<O, kResidual><<<warp_blocks(N), kThreads, 0, stream()>>>(
        res_out, out, rstd, in, delta, delta_bias, weight, eps, N, C);
  check_launch(op);
}

// Backward of a row (rmsnorm.cpp): s = sum g w x, dx = rs (g w) - x rs^3 s / C, dw += g x rs.
//
// The block's weight-gradient partial row: each warp's sums (a lane's own columns) added into block_dw in
// warp order, then stored as row blockIdx.x of `partial`. `add(c)` gives column c's sum of the calling lane.
template <class Add>
__device__ void block_partial(float* partial, float* block_dw, int n, Add&& add_lane_sums) {
  for (int w = 0; w < kWarps; ++w) {
    if (warp_in_block() == w) add_lane_sums(w == 0);
    __syncthreads();
  }
  for (int c = threadIdx.x; c < n; c += blockDim.x) partial[int64_t(blockIdx.x) * n + c] = block_dw[c];
}

// Lane l takes columns 4 (l + 32 j) .. + 3 of every row its warp takes, j < K, and keeps their dw sums in
// registers.
template <int K>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(float* din, float* partial, const float* dout, const float* in,
                            const float* weight, const float* rstd, int N, int C) {
  extern __shared__ float block_dw[];  // [C]
  const int lane = lane_id();
  float dw[K][4];
#pragma unroll
  for (int j = 0; j < K; ++j) dw[j][0] = dw[j][1] = dw[j][2] = dw[j][3] = 0;
  for (int64_t r = warp_index(); r < N; r += int64_t(gridDim.x) * kWarps) {
    float x[K][4], g[K][4];
    float s = 0;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const int c = 4 * (lane + 32 * j);
      if (c < C) {
        float w[4];
        load_vec<4>(x[j], in + r * C + c), load_vec<4>(g[j], dout + r * C + c), load_vec<4>(w, weight + c);
#pragma unroll
        for (int k = 0; k < 4; ++k) s += g[j][k] * w[k] * x[j][k];
      }
    }
    const float rs = rstd[r], coef = rs * rs * rs * warp_sum(s) / float(C);
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const int c = 4 * (lane + 32 * j);
      if (c < C) {
        float w[4], d[4];
        load_vec<4>(w, weight + c), load_vec<4>(d, din + r * C + c);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          d[k] += rs * (g[j][k] * w[k]) - x[j][k] * coef;
          dw[j][k] += g[j][k] * x[j][k] * rs;
        }
        store_vec<4>(din + r * C + c, d);
      }
    }
  }
  block_partial(partial, block_dw, C, [&](bool first) {
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const int c = 4 * (lane + 32 * j);
      if (c < C)
#pragma unroll
        for (int k = 0; k < 4; ++k) block_dw[c + k] = first ? dw[j][k] : block_dw[c + k] + dw[j][k];
    }
  });
}

// Any row: the lanes loop over it; each warp sums dw into its own slice of shared memory ([warps][C]),
// and the block adds the slices in warp order.
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_loop_kernel(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* rstd, int N, int C) {
  extern __shared__ float slices[];
  const int lane = lane_id(), warp = warp_in_block(), warps = int(blockDim.x / 32);
  float* dw = slices + int64_t(warp) * C;
  for (int c = lane; c < C; c += 32) dw[c] = 0;
  for (int64_t r = int64_t(blockIdx.x) * warps + warp; r < N; r += int64_t(gridDim.x) * warps) {
    const float *x = in + r * C, *g = dout + r * C;
    float s = 0;
    for (int c = lane; c < C; c += 32) s += g[c] * weight[c] * x[c];
    const float rs = rstd[r], coef = rs * rs * rs * warp_sum(s) / float(C);
    for (int c = lane; c < C; c += 32) {
      din[r * C + c] += rs * (g[c] * weight[c]) - x[c] * coef;
      dw[c] += g[c] * x[c] * rs;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float s = slices[c];
    for (int w = 1; w < warps; ++w) s += slices[int64_t(w) * C + c];
    partial[int64_t(blockIdx.x) * C + c] = s;
  }
}

// ---- Per-head RMSNorm of the q and k heads (Qwen 3): one warp per (row, head), the heads of a row being
// its heads + kv_heads query and key heads, the first (heads + kv_heads) x hd columns. Lane l holds columns
// V (l + 32 j) .. + V - 1, j < kHeadPerLane / V.

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    head_rmsnorm_forward_kernel(T* qkv, float* saved, float* rstd, const float* q_weight,
                                const float* k_weight, float eps, int64_t items, int normed, int heads,
                                int hd, int64_t stride) {
  constexpr int J = kHeadPerLane / V;
  const int64_t item = warp_index();  // = row x normed + head: its place in rstd, and in saved x hd
  if (item >= items) return;
  const int64_t r = item / normed;
  const int h = int(item % normed), lane = lane_id();
  T* x = qkv + r * stride + int64_t(h) * hd;
  float* keep = saved + item * hd;
  const float* w = h < heads ? q_weight : k_weight;
  float v[J][V];
  float ss = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = V * (lane + 32 * j);
    if (c < hd) {
      load_vec<V>(v[j], x + c);
      store_vec<V>(keep + c, v[j]);
#pragma unroll
      for (int k = 0; k < V; ++k) ss += v[j][k] * v[j][k];
    }
  }
  const float rs = rsqrtf(warp_sum(ss) / float(hd) + eps);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = V * (lane + 32 * j);
    if (c < hd) {
      float wv[V], y[V];
      load_vec<V>(wv, w + c);
#pragma unroll
      for (int k = 0; k < V; ++k) y[k] = v[j][k] * rs * wv[k];
      store_vec<V>(x + c, y);
    }
  }
  if (lane == 0) rstd[item] = rs;
}

// In place on dqkv (the gradient of the normed values becomes that of their inputs); a lane keeps its
// columns' dw sums for the query weight and the key weight apart. Partial rows of 2 x hd: q, then k.
template <int V>
__global__ void __launch_bounds__(kThreads)
    head_rmsnorm_backward_kernel(float* dqkv, float* partial, const float* saved, const float* rstd,
                                 const float* q_weight, const float* k_weight, int64_t items, int normed,
                                 int heads, int hd, int64_t stride) {
  constexpr int J = kHeadPerLane / V;
  __shared__ __align__(16) float block_dw[2 * kMaxHeadDim];
  const int lane = lane_id();
  float dwq[J][V], dwk[J][V];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int k = 0; k < V; ++k) dwq[j][k] = dwk[j][k] = 0;
  for (int64_t item = warp_index(); item < items; item += int64_t(gridDim.x) * kWarps) {
    const int64_t r = item / normed;
    const int h = int(item % normed);
    const bool query = h < heads;
    float* g = dqkv + r * stride + int64_t(h) * hd;
    const float* x = saved + item * hd;
    const float* w = query ? q_weight : k_weight;
    float gv[J][V], xv[J][V];
    float s = 0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = V * (lane + 32 * j);
      if (c < hd) {
        float wv[V];
        load_vec<V>(gv[j], g + c), load_vec<V>(xv[j], x + c), load_vec<V>(wv, w + c);
#pragma unroll
        for (int k = 0; k < V; ++k) s += gv[j][k] * wv[k] * xv[j][k];
      }
    }
    const float rs = rstd[item], coef = rs * rs * rs * warp_sum(s) / float(hd);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = V * (lane + 32 * j);
      if (c < hd) {
        float wv[V], d[V];
        load_vec<V>(wv, w + c);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float term = gv[j][k] * xv[j][k] * rs;
          if (query)
            dwq[j][k] += term;
          else
            dwk[j][k] += term;
          d[k] = rs * (gv[j][k] * wv[k]) - xv[j][k] * coef;
        }
        store_vec<V>(g + c, d);
      }
    }
  }
  block_partial(partial, block_dw, 2 * hd, [&](bool first) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = V * (lane + 32 * j);
      if (c < hd)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float* q = block_dw + c + k;
          float* kk = block_dw + hd + c + k;
          *q = first ? dwq[j][k] : *q + dwq[j][k];
          *kk = first ? dwk[j][k] : *kk + dwk[j][k];
        }
    }
  });
}

// ---- SwiGLU: row = gate | up (H each), out = silu(gate) x up with silu(g) = g / (1 + exp(-g)).

template <class I, class O, int V>
__global__ void swiglu_forward_kernel(O* out, const I* in, int H, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t e = i * V, r = e / H;
    const int c = int(e % H);
    float g[V], u[V], y[V];
    load_vec<V>(g, in + r * 2 * H + c), load_vec<V>(u, in + r * 2 * H + H + c);
#pragma unroll
    for (int k = 0; k < V; ++k) y[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
    store_vec<V>(out + e, y);
  }
}

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g).
template <class I, int V>
__global__ void swiglu_backward_kernel(float* din, const float* dout, const I* in, int H, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t e = i * V, r = e / H;
    const int c = int(e % H);
    float g[V], u[V], d[V], dg[V], du[V];
    load_vec<V>(g, in + r * 2 * H + c), load_vec<V>(u, in + r * 2 * H + H + c), load_vec<V>(d, dout + e);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float s = 1.0f / (1.0f + expf(-g[k]));
      dg[k] = d[k] * u[k] * (s * (1.0f + g[k] * (1.0f - s)));
      du[k] = d[k] * (g[k] * s);
    }
    store_vec<V>(din + r * 2 * H + c, dg), store_vec<V>(din + r * 2 * H + H + c, du);
  }
}

// ---- Rotary positions (rope.cpp): the pair (x[i], x[i + half]) of every q and k head of the row at
// position p turns by p x inv_freq[i]. A thread takes V consecutive pairs of one row, their angles' cos and
// sin once, and every head of the row. The angle is rounded to float as the CPU (and Hugging Face) round
// it; its cos and sin are taken in double and rounded to float: --use_fast_math would make cosf and sinf
// the hardware approximations, whose error grows with the angle (positions in the thousands).

// Loads G heads' pairs before storing any: the stores could alias the next loads as far as the compiler
// knows, so without this it would keep one head's loads in flight at a time.
template <int G, int V, class T>
__device__ __forceinline__ void rotate_heads(T* x, int hd, int half, const float (&cs)[V],
                                             const float (&sn)[V]) {
  float a[G][V], b[G][V];
#pragma unroll
  for (int h = 0; h < G; ++h) load_vec<V>(a[h], x + h * hd), load_vec<V>(b[h], x + h * hd + half);
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float ya[V], yb[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      ya[k] = a[h][k] * cs[k] - b[h][k] * sn[k];
      yb[k] = b[h][k] * cs[k] + a[h][k] * sn[k];
    }
    store_vec<V>(x + h * hd, ya), store_vec<V>(x + h * hd + half, yb);
  }
}

template <class T, int V>
__global__ void rope_kernel(T* qkv, const int32_t* positions, const float* inv_freq, float magnitude,
                            float sign, int T_, int rotated, int hd, int64_t stride, int64_t n) {
  const int half = hd / 2, per_row = half / V;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / per_row;
    const int i0 = int(i % per_row) * V;
    const float p = float(positions != nullptr ? positions[r] : int32_t(r % T_));
    float cs[V], sn[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float angle = p * inv_freq[i0 + k];
      double s, c;
      sincos(double(angle), &s, &c);
      cs[k] = float(c) * magnitude;
      sn[k] = sign * float(s) * magnitude;
    }
    T* x = qkv + r * stride + i0;
    int h = 0;
    for (; h + 4 <= rotated; h += 4, x += 4 * hd) rotate_heads<4, V>(x, hd, half, cs, sn);
    for (; h < rotated; ++h, x += hd) rotate_heads<1, V>(x, hd, half, cs, sn);
  }
}

void check_heads(const AttentionShape& shape, const char* op) {
  if (shape.heads <= 0 || shape.kv_heads < 0 || shape.head_dim <= 0)
    usage_fail(std::string("CUDA backend ") + op + ": heads and head dim must be positive");
}

}  // namespace

template <class O>
void rmsnorm_forward(O* out, float* rstd, const float* in, const float* weight, float eps, int N, int C) {
  launch_rmsnorm<O, false>(nullptr, out, rstd, in, nullptr, nullptr, weight, eps, N, C, "rmsnorm_forward");
}

template <class O>
void residual_rmsnorm_forward(float* res_out, O* out, float* rstd, const float* res_in, const float* delta,
                              const float* delta_bias, const float* weight, float eps, int N, int C) {
  launch_rmsnorm<O, true>(res_out, out, rstd, res_in, delta, delta_bias, weight, eps, N, C,
                          "residual_rmsnorm_forward");
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int N, int C, DeviceBuffer& scratch) {
  if (N <= 0 || C <= 0) return;
  const int chunks = (C + 127) / 128;
  const bool vec = C % 4 == 0 && chunks <= kMaxBackwardChunks && vec4_aligned(din) && vec4_aligned(dout) &&
                   vec4_aligned(in) && vec4_aligned(weight);
  int blocks = grad_blocks(N);
  if (vec) {
    float* partial = grow(scratch, size_t(blocks) * size_t(C));
    const size_t smem = sizeof(float) * size_t(C);  // at most 16 KiB
    with_chunks<kMaxBackwardChunks>(chunks, [&](auto k) {
      rmsnorm_backward_kernel<decltype(k)::value>
          <<<blocks, kThreads, smem, stream()>>>(din, partial, dout, in, weight, rstd, N, C);
    });
  } else {
    // As many warps a block as their slices fit in 48 KiB, at least one (up to the opt-in limit).
    const size_t slice = sizeof(float) * size_t(C);
    if (slice > max_shared_memory())
      usage_fail("CUDA rmsnorm_backward: the row is too wide for shared memory");
    const int warps = int(std::clamp<size_t>(48 * 1024 / slice, 1, kWarps));
    blocks = int(std::min<int64_t>((int64_t(N) + warps - 1) / warps, kGradBlocks));
    float* partial = grow(scratch, size_t(blocks) * size_t(C));
    allow_smem(rmsnorm_backward_loop_kernel, slice * size_t(warps),
               "cudaFuncSetAttribute (rmsnorm_backward)");
    rmsnorm_backward_loop_kernel<<<blocks, 32 * warps, slice * size_t(warps), stream()>>>(
        din, partial, dout, in, weight, rstd, N, C);
  }
  check_launch("rmsnorm_backward");
  add_column_sums(dweight, scratch.as<float>(), blocks, C, C);
}

template <class T>
void head_rmsnorm_forward(T* qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                          float eps, int N, const AttentionShape& shape) {
  check_heads(shape, "head_rmsnorm_forward");
  const int hd = shape.head_dim, normed = shape.heads + shape.kv_heads;
  if (hd > kMaxHeadDim)
    usage_fail("CUDA head_rmsnorm_forward: head dim " + std::to_string(hd) + " is above " +
               std::to_string(kMaxHeadDim));
  const int64_t items = int64_t(N) * normed;
  if (items == 0) return;
  const int64_t stride = shape.qkv_width();
  const bool vec = hd % 4 == 0 && vec4_aligned(qkv) && vec4_aligned(saved) && vec4_aligned(q_weight) &&
                   vec4_aligned(k_weight);
  if (vec)
    head_rmsnorm_forward_kernel<T, 4><<<warp_blocks(items), kThreads, 0, stream()>>>(
        qkv, saved, rstd, q_weight, k_weight, eps, items, normed, shape.heads, hd, stride);
  else
    head_rmsnorm_forward_kernel<T, 1><<<warp_blocks(items), kThreads, 0, stream()>>>(
        qkv, saved, rstd, q_weight, k_weight, eps, items, normed, shape.heads, hd, stride);
  check_launch("head_rmsnorm_forward");
}

void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                           const float* rstd, const float* q_weight, const float* k_weight, int N,
                           const AttentionShape& shape, DeviceBuffer& scratch) {
  check_heads(shape, "head_rmsnorm_backward");
  const int hd = shape.head_dim, normed = shape.heads + shape.kv_heads;
  if (hd > kMaxHeadDim)
    usage_fail("CUDA head_rmsnorm_backward: head dim " + std::to_string(hd) + " is above " +
               std::to_string(kMaxHeadDim));
  const int64_t items = int64_t(N) * normed;
  if (items == 0) return;
  const int64_t stride = shape.qkv_width();
  const int blocks = grad_blocks(items);
  float* partial = grow(scratch, size_t(blocks) * 2 * size_t(hd));
  const bool vec = hd % 4 == 0 && vec4_aligned(dqkv) && vec4_aligned(saved) && vec4_aligned(q_weight) &&
                   vec4_aligned(k_weight);
  if (vec)
    head_rmsnorm_backward_kernel<4><<<blocks, kThreads, 0, stream()>>>(
        dqkv, partial, saved, rstd, q_weight, k_weight, items, normed, shape.heads, hd, stride);
  else
    head_rmsnorm_backward_kernel<1><<<blocks, kThreads, 0, stream()>>>(
        dqkv, partial, saved, rstd, q_weight, k_weight, items, normed, shape.heads, hd, stride);
  check_launch("head_rmsnorm_backward");
  add_column_sums(dq_weight, partial, blocks, hd, 2 * hd);
  if (shape.kv_heads > 0) add_column_sums(dk_weight, partial + hd, blocks, hd, 2 * hd);
}

template <class I, class O>
void swiglu_forward(O* out, const I* in, int N, int H) {
  const int64_t n = int64_t(N) * H;
  if (n == 0) return;
  if (H % 4 == 0 && vec4_aligned(out) && vec4_aligned(in))
    swiglu_forward_kernel<I, O, 4><<<blocks_for(n / 4), kThreads, 0, stream()>>>(out, in, H, n / 4);
  else
    swiglu_forward_kernel<I, O, 1><<<blocks_for(n), kThreads, 0, stream()>>>(out, in, H, n);
  check_launch("swiglu_forward");
}

template <class I>
void swiglu_backward(float* din, const float* dout, const I* in, int N, int H) {
  const int64_t n = int64_t(N) * H;
  if (n == 0) return;
  if (H % 4 == 0 && vec4_aligned(din) && vec4_aligned(dout) && vec4_aligned(in))
    swiglu_backward_kernel<I, 4><<<blocks_for(n / 4), kThreads, 0, stream()>>>(din, dout, in, H, n / 4);
  else
    swiglu_backward_kernel<I, 1><<<blocks_for(n), kThreads, 0, stream()>>>(din, dout, in, H, n);
  check_launch("swiglu_backward");
}

template <class T>
void rope(T* qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T_,
          const AttentionShape& shape, bool inverse) {
  check_heads(shape, "rope");
  const int hd = shape.head_dim, half = hd / 2, rotated = shape.heads + shape.kv_heads;
  const int64_t n = int64_t(N) * half;
  if (n == 0) return;
  const int64_t stride = shape.qkv_width();
  const float sign = inverse ? -1.0f : 1.0f;
  if (half % 4 == 0 && vec4_aligned(qkv) && vec4_aligned(inv_freq))
    rope_kernel<T, 4><<<blocks_for(n / 4), kThreads, 0, stream()>>>(qkv, positions, inv_freq, magnitude, sign,
                                                                    T_, rotated, hd, stride, n / 4);
  else
    rope_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream()>>>(qkv, positions, inv_freq, magnitude, sign, T_,
                                                                rotated, hd, stride, n);
  check_launch("rope");
}

#define FORGE_INSTANTIATE(T)                                                                              \
  template void rmsnorm_forward<T>(T*, float*, const float*, const float*, float, int, int);              \
  template void residual_rmsnorm_forward<T>(float*, T*, float*, const float*, const float*, const float*, \
                                            const float*, float, int, int);                               \
  template void head_rmsnorm_forward<T>(T*, float*, float*, const float*, const float*, float, int,       \
                                        const AttentionShape&);                                           \
  template void swiglu_forward<T, float>(float*, const T*, int, int);                                     \
  template void swiglu_forward<T, bf16>(bf16*, const T*, int, int);                                       \
  template void swiglu_backward<T>(float*, const float*, const T*, int, int);                             \
  template void rope<T>(T*, const int32_t*, const float*, float, int, int, const AttentionShape&, bool);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(bf16)
#undef FORGE_INSTANTIATE

}  // namespace forge::trainer::cuda::llama
