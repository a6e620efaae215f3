// The attention kernels' view of an AttentionShape (backend.h), shared by attention.cu and the BF16
// attention on tensor cores it dispatches to: attention_mma.cu (mma.sync, scores in registers) has head dims
// 32 and 64, attention_wmma.cu (WMMA, scores in shared memory) 32, 64 and 128. Same arguments and results
// as attention.cu's CUDA-core kernels; every tensor 16-byte aligned (attention.cu checks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace forge::trainer::cuda {

// Where a layer's heads lie in the fused rows, and what a query sees. Query head h reads key/value head
// h / group. Every column offset is a multiple of the head dim, so a row's heads start 16-byte aligned
// whenever the tensor does.
struct HeadLayout {
  int heads = 0, kv_heads = 0, group = 1;  // group = heads / kv_heads
  int64_t qkv_stride = 0;                  // elements per qkv (and dqkv) row: q | k | v
  int k_col = 0, v_col = 0;                // first column of the key heads, of the value heads
  int64_t out_stride = 0;                  // elements per out (and dout) row: the query heads
  int window = 0;                          // > 0: keys (t - window, t]; 0: all of the causal past
  unsigned span = 0x7fffffffu;             // window, or unbounded: see sees()
};

// The first key a query at `row` sees (may be negative: none cut off).
__device__ __forceinline__ int first_visible_key(int row, int window) {
  return window > 0 ? row - window + 1 : 0;
}
// Whether the query at `row` sees the key at `key`, causally and within the window: 0 <= row - key < span,
// one unsigned comparison, with span = HeadLayout::span (a kernel parameter, so no register holds it).
__device__ __forceinline__ bool sees(int row, int key, unsigned span) {
  return unsigned(row - key) < span;
}
// The tiles of `rows` rows a window leaves to walk: the first key tile the queries from q0 on see, and the
// last query tile that sees a key of the tile from k0 on (of `tiles`).
__device__ __forceinline__ int first_key_tile(int q0, int window, int rows) {
  return window > 0 && q0 - window + 1 > 0 ? (q0 - window + 1) / rows : 0;
}
__device__ __forceinline__ int last_query_tile(int k0, int window, int rows, int tiles) {
  return window > 0 ? min(tiles - 1, (k0 + rows - 1 + window - 1) / rows) : tiles - 1;
}

template <int HD>
void attention_forward_mma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_,
                           const HeadLayout& L);
template <int HD>
void attention_forward_wmma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_,
                            const HeadLayout& L);
// `D`: the per-row dot(dout, out), B * heads * T floats, already computed.
template <int HD>
void attention_backward_mma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                            const __nv_bfloat16* qkv, const float* lse, int B, int T_, const HeadLayout& L);
template <int HD>
void attention_backward_wmma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                             const __nv_bfloat16* qkv, const float* lse, int B, int T_, const HeadLayout& L);

}  // namespace forge::trainer::cuda
