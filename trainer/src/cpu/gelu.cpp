// GELU, tanh approximation (GPT-2; PyTorch approximate='tanh'), fused with the preceding bias add.
#include "fast_math.h"
#include "kernels.h"

#include <cmath>

namespace forge::trainer::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void bias_gelu_forward(float* out, float* pre, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* p = pre + r * C;
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float x = p[c] + bias[c];
      p[c] = x;
      o[c] = 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
    }
  }
}

void gelu_backward(float* dinout, const float* pre, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* p = pre + r * C;
    float* d = dinout + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float x = p[c];
      const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
      const float th = fast_tanh(u);
      const float sech2 = 1.0f - th * th;
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
      d[c] *= 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
    }
  }
}

}  // namespace forge::trainer::cpu
