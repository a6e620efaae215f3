// Moving token rows to and from the experts (Backend::gather_rows, combine_rows, row_dots): the permute
// and unpermute of an MoE layer fused into one gather or one weighted combine, parallel over output rows
// so that no two threads write one row (deterministic: each row sums its k terms in order).
#include "kernels.h"

namespace forge::trainer::cpu {

namespace {

float widen(float x) {
  return x;
}
using cpu::widen;  // BF16

template <class T>
void gather(float* out, const T* in, const int32_t* index, const float* scale, int rows, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const T* src = in + int64_t(index[i]) * C;
    float* dst = out + i * C;
    const float f = scale != nullptr ? scale[i] : 1.0f;
#pragma omp simd
    for (int c = 0; c < C; ++c) dst[c] = f * widen(src[c]);
  }
}

}  // namespace

void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C) {
  gather(out, in, index, scale, rows, C);
}

void gather_rows(float* out, const uint16_t* in, const int32_t* index, const float* scale, int rows, int C) {
  gather(out, in, index, scale, rows, C);
}

void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k, int C,
                  bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* dst = out + t * C;
    if (!accumulate)
#pragma omp simd
      for (int c = 0; c < C; ++c) dst[c] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = index[t * k + j];
      if (r < 0) continue;
      const float* src = in + int64_t(r) * C;
      const float f = weight != nullptr ? weight[t * k + j] : 1.0f;
#pragma omp simd
      for (int c = 0; c < C; ++c) dst[c] += f * src[c];
    }
  }
}

void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(N) * k; ++i) {
    const int32_t r = index[i];
    float s = 0.0f;
    if (r >= 0) {
      const float* x = a + (i / k) * C;
      const float* y = b + int64_t(r) * C;
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < C; ++c) s += x[c] * y[c];
    }
    dot[i] = s;
  }
}

}  // namespace forge::trainer::cpu
