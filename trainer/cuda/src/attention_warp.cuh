// The warp steps the FP32 attention kernels share (attention.cu: one rank's attention; context_attention.cu:
// the context-parallel chunks): a warp holds a query row (forward) or a key row (dK, dV), a lane one key or
// query of a 32-row tile, and the head's columns lane + 32 dd.
#pragma once

#include "device_math.cuh"

#include <cmath>

namespace forge::trainer::cuda {

// One 32-key tile of the online softmax for the query row a warp holds: `s` is this lane's key's score, -inf
// where the row does not see it (`visible` false). The row's running maximum `m` and sum `l` take the tile
// in; its output `o` (this lane's columns) is rescaled and gains p V over the tile's 32 rows of `v` (row
// pitch `pitch`). A row that has seen nothing yet keeps
// m = -inf: its exponentials are taken from 0 instead, which keeps alpha 0, not the NaN of -inf - -inf.
template <int DPL>
__device__ __forceinline__ void online_softmax_tile(float s, bool visible, float& m, float& l,
                                                    float (&o)[DPL], const float* v, int pitch) {
  const float mnew = fmaxf(m, warp_max(s));
  const float from = mnew == -INFINITY ? 0.0f : mnew;
  const float p = visible ? expf(s - from) : 0.0f;
  const float alpha = expf(m - from);
  l = l * alpha + warp_sum(p);
  m = mnew;
#pragma unroll
  for (int dd = 0; dd < DPL; ++dd) o[dd] *= alpha;
  const int lane = threadIdx.x % 32;
  for (int j = 0; j < 32; ++j) {
    const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) o[dd] += pj * v[j * pitch + lane + dd * 32];
  }
}

// dV += P^T dO and dK += dS^T Q for the key row a warp holds, over a tile of 32 queries: this lane's query's
// probability `p` and dS `ds` (0 where it does not see the key), the tile's query rows `q` and their output
// gradients `go` (row pitch `pitch`).
template <int DPL>
__device__ __forceinline__ void accumulate_dkv(float p, float ds, float (&dv)[DPL], float (&dk)[DPL],
                                               const float* go, const float* q, int pitch) {
  const int lane = threadIdx.x % 32;
  for (int i = 0; i < 32; ++i) {
    const float pi = __shfl_sync(0xffffffffu, p, i), dsi = __shfl_sync(0xffffffffu, ds, i);
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      dv[dd] += pi * go[i * pitch + lane + dd * 32];
      dk[dd] += dsi * q[i * pitch + lane + dd * 32];
    }
  }
}

}  // namespace forge::trainer::cuda
