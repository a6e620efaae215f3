// Causal attention in BF16 on tensor cores (WMMA 16x16x16, FP32 accumulation), FlashAttention-2's schedule:
// a block takes 64 queries (forward, dQ) or 64 keys (dK, dV), four warps of 16 rows each, and walks the
// 64-row tiles of the other side through shared memory. Scores go from the accumulators to a per-warp FP32
// tile, where each row's online softmax runs (two lanes per row); the probabilities (or dS) are rounded to
// BF16 and multiplied on tensor cores again. WMMA hides the accumulator layout, so the forward's running
// output lives in shared memory and is rescaled there; backward's accumulators stay in registers for the
// whole walk. dQ and dK/dV are separate kernels as in attention.cu: no atomics, deterministic. A dK/dV block
// takes one key/value head and walks the query tiles of its group's query heads in turn (grouped-query
// attention); a sliding window masks the keys before it and skips the tiles wholly outside it.
#include "attention_tc.h"
#include "attention_tile.cuh"
#include "forge/trainer/cuda/context.h"

#include <mma.h>

#include <cmath>
#include <cstdint>

namespace forge::trainer::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using namespace attention_tile;

constexpr int kWarps = 4;        // 16 rows each
constexpr int kSld = kRows + 4;  // FP32 pitch of a warp's 16 x 64 score tile (+4: fewer bank conflicts)
constexpr int kPld = kRows + 8;  // BF16 pitch of its probability tile
constexpr unsigned kFull = 0xffffffffu;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B^T of a row-major B
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// FP32 output tiles are [16][HD + 4]. Every shared-memory region starts on a 32-byte boundary, as WMMA's
// loads and stores require.
template <int HD>
struct Shape {
  static constexpr int ldo = HD + 4;  // FP32 output pitch
  // A warp's FP32 scratch: two score tiles, or its 16 x HD output.
  static constexpr int warp_f32 = 2 * 16 * kSld > 16 * ldo ? 2 * 16 * kSld : 16 * ldo;
};

// s[16][64] = a[16][HD] . b[64][HD]^T (a warp's rows against a whole tile), FP32.
template <int HD>
__device__ void scores(float* s, const bf16* a, const bf16* b) {
  FragA fa[HD / 16];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) wmma::load_matrix_sync(fa[k], a + k * 16, Tile<HD>::ld);
#pragma unroll
  for (int n = 0; n < kRows / 16; ++n) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int k = 0; k < HD / 16; ++k) {
      FragBt fb;
      wmma::load_matrix_sync(fb, b + n * 16 * Tile<HD>::ld + k * 16, Tile<HD>::ld);
      wmma::mma_sync(c, fa[k], fb, c);
    }
    wmma::store_matrix_sync(s + n * 16, c, kSld, wmma::mem_row_major);
  }
}

// acc[16][HD] += p[16][64] . x[64][HD].
template <int HD>
__device__ void accumulate(FragC (&acc)[HD / 16], const bf16* p, const bf16* x) {
#pragma unroll
  for (int k = 0; k < kRows / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kPld);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, x + k * 16 * Tile<HD>::ld + n * 16, Tile<HD>::ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 x HD accumulators as BF16 rows dst + i * stride (rows at or past `valid` skipped),
// through the warp's FP32 scratch `f`.
template <int HD>
__device__ void store_rows(bf16* dst, int64_t stride, int valid, FragC (&acc)[HD / 16], float* f) {
#pragma unroll
  for (int n = 0; n < HD / 16; ++n)
    wmma::store_matrix_sync(f + n * 16, acc[n], Shape<HD>::ldo, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * HD / 2; i += 32) {
    const int r = i / (HD / 2), c = (i % (HD / 2)) * 2;
    if (r < valid)
      *reinterpret_cast<__nv_bfloat162*>(dst + r * stride + c) =
          __floats2bfloat162_rn(f[r * Shape<HD>::ldo + c], f[r * Shape<HD>::ldo + c + 1]);
  }
  __syncwarp();
}

template <int HD>
constexpr size_t forward_smem() {
  return 3 * Tile<HD>::bytes + kWarps * (16 * kSld * 4 + 16 * kPld * 2 + 16 * Shape<HD>::ldo * 4);
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_wmma_kernel(bf16* out, float* lse, const bf16* qkv, int T_, HeadLayout L, float scale) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* q = reinterpret_cast<bf16*>(tc_smem);
  bf16* k = q + kRows * Tile<HD>::ld;
  bf16* v = k + kRows * Tile<HD>::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine =
      tc_smem + 3 * Tile<HD>::bytes + warp * (16 * kSld * 4 + 16 * kPld * 2 + 16 * Shape<HD>::ldo * 4);
  float* s = reinterpret_cast<float*>(mine);
  bf16* p = reinterpret_cast<bf16*>(mine + 16 * kSld * 4);
  float* o = reinterpret_cast<float*>(mine + 16 * kSld * 4 + 16 * kPld * 2);

  // The last query tiles see the most keys: they are scheduled first, so that the short ones fill the tail.
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const bf16* kb = rows + L.k_col + (h / L.group) * HD;  // the values: kb + (v_col - k_col)
  const int q0 = qt * kRows;
  // Lane pair (r, r + 16 lanes) shares row r of the warp's 16; each takes every other column.
  const int r = lane & 15, half = lane >> 4, tq = q0 + warp * 16 + r;
  load_tile<HD>(q, rows + h * HD, L.qkv_stride, q0, T_);
  for (int c = half; c < HD; c += 2) o[r * Shape<HD>::ldo + c] = 0;
  const float sl2 = scale * kLog2e;  // softmax in base 2: exp2 is one instruction
  float m = -INFINITY, l = 0;
  for (int kt = first_key_tile(q0, L.window, kRows); kt <= qt; ++kt) {
    __syncthreads();
    load_tile<HD>(k, kb, L.qkv_stride, kt * kRows, T_);
    load_tile<HD>(v, kb + (L.v_col - L.k_col), L.qkv_stride, kt * kRows, T_);
    __syncthreads();
    scores<HD>(s, q + warp * 16 * Tile<HD>::ld, k);
    __syncwarp();
    float mt = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < kRows / 2; ++j) {
      const int c = 2 * j + half, tk = kt * kRows + c;
      const float x = sees(tq, tk, L.span) && tk < T_ ? s[r * kSld + c] * sl2 : -INFINITY;
      s[r * kSld + c] = x;
      mt = fmaxf(mt, x);
    }
    // Without a window, key kt * 64 <= tq is visible in every tile this block walks and the maximum is
    // finite. A window can leave a row nothing in its first tiles: its maximum stays -inf, and exponentials
    // taken from 0 instead keep its alpha and probabilities 0 (not the NaN of -inf - -inf).
    const float mnew = fmaxf(m, fmaxf(mt, __shfl_xor_sync(kFull, mt, 16)));
    const float from = mnew == -INFINITY ? 0.0f : mnew;
    float sum = 0;
#pragma unroll 8
    for (int j = 0; j < kRows / 2; ++j) {
      const int c = 2 * j + half;
      const float pv = exp2f(s[r * kSld + c] - from);
      p[r * kPld + c] = __float2bfloat16_rn(pv);
      sum += pv;
    }
    sum += __shfl_xor_sync(kFull, sum, 16);
    const float alpha = exp2f(m - from);
    l = l * alpha + sum;
    m = mnew;
    for (int c = half; c < HD; c += 2) o[r * Shape<HD>::ldo + c] *= alpha;
    __syncwarp();
    FragC acc[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; ++n)
      wmma::load_matrix_sync(acc[n], o + n * 16, Shape<HD>::ldo, wmma::mem_row_major);
    accumulate<HD>(acc, p, v);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n)
      wmma::store_matrix_sync(o + n * 16, acc[n], Shape<HD>::ldo, wmma::mem_row_major);
    __syncwarp();
  }
  if (tq < T_) {
    bf16* orow = out + (int64_t(b) * T_ + tq) * L.out_stride + h * HD;
    const float inv = 1.0f / l;
    for (int c = half; c < HD; c += 2) orow[c] = __float2bfloat16_rn(o[r * Shape<HD>::ldo + c] * inv);
    if (half == 0) lse[int64_t(bh) * T_ + tq] = (m + log2f(l)) * kLn2;
  }
}

template <int HD>
constexpr size_t dq_smem() {
  return 4 * Tile<HD>::bytes + kWarps * (Shape<HD>::warp_f32 * 4 + 16 * kPld * 2);
}

// dQ for 64 queries: dQ = dS . K over the key tiles they see, dS = P * (dP - D) * scale, dP = dO . V^T.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dq_wmma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                             int T_, HeadLayout L, float scale) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* q = reinterpret_cast<bf16*>(tc_smem);
  bf16* go = q + kRows * Tile<HD>::ld;
  bf16* k = go + kRows * Tile<HD>::ld;
  bf16* v = k + kRows * Tile<HD>::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = tc_smem + 4 * Tile<HD>::bytes + warp * (Shape<HD>::warp_f32 * 4 + 16 * kPld * 2);
  float* s = reinterpret_cast<float*>(mine);
  float* dp = s + 16 * kSld;
  bf16* ds = reinterpret_cast<bf16*>(mine + Shape<HD>::warp_f32 * 4);

  // The last query tiles see the most keys: they are scheduled first, so that the short ones fill the tail.
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const bf16* kb = rows + L.k_col + (h / L.group) * HD;  // the values: kb + (v_col - k_col)
  const int q0 = qt * kRows, r = lane & 15, half = lane >> 4, tq = q0 + warp * 16 + r;
  load_tile<HD>(q, rows + h * HD, L.qkv_stride, q0, T_);
  load_tile<HD>(go, dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
  const float l2 = tq < T_ ? lse[int64_t(bh) * T_ + tq] * kLog2e : 0.0f;
  const float dd = tq < T_ ? D[int64_t(bh) * T_ + tq] : 0.0f;
  const float sl2 = scale * kLog2e;
  FragC acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int kt = first_key_tile(q0, L.window, kRows); kt <= qt; ++kt) {
    __syncthreads();
    load_tile<HD>(k, kb, L.qkv_stride, kt * kRows, T_);
    load_tile<HD>(v, kb + (L.v_col - L.k_col), L.qkv_stride, kt * kRows, T_);
    __syncthreads();
    scores<HD>(s, q + warp * 16 * Tile<HD>::ld, k);
    scores<HD>(dp, go + warp * 16 * Tile<HD>::ld, v);
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < kRows / 2; ++j) {
      const int c = 2 * j + half, tk = kt * kRows + c;
      float g = 0;
      if (sees(tq, tk, L.span) && tk < T_ && tq < T_) {
        const float pv = exp2f(s[r * kSld + c] * sl2 - l2);
        g = pv * (dp[r * kSld + c] - dd) * scale;
      }
      ds[r * kPld + c] = __float2bfloat16_rn(g);
    }
    __syncwarp();
    accumulate<HD>(acc, ds, k);
    __syncwarp();
  }
  const int row0 = q0 + warp * 16;
  store_rows<HD>(dqkv + (int64_t(b) * T_ + row0) * L.qkv_stride + h * HD, L.qkv_stride, T_ - row0, acc, s);
}

template <int HD>
constexpr size_t dkv_smem() {
  return 4 * Tile<HD>::bytes + 2 * kRows * 4 + kWarps * (Shape<HD>::warp_f32 * 4 + 2 * 16 * kPld * 2);
}

// dK and dV for 64 keys over the query tiles that see them: dV = P^T . dO, dK = dS^T . Q. A block takes one
// key/value head and walks the query tiles of each query head of its group, head after head.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dkv_wmma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                              int T_, HeadLayout L, float scale) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* k = reinterpret_cast<bf16*>(tc_smem);
  bf16* v = k + kRows * Tile<HD>::ld;
  bf16* q = v + kRows * Tile<HD>::ld;
  bf16* go = q + kRows * Tile<HD>::ld;
  float* stat_l2 = reinterpret_cast<float*>(tc_smem + 4 * Tile<HD>::bytes);  // lse * log2(e), per query
  float* stat_d = stat_l2 + kRows;                                           // D, per query
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine =
      tc_smem + 4 * Tile<HD>::bytes + 2 * kRows * 4 + warp * (Shape<HD>::warp_f32 * 4 + 2 * 16 * kPld * 2);
  float* s = reinterpret_cast<float*>(mine);  // S^T: [key][query]
  float* dp = s + 16 * kSld;                  // dP^T
  bf16* pt = reinterpret_cast<bf16*>(mine + Shape<HD>::warp_f32 * 4);
  bf16* dst = pt + 16 * kPld;

  // Grid (key tiles, kv_heads, B): the block's indices stay in special registers, which the compiler reads
  // again instead of keeping (this kernel is at the register limit).
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const int k0 = kt * kRows, r = lane & 15, half = lane >> 4, tk = k0 + warp * 16 + r;
  load_tile<HD>(k, rows + L.k_col + kvh * HD, L.qkv_stride, k0, T_);
  load_tile<HD>(v, rows + L.v_col + kvh * HD, L.qkv_stride, k0, T_);
  const float sl2 = scale * kLog2e;
  FragC dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
  // The walk: query tiles kt..last of query head kvh * group, then of the group's next head, ...
  const int last = last_query_tile(k0, L.window, kRows, (T_ + kRows - 1) / kRows);
#pragma unroll 1
  for (int h = kvh * L.group, qt = kt; h < (kvh + 1) * L.group; qt = qt < last ? qt + 1 : kt, h += qt == kt) {
    const int q0 = qt * kRows;
    const int64_t bh = int64_t(b) * L.heads + h;
    __syncthreads();
    load_tile<HD>(q, qkv + int64_t(b) * T_ * L.qkv_stride + h * HD, L.qkv_stride, q0, T_);
    load_tile<HD>(go, dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
    if (threadIdx.x < kRows) {
      const int t = q0 + threadIdx.x;
      stat_l2[threadIdx.x] = t < T_ ? lse[bh * T_ + t] * kLog2e : 0.0f;
      stat_d[threadIdx.x] = t < T_ ? D[bh * T_ + t] : 0.0f;
    }
    __syncthreads();
    scores<HD>(s, k + warp * 16 * Tile<HD>::ld, q);
    scores<HD>(dp, v + warp * 16 * Tile<HD>::ld, go);
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < kRows / 2; ++j) {
      const int c = 2 * j + half, tq = q0 + c;
      float pv = 0, g = 0;
      if (sees(tq, tk, L.span) && tq < T_ && tk < T_) {
        pv = exp2f(s[r * kSld + c] * sl2 - stat_l2[c]);
        g = pv * (dp[r * kSld + c] - stat_d[c]) * scale;
      }
      pt[r * kPld + c] = __float2bfloat16_rn(pv);
      dst[r * kPld + c] = __float2bfloat16_rn(g);
    }
    __syncwarp();
    accumulate<HD>(dv, pt, go);
    accumulate<HD>(dk, dst, q);
    __syncwarp();
  }
  const int row0 = k0 + warp * 16;
  bf16* at = dqkv + (int64_t(b) * T_ + row0) * L.qkv_stride;
  store_rows<HD>(at + L.k_col + kvh * HD, L.qkv_stride, T_ - row0, dk, s);
  store_rows<HD>(at + L.v_col + kvh * HD, L.qkv_stride, T_ - row0, dv, s);
}

}  // namespace

template <int HD>
void attention_forward_wmma(bf16* out, float* lse, const bf16* qkv, int B, int T_, const HeadLayout& L) {
  constexpr size_t smem = forward_smem<HD>();
  allow_smem(attention_forward_wmma_kernel<HD>, smem, "cudaFuncSetAttribute (attention_forward_wmma)");
  const dim3 grid((T_ + kRows - 1) / kRows, B * L.heads);
  attention_forward_wmma_kernel<HD>
      <<<grid, kWarps * 32, smem, stream()>>>(out, lse, qkv, T_, L, 1.0f / std::sqrt(float(HD)));
  check_launch("attention_forward_wmma");
}

template <int HD>
void attention_backward_wmma(bf16* dqkv, const float* D, const bf16* dout, const bf16* qkv, const float* lse,
                             int B, int T_, const HeadLayout& L) {
  const int tiles = (T_ + kRows - 1) / kRows;
  const float scale = 1.0f / std::sqrt(float(HD));
  allow_smem(attention_dq_wmma_kernel<HD>, dq_smem<HD>(), "cudaFuncSetAttribute (attention_dq_wmma)");
  attention_dq_wmma_kernel<HD><<<dim3(tiles, B * L.heads), kWarps * 32, dq_smem<HD>(), stream()>>>(
      dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward_wmma (dq)");
  allow_smem(attention_dkv_wmma_kernel<HD>, dkv_smem<HD>(), "cudaFuncSetAttribute (attention_dkv_wmma)");
  attention_dkv_wmma_kernel<HD><<<dim3(tiles, L.kv_heads, B), kWarps * 32, dkv_smem<HD>(), stream()>>>(
      dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward_wmma (dk, dv)");
}

#define FORGE_INSTANTIATE(HD)                                                                            \
  template void attention_forward_wmma<HD>(bf16*, float*, const bf16*, int, int, const HeadLayout&);     \
  template void attention_backward_wmma<HD>(bf16*, const float*, const bf16*, const bf16*, const float*, \
                                            int, int, const HeadLayout&);
FORGE_INSTANTIATE(32)
FORGE_INSTANTIATE(64)
FORGE_INSTANTIATE(128)
#undef FORGE_INSTANTIATE

}  // namespace forge::trainer::cuda
