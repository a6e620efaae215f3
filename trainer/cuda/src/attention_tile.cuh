// Shared by the tensor-core attention kernels (attention_wmma.cu, attention_mma.cu): 64-row BF16 tiles of one
// head's slice in shared memory, rows padded by 16 bytes so that consecutive rows start in different banks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace forge::trainer::cuda::attention_tile {

constexpr int kRows = 64;  // rows of a tile: queries or keys
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <int HD>
struct Tile {
  static constexpr int ld = HD + 8;  // pitch in elements; a multiple of 8, so every row is 16-byte aligned
  static constexpr int bytes = kRows * ld * 2;
};

// Rows [t0, t0 + 64) of one head's slice of `src` (row stride `stride`) into `dst`, 8 values per 16-byte
// load; rows past T are zero.
template <int HD>
__device__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t stride, int t0, int T_) {
  constexpr int kVec = HD / 8;
  for (int i = threadIdx.x; i < kRows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = (i % kVec) * 8, t = t0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (t < T_) v = *reinterpret_cast<const uint4*>(src + int64_t(t) * stride + c);
    *reinterpret_cast<uint4*>(dst + r * Tile<HD>::ld + c) = v;
  }
}

// The same through cp.async (16 bytes per copy, rows past T zero-filled by a zero source size): the copy runs
// while the block computes on the other buffer. Complete it with cp_async_commit() and cp_async_wait<N>().
template <int HD>
__device__ void load_tile_async(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t stride, int t0,
                                int T_) {
  constexpr int kVec = HD / 8;
  for (int i = threadIdx.x; i < kRows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = (i % kVec) * 8, t = t0 + r;
    const __nv_bfloat16* from = t < T_ ? src + int64_t(t) * stride + c : src;
    const auto to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * Tile<HD>::ld + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(t < T_ ? 16 : 0));
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The step of a double-buffered walk: starts the copy of the next tile when there is one, waits for the
// current one (started a step earlier) and makes it visible to the block.
template <class Fetch>
__device__ void next_tile(bool more, Fetch fetch_next) {
  if (more) {
    fetch_next();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

}  // namespace forge::trainer::cuda::attention_tile
