// Sums over rows whose bits do not depend on how the rows are cut. The norms' weight gradients are sums
// over rows: they are taken in fixed chunks of kNormChunkRows rows, one float partial per chunk, and the
// partials added in chunk order in double. So the result depends neither on the number of threads (a
// per-thread partial would) nor on how consecutive chunks are shared out among processes: sequence
// parallelism gathers its ranks' partials and adds them as one process would.
#pragma once

#include "forge/trainer/backend.h"

#include <algorithm>
#include <cstdint>

namespace forge::trainer::cpu {

inline int64_t row_chunks(int64_t N) {
  return (N + kNormChunkRows - 1) / kNormChunkRows;
}

// partial [row_chunks(N), width]: rows(p, lo, hi) adds the terms of rows [lo, hi) into p (zeroed here).
template <class Rows>
void chunk_partials(float* partial, int64_t N, int width, Rows&& rows) {
  const int64_t chunks = row_chunks(N);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    float* p = partial + k * width;
    std::fill(p, p + width, 0.0f);
    rows(p, k * kNormChunkRows, std::min(N, (k + 1) * kNormChunkRows));
  }
}

// add(c, sum) receives each of the `width` columns' sums over the chunks' partials (row stride `stride`).
template <class Add>
void sum_chunks(const float* partial, int64_t chunks, int width, int stride, Add&& add) {
  constexpr int kColumnBlock = 16;
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < width; c0 += kColumnBlock) {
    const int n = std::min(kColumnBlock, width - c0);
    double acc[kColumnBlock] = {};
    for (int64_t k = 0; k < chunks; ++k) {
      const float* p = partial + k * stride + c0;
#pragma omp simd
      for (int c = 0; c < n; ++c) acc[c] += p[c];
    }
    for (int c = 0; c < n; ++c) add(c0 + c, acc[c]);
  }
}

}  // namespace forge::trainer::cpu
