// Residual add fused with the LayerNorm that follows it: one pass over the row instead of three.
#include "kernels.h"

#include <cmath>

namespace forge::trainer::cpu {

void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd, const float* res_in,
                                const float* delta, const float* delta_bias, const float* weight,
                                const float* bias, float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* a = res_in + r * C;
    const float* d = delta + r * C;
    float* x = res_out + r * C;
    float s = 0;
    if (delta_bias != nullptr) {
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < C; ++c) {
        x[c] = a[c] + d[c] + delta_bias[c];
        s += x[c];
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < C; ++c) {
        x[c] = a[c] + d[c];
        s += x[c];
      }
    }
    const float m = s / C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float rs = 1.0f / std::sqrt(v / C + eps);
    float* o = ln_out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias, int N,
                      int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* a = res_in + r * C;
    const float* d = delta + r * C;
    float* x = res_out + r * C;
    if (delta_bias != nullptr) {
#pragma omp simd
      for (int c = 0; c < C; ++c) x[c] = a[c] + d[c] + delta_bias[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) x[c] = a[c] + d[c];
    }
  }
}

}  // namespace forge::trainer::cpu
