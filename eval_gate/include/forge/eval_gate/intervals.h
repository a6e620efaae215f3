// Confidence intervals for the gate's task-suite scores: Wilson score intervals for a pass rate,
// Newcombe's interval for the difference of two rates, and percentile bootstrap intervals for means of
// per-task scores (pass@k with k > 1, paired comparisons of a candidate and its baseline on the same tasks).
// No dependency beyond the standard library; the bootstrap is reproducible bit for bit across standard
// libraries (its draws are specified below, not left to std:: distributions).
#pragma once

#include <cstdint>
#include <span>

namespace forge::gate {

struct Interval {
  double lo = 0, hi = 0;
};

// The standard normal quantile, Phi^-1(p): Acklam's rational approximation refined by one Halley step
// against std::erfc (relative error ~1e-15). p = 0 -> -inf, p = 1 -> +inf; throws std::invalid_argument
// for p outside [0, 1] or NaN.
double normal_quantile(double p);

// z of a two-sided interval at `confidence` (0.95 -> 1.959964): normal_quantile(0.5 + confidence / 2).
// Throws std::invalid_argument unless 0 < confidence < 1 (so do all functions below).
double two_sided_z(double confidence);

// Wilson's score interval for a proportion, successes out of n (no continuity correction); within [0, 1],
// lo exactly 0 when successes = 0 and hi exactly 1 when successes = n. n = 0 gives [0, 1]. Throws
// std::invalid_argument unless 0 <= successes <= n.
Interval wilson(double successes, double n, double confidence);

// The difference of two independent proportions, s1/n1 - s2/n2: Newcombe's hybrid score interval (1998,
// method 10) from the two Wilson intervals [l1, u1], [l2, u2]:
//   lo = d - sqrt((p1 - l1)^2 + (u2 - p2)^2),  hi = d + sqrt((u1 - p1)^2 + (p2 - l2)^2).
// Either n = 0 gives [-1, 1].
Interval newcombe_difference(double s1, double n1, double s2, double n2, double confidence);

// Percentile bootstrap interval of the mean of `x`: `resamples` (>= 1) resamples of x.size() values drawn
// with replacement; the bounds are the (1 - confidence)/2 and (1 + confidence)/2 quantiles of the resample
// means, each interpolated linearly between order statistics (h = (resamples - 1) q, the "type 7"
// quantile), and clamped to [min x, max x]. Draws: std::mt19937_64 seeded with `seed` (its output is fixed
// by the standard); an index below n from each 64-bit output u by Lemire's multiply-shift, floor(u n / 2^64),
// redrawing while (u n mod 2^64) < (2^64 mod n), so it is unbiased and the same everywhere. Resample r
// takes its n indices in order, resample 0 first.
// Empty x gives {NaN, NaN} (no data, no interval); a single value x0 gives [x0, x0].
Interval bootstrap_mean(std::span<const double> x, double confidence, int resamples, uint64_t seed);

// The mean of a - b over paired units (the same task under two models), resampled together: the
// bootstrap_mean of the differences a[i] - b[i], with the same draws. Identical a and b give exactly [0, 0].
// Throws std::invalid_argument when the sizes differ.
Interval bootstrap_paired_difference(std::span<const double> a, std::span<const double> b, double confidence,
                                     int resamples, uint64_t seed);

}  // namespace forge::gate
