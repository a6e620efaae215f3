#include "forge/eval_gate/intervals.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>
#include <vector>

namespace forge::gate {
namespace {

void check_confidence(double confidence) {
  if (!(confidence > 0 && confidence < 1))
    throw std::invalid_argument(fmt::format("confidence must be in (0, 1) (got {})", confidence));
}

// An index below n (n >= 1) from the generator: Lemire's multiply-shift with rejection.
uint64_t draw_index(std::mt19937_64& gen, uint64_t n) {
  __extension__ using u128 = unsigned __int128;
  u128 m = static_cast<u128>(gen()) * n;
  auto low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      m = static_cast<u128>(gen()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// The type-7 quantile of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const double h = (static_cast<double>(sorted.size()) - 1) * q;
  const auto below = static_cast<size_t>(std::floor(h));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (h - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

}  // namespace

double normal_quantile(double p) {
  if (!(p >= 0 && p <= 1))
    throw std::invalid_argument(fmt::format("normal_quantile: p must be in [0, 1] (got {})", p));
  if (p == 0) return -std::numeric_limits<double>::infinity();
  if (p == 1) return std::numeric_limits<double>::infinity();
  // Acklam's coefficients.
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double p_low = 0.02425, p_high = 1 - p_low;
  double x;
  if (p < p_low) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= p_high) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  // One Halley step on Phi(x) - p, Phi(x) = erfc(-x / sqrt 2) / 2. Above the median the error is taken
  // on the upper tail, 1 - Phi(x) = erfc(x / sqrt 2) / 2, so that p near 1 keeps its precision.
  const double sqrt2pi = std::sqrt(2 * std::numbers::pi);
  const double e = p <= 0.5 ? 0.5 * std::erfc(-x / std::numbers::sqrt2) - p
                            : (1 - p) - 0.5 * std::erfc(x / std::numbers::sqrt2);
  const double u = e * sqrt2pi * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

double two_sided_z(double confidence) {
  check_confidence(confidence);
  return normal_quantile(0.5 + confidence / 2);
}

Interval wilson(double successes, double n, double confidence) {
  const double z = two_sided_z(confidence);
  if (!(n >= 0 && successes >= 0 && successes <= n))
    throw std::invalid_argument(
        fmt::format("wilson: need 0 <= successes <= n (successes = {}, n = {})", successes, n));
  if (n == 0) return {0, 1};
  const double p = successes / n, z2 = z * z;
  const double denom = 1 + z2 / n;
  const double center = (p + z2 / (2 * n)) / denom;
  const double half = z / denom * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {successes == 0 ? 0.0 : std::max(0.0, center - half),
          successes == n ? 1.0 : std::min(1.0, center + half)};
}

Interval newcombe_difference(double s1, double n1, double s2, double n2, double confidence) {
  const Interval w1 = wilson(s1, n1, confidence), w2 = wilson(s2, n2, confidence);
  if (n1 == 0 || n2 == 0) return {-1, 1};
  const double p1 = s1 / n1, p2 = s2 / n2, d = p1 - p2;
  const double below = std::hypot(p1 - w1.lo, w2.hi - p2);
  const double above = std::hypot(w1.hi - p1, p2 - w2.lo);
  return {std::max(-1.0, d - below), std::min(1.0, d + above)};
}

Interval bootstrap_mean(std::span<const double> x, double confidence, int resamples, uint64_t seed) {
  check_confidence(confidence);
  if (resamples < 1)
    throw std::invalid_argument(fmt::format("bootstrap: resamples must be at least 1 (got {})", resamples));
  if (x.empty()) return {NAN, NAN};
  const uint64_t n = x.size();
  std::mt19937_64 gen(seed);
  std::vector<double> means(static_cast<size_t>(resamples));
  for (double& m : means) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) sum += x[draw_index(gen, n)];
    m = sum / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  const auto [min, max] = std::minmax_element(x.begin(), x.end());
  const double alpha = 1 - confidence;
  return {std::clamp(quantile(means, alpha / 2), *min, *max),
          std::clamp(quantile(means, 1 - alpha / 2), *min, *max)};
}

Interval bootstrap_paired_difference(std::span<const double> a, std::span<const double> b, double confidence,
                                     int resamples, uint64_t seed) {
  if (a.size() != b.size())
    throw std::invalid_argument(fmt::format(
        "bootstrap_paired_difference: {} values against {}; pairs need equal sizes", a.size(), b.size()));
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return bootstrap_mean(d, confidence, resamples, seed);
}

}  // namespace forge::gate
