// Causal attention in BF16 on tensor cores through mma.sync (m16n8k16, FP32 accumulation) for head dims 32
// and 64: FlashAttention-2's schedule with everything per row in registers. A block takes 64 queries
// (forward, dQ) or 64 keys (dK, dV), four warps of 16 rows; the other side's 64-row tiles pass through two
// shared-memory buffers (cp.async fills one while the block multiplies out of the other), read with
// ldmatrix. The m16n8k16 accumulator layout (lane = 4 * row + column pair, rows g and g +
// 8) is also the A-operand layout of the next product, so the probabilities (and dS) go from the score
// registers to the next mma.sync without shared memory; each row's softmax statistics are reduced over the
// four lanes that hold it. dQ and dK/dV are separate kernels, as in attention.cu: no atomics, deterministic.
// Grouped-query attention: a dK/dV block walks the query tiles of every query head of its key/value head's
// group in turn (fixed order), so the group's sum needs no atomics either. A sliding window masks the keys
// before it and skips the tiles wholly outside it.
//
// Register layout (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..)
//   B (16 x 8):  b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g)
//   C (16 x 8):  c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1)
#include "attention_tc.h"
#include "attention_tile.cuh"
#include "forge/trainer/cuda/context.h"

#include <cmath>
#include <cstdint>

namespace forge::trainer::cuda {

namespace {

using bf16 = __nv_bfloat16;
using namespace attention_tile;

constexpr int kWarps = 4;             // 16 rows each
constexpr int kKeyTiles = kRows / 8;  // n-tiles of 8 columns in a 64-wide score block

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 BF16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragment of rows [0, 16) x columns [16 kk, 16 kk + 16) of a row-major tile (pitch ld).
template <int HD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* rows, int kk) {
  const int lane = threadIdx.x % 32;
  ldsm_x4(a, rows + (lane % 16) * Tile<HD>::ld + kk * 16 + (lane / 16) * 8);
}

// s[16][64] = A[16][HD] . Bt[64][HD]^T: the warp's 16 rows (`rows`, a tile in shared memory) against the 64
// rows of `other`. s[j] holds columns 8j..8j+7 in the C layout.
template <int HD>
__device__ __forceinline__ void scores(float (&s)[kKeyTiles][4], const bf16* rows, const bf16* other) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    load_a<HD>(a, rows, kk);
#pragma unroll
    for (int j = 0; j < kKeyTiles; j += 2) {
      // Matrices: (rows 8j.., k 0-7), (8j.., k 8-15), (8j + 8.., k 0-7), (8j + 8.., k 8-15) = b0, b1 of
      // n-tiles j and j + 1.
      uint32_t b[4];
      ldsm_x4(b, other + ((j + m / 2) * 8 + lane % 8) * Tile<HD>::ld + kk * 16 + (m % 2) * 8);
      mma(s[j], a, b[0], b[1]);
      mma(s[j + 1], a, b[2], b[3]);
    }
  }
}

// acc[16][HD] += P[16][64] . X[64][HD]: P in registers in the C layout of scores(), X a row-major tile.
template <int HD>
__device__ __forceinline__ void accumulate(float (&acc)[HD / 8][4], const float (&p)[kKeyTiles][4],
                                           const bf16* x) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    const uint32_t a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                           pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < HD / 8; j += 2) {
      // Transposed matrices: (k 0-7, n 8j..), (k 8-15, n 8j..), (k 0-7, n 8j + 8..), (k 8-15, n 8j + 8..).
      uint32_t b[4];
      ldsm_x4_t(b, x + (kk * 16 + (m % 2) * 8 + lane % 8) * Tile<HD>::ld + (j + m / 2) * 8);
      mma(acc[j], a, b[0], b[1]);
      mma(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// Rows g and g + 8 of a warp's 16 x HD accumulators, as BF16, at dst + row * stride (rows >= valid skipped).
template <int HD>
__device__ __forceinline__ void store_rows(bf16* dst, int64_t stride, int valid,
                                           const float (&acc)[HD / 8][4], float scale0 = 1.0f,
                                           float scale1 = 1.0f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) {
    if (g < valid)
      *reinterpret_cast<__nv_bfloat162*>(dst + g * stride + 8 * j + 2 * t) =
          __floats2bfloat162_rn(acc[j][0] * scale0, acc[j][1] * scale0);
    if (g + 8 < valid)
      *reinterpret_cast<__nv_bfloat162*>(dst + (g + 8) * stride + 8 * j + 2 * t) =
          __floats2bfloat162_rn(acc[j][2] * scale1, acc[j][3] * scale1);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* qkv, int T_, HeadLayout L, float scale) {
  // Q, and two buffers of (K, V): the next tile's copy runs under this tile's products.
  __shared__ __align__(128) bf16 q[kRows * Tile<HD>::ld], kv[2][2][kRows * Tile<HD>::ld];
  // The last query tiles see the most keys: they are scheduled first, so that the short ones fill the tail.
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const bf16 *qb = rows + h * HD, *kb = rows + L.k_col + (h / L.group) * HD;  // values: kb + v_col - k_col
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = qt * kRows, row0 = q0 + warp * 16;  // this lane's rows: row0 + g, row0 + g + 8
  const auto fetch = [&](int kt) {
    load_tile_async<HD>(kv[kt % 2][0], kb, L.qkv_stride, kt * kRows, T_);
    load_tile_async<HD>(kv[kt % 2][1], kb + (L.v_col - L.k_col), L.qkv_stride, kt * kRows, T_);
    cp_async_commit();
  };
  const int kt0 = first_key_tile(q0, L.window, kRows);
  fetch(kt0);
  load_tile<HD>(q, qb, L.qkv_stride, q0, T_);
  const float sl2 = scale * kLog2e;  // softmax in base 2: exp2 is one instruction
  float o[HD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kt = kt0; kt <= qt; ++kt) {
    next_tile(kt < qt, [&] { fetch(kt + 1); });
    const bf16 *k = kv[kt % 2][0], *v = kv[kt % 2][1];
    float s[kKeyTiles][4];
    scores<HD>(s, q + warp * 16 * Tile<HD>::ld, k);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kRows + 8 * j + 2 * t + (e & 1), row = row0 + g + 8 * (e / 2);
        s[j][e] = sees(row, key, L.span) && key < T_ ? s[j][e] * sl2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
      }
    // Without a window, key kt * 64 <= every row of this block is visible and the maxima are finite. A
    // window can leave a row nothing in its first tiles: its maximum stays -inf, and exponentials taken
    // from 0 instead keep its alpha and probabilities 0 (not the NaN of -inf - -inf).
    float alpha[2], from[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mnew = fmaxf(m[i], quad_max(mx[i]));
      from[i] = mnew == -INFINITY ? 0.0f : mnew;
      alpha[i] = exp2f(m[i] - from[i]);
      m[i] = mnew;
      l[i] *= alpha[i];  // per-lane partial sums; the quad's are added at the end
    }
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - from[e / 2]);
        l[e / 2] += s[j][e];
      }
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    accumulate<HD>(o, s, v);
    __syncthreads();  // the buffer is refilled next
  }
  l[0] = quad_sum(l[0]), l[1] = quad_sum(l[1]);
  store_rows<HD>(out + (int64_t(b) * T_ + row0) * L.out_stride + h * HD, L.out_stride, T_ - row0, o,
                 1.0f / l[0], 1.0f / l[1]);
  if (t == 0) {
    if (row0 + g < T_) lse[int64_t(bh) * T_ + row0 + g] = (m[0] + log2f(l[0])) * kLn2;
    if (row0 + g + 8 < T_) lse[int64_t(bh) * T_ + row0 + g + 8] = (m[1] + log2f(l[1])) * kLn2;
  }
}

// dQ for 64 queries: dQ = dS . K over the key tiles they see; dS = P * (dP - D) * scale, dP = dO . V^T.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dq_mma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                            int T_, HeadLayout L, float scale) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16* q = reinterpret_cast<bf16*>(mma_smem);
  bf16* go = q + kRows * Tile<HD>::ld;
  bf16* kv = go + kRows * Tile<HD>::ld;  // two buffers of (K, V)
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / L.heads, h = bh % L.heads;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const bf16 *qb = rows + h * HD, *kb = rows + L.k_col + (h / L.group) * HD;  // values: kb + v_col - k_col
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = qt * kRows, row0 = q0 + warp * 16;
  const auto buffer = [&](int kt, int which) { return kv + (2 * (kt % 2) + which) * kRows * Tile<HD>::ld; };
  const auto fetch = [&](int kt) {
    load_tile_async<HD>(buffer(kt, 0), kb, L.qkv_stride, kt * kRows, T_);
    load_tile_async<HD>(buffer(kt, 1), kb + (L.v_col - L.k_col), L.qkv_stride, kt * kRows, T_);
    cp_async_commit();
  };
  const int kt0 = first_key_tile(q0, L.window, kRows);
  fetch(kt0);
  load_tile<HD>(q, qb, L.qkv_stride, q0, T_);
  load_tile<HD>(go, dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
  float l2[2], dd[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + g + 8 * i;
    l2[i] = row < T_ ? lse[int64_t(bh) * T_ + row] * kLog2e : 0.0f;
    dd[i] = row < T_ ? D[int64_t(bh) * T_ + row] : 0.0f;
  }
  const float sl2 = scale * kLog2e;
  float dq[HD / 8][4] = {};
  for (int kt = kt0; kt <= qt; ++kt) {
    next_tile(kt < qt, [&] { fetch(kt + 1); });
    const bf16 *k = buffer(kt, 0), *v = buffer(kt, 1);
    float s[kKeyTiles][4], dp[kKeyTiles][4];
    scores<HD>(s, q + warp * 16 * Tile<HD>::ld, k);
    scores<HD>(dp, go + warp * 16 * Tile<HD>::ld, v);
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kRows + 8 * j + 2 * t + (e & 1), row = row0 + g + 8 * (e / 2);
        const bool seen = sees(row, key, L.span) && key < T_ && row < T_;
        const float p = seen ? exp2f(s[j][e] * sl2 - l2[e / 2]) : 0.0f;
        s[j][e] = p * (dp[j][e] - dd[e / 2]) * scale;
      }
    accumulate<HD>(dq, s, k);
    __syncthreads();  // the buffer is refilled next
  }
  store_rows<HD>(dqkv + (int64_t(b) * T_ + row0) * L.qkv_stride + h * HD, L.qkv_stride, T_ - row0, dq);
}

// dK and dV for 64 keys over the query tiles that see them: dV = P^T . dO, dK = dS^T . Q. The warp's rows
// are keys here and the score columns queries. A block takes one key/value head and walks the query tiles
// of each query head of its group, head after head.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dkv_mma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                             int T_, HeadLayout L, float scale) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16* k = reinterpret_cast<bf16*>(mma_smem);
  bf16* v = k + kRows * Tile<HD>::ld;
  bf16* qg = v + kRows * Tile<HD>::ld;             // two buffers of (Q, dO)
  __shared__ float stat_l2[kRows], stat_d[kRows];  // lse * log2(e) and D of the tile's queries
  const int kt = blockIdx.x, bkv = blockIdx.y, b = bkv / L.kv_heads, kvh = bkv % L.kv_heads;
  const bf16* rows = qkv + int64_t(b) * T_ * L.qkv_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k0 = kt * kRows, row0 = k0 + warp * 16;
  // Step i of the walk: query head kvh * group + i / n, query tile kt + i % n.
  const int tiles = (T_ + kRows - 1) / kRows, n = last_query_tile(k0, L.window, kRows, tiles) - kt + 1;
  const auto head = [&](int i) { return kvh * L.group + i / n; };
  const auto buffer = [&](int i, int which) { return qg + (2 * (i % 2) + which) * kRows * Tile<HD>::ld; };
  const auto fetch = [&](int i) {
    const int h = head(i), q0 = (kt + i % n) * kRows;
    load_tile_async<HD>(buffer(i, 0), rows + h * HD, L.qkv_stride, q0, T_);
    load_tile_async<HD>(buffer(i, 1), dout + int64_t(b) * T_ * L.out_stride + h * HD, L.out_stride, q0, T_);
    cp_async_commit();
  };
  fetch(0);
  load_tile<HD>(k, rows + L.k_col + kvh * HD, L.qkv_stride, k0, T_);
  load_tile<HD>(v, rows + L.v_col + kvh * HD, L.qkv_stride, k0, T_);
  const float sl2 = scale * kLog2e;
  float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
  for (int i = 0; i < L.group * n; ++i) {
    const int q0 = (kt + i % n) * kRows;
    const int64_t bh = int64_t(b) * L.heads + head(i);
    if (threadIdx.x < kRows) {
      const int tq = q0 + threadIdx.x;
      stat_l2[threadIdx.x] = tq < T_ ? lse[bh * T_ + tq] * kLog2e : 0.0f;
      stat_d[threadIdx.x] = tq < T_ ? D[bh * T_ + tq] : 0.0f;
    }
    next_tile(i + 1 < L.group * n, [&] { fetch(i + 1); });
    const bf16 *q = buffer(i, 0), *go = buffer(i, 1);
    float s[kKeyTiles][4], dp[kKeyTiles][4];
    scores<HD>(s, k + warp * 16 * Tile<HD>::ld, q);    // S^T
    scores<HD>(dp, v + warp * 16 * Tile<HD>::ld, go);  // dP^T
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * j + 2 * t + (e & 1), query = q0 + c, key = row0 + g + 8 * (e / 2);
        const bool seen = sees(query, key, L.span) && query < T_ && key < T_;
        const float p = seen ? exp2f(s[j][e] * sl2 - stat_l2[c]) : 0.0f;
        s[j][e] = p;
        dp[j][e] = p * (dp[j][e] - stat_d[c]) * scale;
      }
    accumulate<HD>(dv, s, go);
    accumulate<HD>(dk, dp, q);
    __syncthreads();  // the buffers and the statistics are refilled next
  }
  bf16* at = dqkv + (int64_t(b) * T_ + row0) * L.qkv_stride;
  store_rows<HD>(at + L.k_col + kvh * HD, L.qkv_stride, T_ - row0, dk);
  store_rows<HD>(at + L.v_col + kvh * HD, L.qkv_stride, T_ - row0, dv);
}

}  // namespace

template <int HD>
void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int B, int T_, const HeadLayout& L) {
  const dim3 grid((T_ + kRows - 1) / kRows, B * L.heads);
  attention_forward_mma_kernel<HD>
      <<<grid, kWarps * 32, 0, stream()>>>(out, lse, qkv, T_, L, 1.0f / std::sqrt(float(HD)));
  check_launch("attention_forward_mma");
}

template <int HD>
void attention_backward_mma(bf16* dqkv, const float* D, const bf16* dout, const bf16* qkv, const float* lse,
                            int B, int T_, const HeadLayout& L) {
  const int tiles = (T_ + kRows - 1) / kRows;
  const float scale = 1.0f / std::sqrt(float(HD));
  // Six tiles each (above the 48 KiB a kernel gets without asking).
  constexpr int smem = 6 * Tile<HD>::bytes;
  allow_smem(attention_dq_mma_kernel<HD>, smem, "cudaFuncSetAttribute (attention_dq_mma)");
  attention_dq_mma_kernel<HD>
      <<<dim3(tiles, B * L.heads), kWarps * 32, smem, stream()>>>(dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward_mma (dq)");
  allow_smem(attention_dkv_mma_kernel<HD>, smem, "cudaFuncSetAttribute (attention_dkv_mma)");
  attention_dkv_mma_kernel<HD>
      <<<dim3(tiles, B * L.kv_heads), kWarps * 32, smem, stream()>>>(dqkv, dout, qkv, lse, D, T_, L, scale);
  check_launch("attention_backward_mma (dk, dv)");
}

#define FORGE_INSTANTIATE(HD)                                                                                \
  template void attention_forward_mma<HD>(bf16*, float*, const bf16*, int, int, const HeadLayout&);          \
  template void attention_backward_mma<HD>(bf16*, const float*, const bf16*, const bf16*, const float*, int, \
                                           int, const HeadLayout&);
FORGE_INSTANTIATE(32)
FORGE_INSTANTIATE(64)
#undef FORGE_INSTANTIATE

}  // namespace forge::trainer::cuda
