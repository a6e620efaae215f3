// Causal attention on the fused qkv, FlashAttention-2's schedule on CUDA cores: tiles of 32 queries x 32
// keys in shared memory, one warp per query row (forward, dQ) or key row (dK, dV), a lane per key (or
// query) for the scores and a lane per head-dim slice for the outputs. The forward keeps only the row
// log-sum-exp; backward recomputes the probabilities from it. dQ and dK/dV are separate kernels (one over
// query tiles, one over key tiles), so no atomics and a deterministic result: with grouped-query attention
// a dK/dV block sums its key/value head's gradient over the group's query heads one after another. A sliding
// window masks the keys before it and skips the tiles wholly outside it. These kernels are the FP32 path;
// BF16 runs on tensor cores (attention_tc.h) unless FORGE_CUDA_ATTENTION=simt asks for these.
#include "attention_tc.h"
#include "attention_warp.cuh"
#include "device_math.cuh"
#include "forge/trainer/backend.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace forge::trainer::cuda {

namespace {

constexpr int kTile = 32;
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr unsigned kFull = 0xffffffffu;

// Loads rows [t0, t0 + 32) of one head's slice (columns `col`.. of the rows of `src`, row stride `stride`) as
// float into `dst` with row pitch `pitch`; rows past T are zero.
template <class T, int HD>
__device__ void load_tile(float* dst, int pitch, const T* src, int64_t stride, int t0, int T_) {
  for (int i = threadIdx.x; i < kTile * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD, t = t0 + r;
    dst[r * pitch + d] = t < T_ ? to_f(src[int64_t(t) * stride + d]) : 0.0f;
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_kernel(T* out, float* lse, const T* qkv, int T_, HeadLayout L, float scale) {
  extern __shared__ float sm[];
  float* q = sm;                    // [32][HD]
  float* k = q + kTile * HD;        // [32][HD + 1]: lane j reads row j
  float* v = k + kTile * (HD + 1);  // [32][HD]
  constexpr int DPL = HD / 32;
  const int qt = blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const T* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const T* kb = rows + L.k_col + (h / L.group) * HD;  // the values: kb + (v_col - k_col)
  const int q0 = qt * kTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<T, HD>(q, HD, rows + h * HD, L.qkv_stride, q0, T_);
  float o[kRowsPerWarp][DPL], mrow[kRowsPerWarp], lrow[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    mrow[rr] = -INFINITY;
    lrow[rr] = 0;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) o[rr][dd] = 0;
  }
  for (int kt = first_key_tile(q0, L.window, kTile); kt <= qt; ++kt) {
    __syncthreads();
    load_tile<T, HD>(k, HD + 1, kb, L.qkv_stride, kt * kTile, T_);
    load_tile<T, HD>(v, HD, kb + (L.v_col - L.k_col), L.qkv_stride, kt * kTile, T_);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, tq = q0 + r, tk = kt * kTile + lane;
      if (tq >= T_) continue;
      const bool visible = sees(tq, tk, L.span);
      float s = -INFINITY;
      if (visible) {
        float acc = 0;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) acc += q[r * HD + d] * k[lane * (HD + 1) + d];
        s = acc * scale;
      }
      // Without a window, key kt*32 <= q0 <= tq is always visible; a window can leave a row nothing in its
      // first tiles.
      online_softmax_tile(s, visible, mrow[rr], lrow[rr], o[rr], v, HD);
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int tq = q0 + warp * kRowsPerWarp + rr;
    if (tq >= T_) continue;
    T* orow = out + (int64_t(b) * T_ + tq) * L.out_stride + h * HD;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) orow[lane + dd * 32] = from_f<T>(o[rr][dd] / lrow[rr]);
    if (lane == 0) lse[int64_t(bh) * T_ + tq] = mrow[rr] + logf(lrow[rr]);
  }
}

// D[bh, t] = sum_d dout[t, d] * out[t, d] (one warp per row and query head).
template <class T>
__global__ void attention_delta_kernel(float* D, const T* dout, const T* out, int B, int T_, int heads,
                                       int64_t stride, int hd) {
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= int64_t(B) * heads * T_) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = w / T_;
  const int t = int(w % T_), b = int(bh / heads), h = int(bh % heads);
  const int64_t at = (int64_t(b) * T_ + t) * stride + h * hd;
  float s = 0;
  for (int d = lane; d < hd; d += 32) s += to_f(dout[at + d]) * to_f(out[at + d]);
  s = warp_sum(s);
  if (lane == 0) D[w] = s;
}

// dQ for one tile of 32 queries: loops over the key tiles it sees.
template <class T, int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                        HeadLayout L, float scale) {
  extern __shared__ float sm[];
  float* q = sm;                    // [32][HD]
  float* go = q + kTile * HD;       // [32][HD]
  float* k = go + kTile * HD;       // [32][HD + 1]
  float* v = k + kTile * (HD + 1);  // [32][HD + 1]
  constexpr int DPL = HD / 32;
  const int qt = blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const T* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const T* kb = rows + L.k_col + (h / L.group) * HD;  // the values: kb + (v_col - k_col)
  const int q0 = qt * kTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<T, HD>(q, HD, rows + h * HD, L.qkv_stride, q0, T_);
  load_tile<T, HD>(go, HD, dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
  float dq[kRowsPerWarp][DPL], l[kRowsPerWarp], dd_[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int tq = q0 + warp * kRowsPerWarp + rr;
    l[rr] = tq < T_ ? lse[int64_t(bh) * T_ + tq] : 0.0f;
    dd_[rr] = tq < T_ ? D[int64_t(bh) * T_ + tq] : 0.0f;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) dq[rr][dd] = 0;
  }
  for (int kt = first_key_tile(q0, L.window, kTile); kt <= qt; ++kt) {
    __syncthreads();
    load_tile<T, HD>(k, HD + 1, kb, L.qkv_stride, kt * kTile, T_);
    load_tile<T, HD>(v, HD + 1, kb + (L.v_col - L.k_col), L.qkv_stride, kt * kTile, T_);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, tq = q0 + r, tk = kt * kTile + lane;
      if (tq >= T_) continue;
      float ds = 0;
      if (sees(tq, tk, L.span)) {
        float s = 0, dp = 0;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) {
          s += q[r * HD + d] * k[lane * (HD + 1) + d];
          dp += go[r * HD + d] * v[lane * (HD + 1) + d];
        }
        const float p = expf(s * scale - l[rr]);
        ds = p * (dp - dd_[rr]) * scale;
      }
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(kFull, ds, j);
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd) dq[rr][dd] += dsj * k[j * (HD + 1) + lane + dd * 32];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int tq = q0 + warp * kRowsPerWarp + rr;
    if (tq >= T_) continue;
    T* row = dqkv + (int64_t(b) * T_ + tq) * L.qkv_stride + h * HD;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) row[lane + dd * 32] = from_f<T>(dq[rr][dd]);
  }
}

// dK and dV for one tile of 32 keys of one key/value head: loops over the query tiles that see it, of each
// query head of its group in turn.
template <class T, int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                         HeadLayout L, float scale) {
  extern __shared__ float sm[];
  float* k = sm;                         // [32][HD]
  float* v = k + kTile * HD;             // [32][HD]
  float* q = v + kTile * HD;             // [32][HD + 1]: lane i reads query row i
  float* go = q + kTile * (HD + 1);      // [32][HD + 1]
  float* stats = go + kTile * (HD + 1);  // lse[32], D[32]
  constexpr int DPL = HD / 32;
  const int kt = blockIdx.x, bkv = blockIdx.y, b = bkv / L.kv_heads, kvh = bkv % L.kv_heads;
  const T* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const int k0 = kt * kTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<T, HD>(k, HD, rows + L.k_col + kvh * HD, L.qkv_stride, k0, T_);
  load_tile<T, HD>(v, HD, rows + L.v_col + kvh * HD, L.qkv_stride, k0, T_);
  float dk[kRowsPerWarp][DPL], dv[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) dk[rr][dd] = dv[rr][dd] = 0;
  // Step `step`: query head kvh * group + step / n, query tile kt + step % n.
  const int tiles = (T_ + kTile - 1) / kTile, n = last_query_tile(k0, L.window, kTile, tiles) - kt + 1;
  for (int step = 0; step < L.group * n; ++step) {
    const int q0 = (kt + step % n) * kTile, h = kvh * L.group + step / n;
    const int64_t bh = int64_t(b) * L.heads + h;
    __syncthreads();
    load_tile<T, HD>(q, HD + 1, rows + h * HD, L.qkv_stride, q0, T_);
    load_tile<T, HD>(go, HD + 1, dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
    if (threadIdx.x < kTile) {
      const int t = q0 + threadIdx.x;
      stats[threadIdx.x] = t < T_ ? lse[bh * T_ + t] : 0.0f;
      stats[kTile + threadIdx.x] = t < T_ ? D[bh * T_ + t] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int j = warp * kRowsPerWarp + rr, tk = k0 + j, tq = q0 + lane;
      if (tk >= T_) continue;
      float p = 0, ds = 0;
      if (tq < T_ && sees(tq, tk, L.span)) {
        float s = 0, dp = 0;
#pragma unroll 16
        for (int d = 0; d < HD; ++d) {
          s += k[j * HD + d] * q[lane * (HD + 1) + d];
          dp += v[j * HD + d] * go[lane * (HD + 1) + d];
        }
        p = expf(s * scale - stats[lane]);
        ds = p * (dp - stats[kTile + lane]) * scale;
      }
      accumulate_dkv(p, ds, dv[rr], dk[rr], go, q, HD + 1);
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int tk = k0 + warp * kRowsPerWarp + rr;
    if (tk >= T_) continue;
    T* row = dqkv + (int64_t(b) * T_ + tk) * L.qkv_stride;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      row[L.k_col + kvh * HD + lane + dd * 32] = from_f<T>(dk[rr][dd]);
      row[L.v_col + kvh * HD + lane + dd * 32] = from_f<T>(dv[rr][dd]);
    }
  }
}

// The layout of `shape`'s heads, checked: head dims the kernels have, query heads in whole groups. A window
// that reaches back past the sequence's start cuts nothing: 0, so that the kernels walk every tile.
HeadLayout layout(const AttentionShape& shape, int T_) {
  const int hd = shape.head_dim;
  if (hd != 32 && hd != 64 && hd != 128)
    usage_fail("CUDA attention: head dim " + std::to_string(hd) + " is not supported; use 32, 64 or 128");
  if (shape.heads <= 0 || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0)
    usage_fail("CUDA attention: " + std::to_string(shape.heads) + " query heads do not divide into " +
               std::to_string(shape.kv_heads) + " key/value heads");
  HeadLayout L;
  L.heads = shape.heads, L.kv_heads = shape.kv_heads, L.group = shape.heads / shape.kv_heads;
  L.qkv_stride = shape.qkv_width();
  L.k_col = shape.q_width(), L.v_col = shape.q_width() + shape.kv_width();
  L.out_stride = shape.q_width();
  L.window = shape.window > 0 && shape.window < T_ ? shape.window : 0;
  if (L.window > 0) L.span = unsigned(L.window);
  return L;
}

// BF16 kernels: mma.sync where it takes the head dim, else WMMA, else these (also for tensors the
// tensor-core kernels' 16-byte loads cannot read); FORGE_CUDA_ATTENTION=wmma or =simt starts lower (read on
// every call, so that forge-cuda-check compares all three in one process).
enum class Bf16Kernels { kMma, kWmma, kSimt };
Bf16Kernels bf16_kernels(std::initializer_list<const void*> tensors) {
  for (const void* p : tensors)
    if (!aligned_to(p, 16)) return Bf16Kernels::kSimt;
  const char* env = std::getenv("FORGE_CUDA_ATTENTION");
  if (env != nullptr && std::strcmp(env, "simt") == 0) return Bf16Kernels::kSimt;
  if (env != nullptr && std::strcmp(env, "wmma") == 0) return Bf16Kernels::kWmma;
  return Bf16Kernels::kMma;
}

template <class T, int HD>
void forward_hd(T* out, float* lse, const T* qkv, int B, int T_, const HeadLayout& L) {
  if constexpr (std::is_same_v<T, bf16>) {
    const auto kernels = bf16_kernels({out, qkv});
    if constexpr (HD <= 64)
      if (kernels == Bf16Kernels::kMma) return attention_forward_mma<HD>(out, lse, qkv, B, T_, L);
    if (kernels != Bf16Kernels::kSimt) return attention_forward_wmma<HD>(out, lse, qkv, B, T_, L);
  }
  const size_t smem = sizeof(float) * kTile * (3 * HD + 1);
  allow_smem(attention_forward_kernel<T, HD>, smem, "cudaFuncSetAttribute (attention_forward)");
  const dim3 grid((T_ + kTile - 1) / kTile, B * L.heads);
  attention_forward_kernel<T, HD>
      <<<grid, kWarps * 32, smem, stream()>>>(out, lse, qkv, T_, L, 1.0f / std::sqrt(float(HD)));
  check_launch("attention_forward");
}

template <class T, int HD>
void backward_hd(T* dqkv, float* D, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                 int T_, const HeadLayout& L) {
  const int64_t rows = int64_t(B) * L.heads * T_;
  attention_delta_kernel<<<int((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream()>>>(
      D, dout, out, B, T_, L.heads, L.out_stride, HD);
  check_launch("attention_backward (delta)");
  if constexpr (std::is_same_v<T, bf16>) {
    const auto kernels = bf16_kernels({dqkv, dout, qkv});
    if constexpr (HD <= 64)
      if (kernels == Bf16Kernels::kMma) return attention_backward_mma<HD>(dqkv, D, dout, qkv, lse, B, T_, L);
    if (kernels != Bf16Kernels::kSimt) return attention_backward_wmma<HD>(dqkv, D, dout, qkv, lse, B, T_, L);
  }
  const int tiles = (T_ + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(float(HD));
  const size_t smem_dq = sizeof(float) * kTile * (4 * HD + 2);
  allow_smem(attention_dq_kernel<T, HD>, smem_dq, "cudaFuncSetAttribute (attention dq)");
  attention_dq_kernel<T, HD>
      <<<dim3(tiles, B * L.heads), kWarps * 32, smem_dq, stream()>>>(dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward (dq)");
  const size_t smem_dkv = sizeof(float) * (kTile * (4 * HD + 2) + 2 * kTile);
  allow_smem(attention_dkv_kernel<T, HD>, smem_dkv, "cudaFuncSetAttribute (attention dkv)");
  attention_dkv_kernel<T, HD><<<dim3(tiles, B * L.kv_heads), kWarps * 32, smem_dkv, stream()>>>(
      dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward (dk, dv)");
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, const AttentionShape& shape) {
  const HeadLayout L = layout(shape, T_);
  if (int64_t(B) * T_ == 0) return;
  switch (shape.head_dim) {
    case 32:
      return forward_hd<T, 32>(out, lse, qkv, B, T_, L);
    case 64:
      return forward_hd<T, 64>(out, lse, qkv, B, T_, L);
    default:
      return forward_hd<T, 128>(out, lse, qkv, B, T_, L);
  }
}

template <class T>
void attention_backward(T* dqkv, float* scratch, const T* dout, const T* qkv, const T* out, const float* lse,
                        int B, int T_, const AttentionShape& shape) {
  const HeadLayout L = layout(shape, T_);
  if (int64_t(B) * T_ == 0) return;
  switch (shape.head_dim) {
    case 32:
      return backward_hd<T, 32>(dqkv, scratch, dout, qkv, out, lse, B, T_, L);
    case 64:
      return backward_hd<T, 64>(dqkv, scratch, dout, qkv, out, lse, B, T_, L);
    default:
      return backward_hd<T, 128>(dqkv, scratch, dout, qkv, out, lse, B, T_, L);
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, const AttentionShape&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int, int, const AttentionShape&);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*,
                                        const float*, int, int, const AttentionShape&);
template void attention_backward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*,
                                       int, int, const AttentionShape&);

}  // namespace forge::trainer::cuda
