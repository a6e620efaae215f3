// exp and tanh written so that GCC vectorizes them inside `#pragma omp simd` loops (glibc's vector math
// is only declared under -ffast-math, so std::exp there stays one scalar call per element). Accuracy:
// exp within 4 ulp (inputs clamped to [-87, 88]); tanh within 2e-7 absolute (relative error grows
// near 0, harmless where it is used: GELU adds 1 to it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace forge::trainer::cpu {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // x = n ln2 + r, |r| <= ln2 / 2; exp(r) by a degree-6 polynomial; 2^n through the exponent bits.
  // Round to nearest by the 1.5 * 2^23 trick (exact for |x * log2 e| < 2^22; plain IEEE arithmetic).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(float, (int32_t(n) + 127) << 23);
}

// Softmax of x[0, n) in place (n >= 1); returns the log-sum-exp. The attention kernels' row step.
inline float softmax_in_place(float* x, int n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    x[j] = fast_exp(x[j] - mx);
    sum += x[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; ++j) x[j] *= inv;
  return mx + std::log(sum);
}

#pragma omp declare simd notinbranch
inline float fast_tanh(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1); |x| >= 9 is +-1 to float precision.
  x = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

}  // namespace forge::trainer::cpu
