// The optimizer step's element-wise passes: the gradient norm's sum of squares, clipping, AdamW.
#include "kernels.h"
#include "ordered_sum.h"

#include <cmath>

namespace forge::trainer::cpu {

double sum_squares(const float* x, std::span<const FlatRange> ranges) {
  double sum = 0;
  for (const FlatRange& r : ranges) {
    const float* v = x + r.lo;
    sum += ordered_sum<1>(int64_t(r.hi - r.lo), [v](int64_t lo, int64_t hi, std::array<double, 1>& acc) {
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = lo; i < hi; ++i) s += double(v[i]) * double(v[i]);
      acc[0] = s;
    })[0];
  }
  return sum;
}

void scale(float* x, float factor, std::span<const FlatRange> ranges) {
  for (const FlatRange& r : ranges) {
    const int64_t lo = int64_t(r.lo), hi = int64_t(r.hi);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = lo; i < hi; ++i) x[i] *= factor;
  }
}

void adamw(float* w, const float* g, float* m, float* v, std::span<const AdamWSegment> segments,
           const AdamWStep& step) {
  const float b1 = step.beta1, b2 = step.beta2, eps = step.eps;
  const float step_size = step.step_size, inv_sqrt_bc2 = step.inv_sqrt_bc2;
  // One parallel region for all segments (each split statically), not a fork/join per tensor.
#pragma omp parallel
  for (const AdamWSegment& s : segments) {
    const float keep = s.decay ? step.keep : 1.0f;
    float* pw = w + s.lo;
    const float* pg = g + s.lo;
    float* pm = m + s.at;
    float* pv = v + s.at;
    const size_t n = s.hi - s.lo;
#pragma omp for simd schedule(static) nowait
    for (size_t i = 0; i < n; ++i) {
      pm[i] = b1 * pm[i] + (1.0f - b1) * pg[i];
      pv[i] = b2 * pv[i] + (1.0f - b2) * pg[i] * pg[i];
      const float denom = std::sqrt(pv[i]) * inv_sqrt_bc2 + eps;
      pw[i] = pw[i] * keep - step_size * pm[i] / denom;
    }
  }
}

}  // namespace forge::trainer::cpu
