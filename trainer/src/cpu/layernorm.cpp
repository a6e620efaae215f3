// LayerNorm over the channel dimension (eps 1e-5, as PyTorch).
#include "kernels.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace forge::trainer::cpu {

namespace {
constexpr float kEps = 1e-5f;
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int N, int C) {
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
    const float rs = 1.0f / std::sqrt(v / C + kEps);
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  // dweight/dbias are sums over rows: each thread sums its rows privately, then the partial sums are
  // added in thread order (deterministic for a fixed thread count).
  const int nt = omp_get_max_threads();
  std::vector<float> partial(size_t(nt) * 2 * C, 0.0f);
#pragma omp parallel
  {
    float* pw = partial.data() + size_t(omp_get_thread_num()) * 2 * C;
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
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
  }
  for (int t = 0; t < nt; ++t) {
    const float* pw = partial.data() + size_t(t) * 2 * C;
    for (int c = 0; c < C; ++c) {
      dweight[c] += pw[c];
      dbias[c] += pw[C + c];
    }
  }
}

}  // namespace forge::trainer::cpu
