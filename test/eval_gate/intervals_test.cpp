// Confidence intervals of the task-suite scores, against published values (Newcombe 1998, Statistics in
// Medicine 17:857-872, Tables I and II), defining equations, and the sampling theory of the mean.
#include "forge/eval_gate/intervals.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <stdexcept>
#include <vector>

using namespace forge::gate;

namespace {

// n draws of N(mean, sd) by Box-Muller from the generator's raw output (no std:: distribution).
std::vector<double> normal_sample(size_t n, double mean, double sd, uint64_t seed) {
  std::mt19937_64 gen(seed);
  const auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };  // in (0, 1)
  std::vector<double> x(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2 * std::log(uniform())), t = 2 * std::numbers::pi * uniform();
    x[i] = mean + sd * r * std::cos(t);
    if (i + 1 < n) x[i + 1] = mean + sd * r * std::sin(t);
  }
  return x;
}

double sample_sd(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m += v;
  m /= static_cast<double>(x.size());
  double ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  return std::sqrt(ss / static_cast<double>(x.size() - 1));
}

}  // namespace

TEST_CASE("normal_quantile: known quantiles, symmetry, and the inverse of Phi") {
  CHECK(normal_quantile(0.975) == Approx(1.959963984540054).margin(1e-6));
  CHECK(normal_quantile(0.975) == Approx(1.959963984540054).epsilon(1e-12));
  CHECK(normal_quantile(0.5) == Approx(0).margin(1e-15));
  CHECK(normal_quantile(0.95) == Approx(1.6448536269514722).epsilon(1e-12));
  CHECK(normal_quantile(0.9) == Approx(1.2815515655446004).epsilon(1e-12));
  CHECK(normal_quantile(0.995) == Approx(2.5758293035489004).epsilon(1e-12));
  CHECK(normal_quantile(0.999) == Approx(3.090232306167813).epsilon(1e-12));
  CHECK(normal_quantile(0.8413447460685429) == Approx(1.0).epsilon(1e-12));  // Phi(1)
  CHECK(normal_quantile(1e-10) == Approx(-6.361340902404056).epsilon(1e-10));
  CHECK(two_sided_z(0.95) == Approx(1.959963984540054).epsilon(1e-12));
  CHECK(two_sided_z(0.99) == Approx(2.5758293035489004).epsilon(1e-12));

  // Phi(normal_quantile(p)) = p over the body and both tails, with Phi from std::erfc.
  for (double p : {1e-300, 1e-20, 1e-8, 1e-4, 0.01, 0.02425, 0.1, 0.3, 0.5, 0.7, 0.97575, 0.99, 0.9999}) {
    INFO("p=" << p);
    const double x = normal_quantile(p);
    CHECK(0.5 * std::erfc(-x / std::numbers::sqrt2) == Approx(p).epsilon(1e-12));
    if (p >= 1e-8) CHECK(normal_quantile(1 - p) == Approx(-x).epsilon(1e-9));  // 1 - p rounds off below
  }
  for (double p : {0.001, 0.2, 0.4, 0.45})
    CHECK(normal_quantile(p) == Approx(-normal_quantile(1 - p)).epsilon(1e-12));

  CHECK(std::isinf(normal_quantile(0)));
  CHECK(normal_quantile(0) < 0);
  CHECK(std::isinf(normal_quantile(1)));
  CHECK_THROWS_AS(normal_quantile(-0.1), std::invalid_argument);
  CHECK_THROWS_AS(normal_quantile(1.1), std::invalid_argument);
  CHECK_THROWS_AS(normal_quantile(NAN), std::invalid_argument);
  CHECK_THROWS_AS(two_sided_z(1), std::invalid_argument);
  CHECK_THROWS_AS(two_sided_z(0), std::invalid_argument);
}

TEST_CASE("wilson: Newcombe 1998 Table I, method 3") {
  struct Row {
    double s, n, lo, hi;
  };
  for (const Row& r : {Row{81, 263, 0.2553, 0.3662}, Row{15, 148, 0.0624, 0.1605}, Row{0, 20, 0, 0.1611},
                       Row{1, 29, 0.0061, 0.1718}}) {
    INFO(r.s << "/" << r.n);
    const Interval w = wilson(r.s, r.n, 0.95);
    CHECK(w.lo == Approx(r.lo).margin(1e-3));
    CHECK(w.hi == Approx(r.hi).margin(1e-3));
  }
}

TEST_CASE("wilson: the bounds solve the score equation and respect [0, 1]") {
  // At either bound p, (s/n - p)^2 = z^2 p (1 - p) / n.
  const double z = 1.959963984540054;
  for (double n : {1.0, 5.0, 29.0, 100.0, 1000.0}) {
    for (double s = 0; s <= n; s += std::max(1.0, std::floor(n / 7))) {
      INFO(s << "/" << n);
      const Interval w = wilson(s, n, 0.95);
      for (double p : {w.lo, w.hi}) {
        const double lhs = (s / n - p) * (s / n - p), rhs = z * z * p * (1 - p) / n;
        CHECK(lhs == Approx(rhs).margin(1e-12));
      }
      CHECK(w.lo <= s / n);
      CHECK(w.hi >= s / n);
    }
    CHECK(wilson(0, n, 0.95).lo == 0);
    CHECK(wilson(n, n, 0.95).hi == 1);
  }
  const Interval none = wilson(0, 0, 0.95);
  CHECK(none.lo == 0);
  CHECK(none.hi == 1);
  // Wider at higher confidence.
  CHECK(wilson(30, 100, 0.99).lo < wilson(30, 100, 0.95).lo);
  CHECK(wilson(30, 100, 0.99).hi > wilson(30, 100, 0.95).hi);
  CHECK_THROWS_AS(wilson(5, 4, 0.95), std::invalid_argument);
  CHECK_THROWS_AS(wilson(-1, 4, 0.95), std::invalid_argument);
  CHECK_THROWS_AS(wilson(1, 4, 1.5), std::invalid_argument);
}

TEST_CASE("newcombe_difference: Newcombe 1998 Table II, method 10") {
  struct Row {
    double s1, n1, s2, n2, lo, hi;
  };
  for (const Row& r : {Row{56, 70, 48, 80, 0.0524, 0.3339}, Row{9, 10, 3, 10, 0.1705, 0.8090},
                       Row{6, 7, 2, 7, 0.0582, 0.8062}, Row{5, 56, 0, 29, -0.0381, 0.1926},
                       // 0/10 - 0/20: by hand from the Wilson upper bounds of Table I (0.2775, 0.1611).
                       Row{0, 10, 0, 20, -0.1611, 0.2775}}) {
    INFO(r.s1 << "/" << r.n1 << " - " << r.s2 << "/" << r.n2);
    const Interval d = newcombe_difference(r.s1, r.n1, r.s2, r.n2, 0.95);
    CHECK(d.lo == Approx(r.lo).margin(1e-3));
    CHECK(d.hi == Approx(r.hi).margin(1e-3));
  }
  // Swapping the groups mirrors the interval.
  const Interval ab = newcombe_difference(56, 70, 48, 80, 0.95),
                 ba = newcombe_difference(48, 80, 56, 70, 0.95);
  CHECK(ba.lo == Approx(-ab.hi).epsilon(1e-12));
  CHECK(ba.hi == Approx(-ab.lo).epsilon(1e-12));
  const Interval none = newcombe_difference(3, 10, 0, 0, 0.95);
  CHECK(none.lo == -1);
  CHECK(none.hi == 1);
}

TEST_CASE("bootstrap_mean: reproducible, and the sampling theory of the mean") {
  const std::vector<double> x = normal_sample(4000, 5.0, 2.0, 20240601);

  const Interval a = bootstrap_mean(x, 0.95, 2000, 1), again = bootstrap_mean(x, 0.95, 2000, 1);
  CHECK(a.lo == again.lo);
  CHECK(a.hi == again.hi);
  const Interval other = bootstrap_mean(x, 0.95, 2000, 2);
  CHECK((other.lo != a.lo || other.hi != a.hi));
  const double width = a.hi - a.lo;
  CHECK(std::abs(other.lo - a.lo) < 0.1 * width);
  CHECK(std::abs(other.hi - a.hi) < 0.1 * width);

  // Width 2 z sd / sqrt(n), from the true sd and from the sample's.
  const double expected = 2 * 1.959964 * 2.0 / std::sqrt(4000.0);
  CHECK(width == Approx(expected).epsilon(0.10));
  CHECK(width == Approx(2 * 1.959964 * sample_sd(x) / std::sqrt(4000.0)).epsilon(0.10));
  // A 99.9% interval covers the true mean (and a 95% one the sample mean).
  const Interval wide = bootstrap_mean(x, 0.999, 2000, 3);
  CHECK(wide.lo < 5.0);
  CHECK(wide.hi > 5.0);
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  CHECK(a.lo < mean);
  CHECK(a.hi > mean);
  CHECK(wide.hi - wide.lo > width);
}

TEST_CASE("bootstrap_mean: a pass rate agrees with Wilson's interval") {
  // 300 successes in 1000: the bootstrap and the score interval both approximate p +- z sqrt(p(1-p)/n).
  std::vector<double> x(1000, 0.0);
  for (size_t i = 0; i < 300; ++i) x[i * 3] = 1.0;
  const Interval b = bootstrap_mean(x, 0.95, 4000, 9), w = wilson(300, 1000, 0.95);
  const double width = w.hi - w.lo;
  CHECK(std::abs(b.lo - w.lo) < 0.1 * width);
  CHECK(std::abs(b.hi - w.hi) < 0.1 * width);
}

TEST_CASE("bootstrap: edge cases") {
  const std::vector<double> empty;
  const Interval e = bootstrap_mean(empty, 0.95, 100, 1);
  CHECK(std::isnan(e.lo));
  CHECK(std::isnan(e.hi));
  const std::vector<double> one{0.1};
  const Interval o = bootstrap_mean(one, 0.95, 100, 1);
  CHECK(o.lo == 0.1);
  CHECK(o.hi == 0.1);
  const std::vector<double> same(7, 0.1);  // a mean of equal values stays within them
  const Interval s = bootstrap_mean(same, 0.95, 100, 1);
  CHECK(s.lo == 0.1);
  CHECK(s.hi == 0.1);
  const Interval single_resample = bootstrap_mean(normal_sample(50, 0, 1, 4), 0.95, 1, 1);
  CHECK(single_resample.lo == single_resample.hi);
  CHECK_THROWS_AS(bootstrap_mean(one, 0.95, 0, 1), std::invalid_argument);
  CHECK_THROWS_AS(bootstrap_mean(one, 1.0, 10, 1), std::invalid_argument);
  CHECK_THROWS_AS(bootstrap_paired_difference(one, same, 0.95, 10, 1), std::invalid_argument);
}

TEST_CASE("bootstrap_paired_difference: identical is exactly zero, a clear shift excludes zero") {
  const std::vector<double> a = normal_sample(500, 0.6, 0.3, 11);
  const Interval zero = bootstrap_paired_difference(a, a, 0.95, 1000, 5);
  CHECK(zero.lo == 0);
  CHECK(zero.hi == 0);

  // b = a - 0.05 + small per-unit noise: the shared spread cancels in the pairs.
  std::vector<double> b = normal_sample(500, -0.05, 0.02, 12);
  for (size_t i = 0; i < b.size(); ++i) b[i] += a[i];
  const Interval shift = bootstrap_paired_difference(a, b, 0.95, 1000, 5);
  CHECK(shift.lo > 0);
  CHECK(shift.lo < 0.05);
  CHECK(shift.hi > 0.05);
  // Resampled together, not apart: far narrower than the unpaired spread of a (sd 0.3) would allow.
  CHECK(shift.hi - shift.lo < 0.5 * 2 * 1.96 * 0.3 / std::sqrt(500.0));
  // The reverse comparison mirrors it (the same draws).
  const Interval reverse = bootstrap_paired_difference(b, a, 0.95, 1000, 5);
  CHECK(reverse.lo == Approx(-shift.hi).epsilon(1e-12));
  CHECK(reverse.hi == Approx(-shift.lo).epsilon(1e-12));
}
