// LayerNorm over the channel dimension.
#include "kernels.h"
#include "row_chunks.h"

#include <cmath>
#include <memory>

namespace forge::trainer::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = in + r * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float rs = 1.0f / std::sqrt(v / C + eps);
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* mean, const float* rstd, int N, int C) {
  // Per chunk, the weight's terms then the bias's (row_chunks.h).
  chunk_partials(partial, N, 2 * C, [&](float* pw, int64_t lo, int64_t hi) {
    float* pb = pw + C;
    for (int64_t r = lo; r < hi; ++r) {
      const float* x = in + r * C;
      const float* g = dout + r * C;
      const float m = mean[r], rs = rstd[r];
      // dnorm = g * weight; din = rs * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
      float sum_d = 0, sum_dn = 0;
#pragma omp simd reduction(+ : sum_d, sum_dn)
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * rs;
        const float d = g[c] * weight[c];
        sum_d += d;
        sum_dn += d * n;
        pw[c] += g[c] * n;
        pb[c] += g[c];
      }
      sum_d /= C;
      sum_dn /= C;
      float* dx = din + r * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * rs;
        dx[c] += rs * (g[c] * weight[c] - sum_d - n * sum_dn);
      }
    }
  });
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const auto partial = std::make_unique_for_overwrite<float[]>(size_t(row_chunks(N)) * 2 * size_t(C));
  layernorm_backward_partials(din, partial.get(), dout, in, weight, mean, rstd, N, C);
  add_chunk_sums(dweight, partial.get(), row_chunks(N), C, 2 * C);
  add_chunk_sums(dbias, partial.get() + C, row_chunks(N), C, 2 * C);
}

}  // namespace forge::trainer::cpu
