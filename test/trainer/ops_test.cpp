// The Llama-family ops (RMSNorm, per-head RMSNorm, SwiGLU, RoPE and its frequency tables) against plain
// double-precision references, at widths that are not multiples of the vector width; their gradients,
// what they accumulate or overwrite, and weight gradients that do not depend on the thread count.
#include "cpu/kernels.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/rope.h"
#include "support/numerics.h"

#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace k = forge::trainer::cpu;
using forge::trainer::AttentionShape;

using forge::test::max_rel;
using forge::test::randn;

namespace {

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  return forge::test::max_rel(a, std::vector<double>(b.begin(), b.end()));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Columns [lo, hi) of every row of a [rows, width] matrix, for checking what an op leaves alone.
template <class T>
std::vector<T> columns(const std::vector<T>& m, int width, int lo, int hi) {
  std::vector<T> out;
  for (size_t r = 0; r < m.size() / size_t(width); ++r)
    out.insert(out.end(), m.begin() + long(r * width + lo), m.begin() + long(r * width + hi));
  return out;
}

// RMSNorm of n values in double: y = x r w with r = 1 / sqrt(mean(x^2) + eps); given the output's
// gradient g, adds the input's to dx and the weight's to dw. Returns r.
double reference_rmsnorm(const float* x, const float* w, const float* g, double eps, int n, double* y,
                         double* dx, double* dw) {
  double ss = 0;
  for (int c = 0; c < n; ++c) ss += double(x[c]) * x[c];
  const double r = 1.0 / std::sqrt(ss / n + eps);
  double s = 0;
  for (int c = 0; c < n; ++c) {
    y[c] = x[c] * r * w[c];
    s += double(g[c]) * w[c] * x[c];
  }
  for (int c = 0; c < n; ++c) {
    dx[c] += r * g[c] * w[c] - x[c] * r * r * r * s / n;
    dw[c] += double(g[c]) * x[c] * r;
  }
  return r;
}

// RoPE of the q and k heads of qkv rows in double, at the angle the kernel forms (the float product of
// position and frequency): (x1, x2) -> m (x1 cos - x2 sin, x2 cos + x1 sin), sin negated when inverse.
std::vector<double> reference_rope(const std::vector<float>& qkv, const std::vector<int32_t>& positions,
                                   const std::vector<float>& inv_freq, double m, const AttentionShape& s,
                                   bool inverse) {
  const int W = s.qkv_width(), half = s.head_dim / 2;
  std::vector<double> out(qkv.begin(), qkv.end());
  for (size_t r = 0; r < positions.size(); ++r)
    for (int h = 0; h < s.heads + s.kv_heads; ++h) {
      double* x = out.data() + r * size_t(W) + size_t(h * s.head_dim);
      for (int i = 0; i < half; ++i) {
        const double angle = double(float(positions[r]) * inv_freq[size_t(i)]);
        const double c = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
        const double x1 = x[i], x2 = x[i + half];
        x[i] = m * (x1 * c - x2 * sn);
        x[i + half] = m * (x2 * c + x1 * sn);
      }
    }
  return out;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

}  // namespace

TEST_CASE("RMSNorm forward and backward match the double reference and accumulate", "[trainer][ops]") {
  const int N = 37;
  const float eps = 1e-6f;
  for (const int C : {43, 48}) {
    INFO("C = " << C);
    const auto in = randn(size_t(N) * C, 1, 2.0f), w = randn(size_t(C), 2), dout = randn(size_t(N) * C, 3);
    std::vector<float> out(in.size()), rstd(N), din(in.size(), 1.0f), dw(size_t(C), 0.5f);
    k::rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), eps, N, C);
    k::rmsnorm_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), rstd.data(), N, C);

    std::vector<double> ref_out(in.size()), ref_rstd(N), ref_din(in.size(), 1.0), ref_dw(size_t(C), 0.5);
    for (int r = 0; r < N; ++r) {
      const size_t o = size_t(r) * C;
      ref_rstd[size_t(r)] = reference_rmsnorm(in.data() + o, w.data(), dout.data() + o, eps, C,
                                              ref_out.data() + o, ref_din.data() + o, ref_dw.data());
    }
    CHECK(max_rel(out, ref_out) < 1e-6);
    CHECK(max_rel(rstd, ref_rstd) < 1e-6);
    CHECK(max_rel(din, ref_din) < 1e-6);
    CHECK(max_rel(dw, ref_dw) < 1e-6);
  }
}

TEST_CASE("residual RMSNorm adds the residual, with and without a bias, then normalizes", "[trainer][ops]") {
  const int N = 37, C = 43;
  const float eps = 1e-5f;
  const auto a = randn(size_t(N) * C, 4), d = randn(size_t(N) * C, 5), bias = randn(size_t(C), 6),
             w = randn(size_t(C), 7);
  for (const bool with_bias : {true, false}) {
    INFO((with_bias ? "bias" : "no bias"));
    std::vector<float> res(a.size()), out(a.size()), rstd(N), sum(a.size());
    k::residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(), d.data(),
                                with_bias ? bias.data() : nullptr, w.data(), eps, N, C);
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] = with_bias ? a[i] + d[i] + bias[i % size_t(C)] : a[i] + d[i];
    CHECK(same_bits(res, sum));

    // A zero output gradient: the reference's gradients are not looked at.
    std::vector<double> ref_out(a.size()), ref_rstd(N), ignored(2 * size_t(C));
    const std::vector<float> zero(size_t(C), 0.0f);
    for (int r = 0; r < N; ++r) {
      const size_t o = size_t(r) * C;
      ref_rstd[size_t(r)] = reference_rmsnorm(sum.data() + o, w.data(), zero.data(), eps, C,
                                              ref_out.data() + o, ignored.data(), ignored.data() + C);
    }
    CHECK(max_rel(out, ref_out) < 1e-6);
    CHECK(max_rel(rstd, ref_rstd) < 1e-6);
  }
}

TEST_CASE("per-head RMSNorm normalizes the q and k heads in place and leaves v alone", "[trainer][ops]") {
  const int N = 37;
  const float eps = 1e-6f;
  for (const int hd : {8, 12, 16})
    for (const int kv : {2, 1}) {
      const AttentionShape s{.heads = 4, .kv_heads = kv, .head_dim = hd};
      const int W = s.qkv_width(), qk = s.q_width() + s.kv_width(), nh = s.heads + s.kv_heads;
      INFO("head_dim " << hd << ", kv_heads " << kv);
      const auto qkv0 = randn(size_t(N) * W, 8, 3.0f), wq = randn(size_t(hd), 9), wk = randn(size_t(hd), 10),
                 g0 = randn(size_t(N) * W, 11);
      std::vector<float> qkv = qkv0, saved(size_t(N) * qk), rstd(size_t(N) * nh);
      k::head_rmsnorm_forward(qkv.data(), saved.data(), rstd.data(), wq.data(), wk.data(), eps, N, s);
      std::vector<float> g = g0, dwq(size_t(hd), 0.5f), dwk(size_t(hd), -0.25f);
      k::head_rmsnorm_backward(g.data(), dwq.data(), dwk.data(), saved.data(), rstd.data(), wq.data(),
                               wk.data(), N, s);

      std::vector<double> ref(qkv0.begin(), qkv0.end()), ref_rstd(rstd.size()), ref_g(size_t(N) * W),
          ref_dwq(size_t(hd), 0.5), ref_dwk(size_t(hd), -0.25);
      for (int r = 0; r < N; ++r)
        for (int h = 0; h < nh; ++h) {
          const size_t o = size_t(r) * W + size_t(h * hd);
          const bool query = h < s.heads;
          ref_rstd[size_t(r * nh + h)] =
              reference_rmsnorm(qkv0.data() + o, query ? wq.data() : wk.data(), g0.data() + o, eps, hd,
                                ref.data() + o, ref_g.data() + o, query ? ref_dwq.data() : ref_dwk.data());
        }
      const auto qk_part = [&](const auto& m) { return columns(m, W, 0, qk); };
      CHECK(max_rel(qk_part(qkv), qk_part(ref)) < 1e-6);
      CHECK(same_bits(columns(qkv, W, qk, W), columns(qkv0, W, qk, W)));
      CHECK(same_bits(saved, columns(qkv0, W, 0, qk)));
      CHECK(max_rel(rstd, ref_rstd) < 1e-6);
      // The gradient replaces the q and k columns' (it is not added to them) and leaves v's.
      CHECK(max_rel(qk_part(g), qk_part(ref_g)) < 1e-6);
      CHECK(same_bits(columns(g, W, qk, W), columns(g0, W, qk, W)));
      CHECK(max_rel(dwq, ref_dwq) < 1e-6);
      CHECK(max_rel(dwk, ref_dwk) < 1e-6);
    }
}

TEST_CASE("RMSNorm weight gradients are the same bits on any number of threads", "[trainer][ops]") {
  const int threads = omp_get_max_threads();
  const int N = 300, C = 45;  // several 32-row chunks, the last one short
  const AttentionShape s{.heads = 4, .kv_heads = 2, .head_dim = 16};
  const int W = s.qkv_width();
  const auto in = randn(size_t(N) * C, 12), w = randn(size_t(C), 13), dout = randn(size_t(N) * C, 14),
             qkv0 = randn(size_t(N) * W, 15), wq = randn(16, 16), wk = randn(16, 17),
             g0 = randn(size_t(N) * W, 18);
  std::vector<float> out(in.size()), rstd(N);
  k::rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), 1e-6f, N, C);
  std::vector<float> qkv = qkv0, saved(size_t(N) * (s.q_width() + s.kv_width())), head_rstd(size_t(N) * 6);
  k::head_rmsnorm_forward(qkv.data(), saved.data(), head_rstd.data(), wq.data(), wk.data(), 1e-6f, N, s);

  std::vector<float> din1, dw1, g1, dwq1, dwk1;
  for (const int t : {1, 2, 3, 8}) {
    INFO(t << " threads");
    omp_set_num_threads(t);
    std::vector<float> din(in.size(), 0.0f), dw(size_t(C), 0.5f), g = g0, dwq(16, 0.5f), dwk(16, 0.5f);
    k::rmsnorm_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), rstd.data(), N, C);
    k::head_rmsnorm_backward(g.data(), dwq.data(), dwk.data(), saved.data(), head_rstd.data(), wq.data(),
                             wk.data(), N, s);
    if (t == 1) {
      din1 = din, dw1 = dw, g1 = g, dwq1 = dwq, dwk1 = dwk;
      continue;
    }
    CHECK(same_bits(din, din1));
    CHECK(same_bits(dw, dw1));
    CHECK(same_bits(g, g1));
    CHECK(same_bits(dwq, dwq1));
    CHECK(same_bits(dwk, dwk1));
  }
  omp_set_num_threads(threads);
}

TEST_CASE("SwiGLU forward and backward match the double reference; backward overwrites", "[trainer][ops]") {
  const int N = 37;
  for (const int H : {40, 43}) {
    INFO("H = " << H);
    const auto in = randn(size_t(N) * 2 * H, 19, 3.0f), dout = randn(size_t(N) * H, 20);
    std::vector<float> out(size_t(N) * H), din(in.size(), 123.0f);
    k::swiglu_forward(out.data(), in.data(), N, H);
    k::swiglu_backward(din.data(), dout.data(), in.data(), N, H);
    std::vector<double> ref_out(out.size()), ref_din(din.size());
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < H; ++c) {
        const double g = in[size_t(r) * 2 * H + c], u = in[size_t(r) * 2 * H + H + c],
                     d = dout[size_t(r) * H + c];
        const double sig = 1.0 / (1.0 + std::exp(-g));
        ref_out[size_t(r) * H + c] = g * sig * u;
        ref_din[size_t(r) * 2 * H + c] = d * u * sig * (1 + g * (1 - sig));
        ref_din[size_t(r) * 2 * H + H + c] = d * g * sig;
      }
    CHECK(max_rel(out, ref_out) < 1e-6);
    CHECK(max_rel(din, ref_din) < 1e-6);
  }
}

// fast_exp inside silu: each value, not only the largest, within 1e-6 of exact (down to where silu
// underflows towards the float minimum).
TEST_CASE("SwiGLU is within 1e-6 relative of exact on every value", "[trainer][ops]") {
  const int H = 4001;
  std::vector<float> in(2 * size_t(H), 1.0f), out(static_cast<size_t>(H));
  for (int c = 0; c < H; ++c) in[size_t(c)] = -60.0f + 80.0f * float(c) / float(H - 1);  // gates; up = 1
  k::swiglu_forward(out.data(), in.data(), 1, H);
  double worst = 0;
  for (int c = 0; c < H; ++c) {
    const double g = in[size_t(c)], exact = g / (1 + std::exp(-g));
    if (exact != 0) worst = std::max(worst, std::abs(out[size_t(c)] - exact) / std::abs(exact));
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("RoPE turns the q and k heads by position, leaves v, and its inverse is its transpose",
          "[trainer][ops]") {
  const int B = 2, T = 19, N = B * T;
  const float m = 1.25f;
  for (const int hd : {8, 16})
    for (const int kv : {2, 1}) {
      const AttentionShape s{.heads = 4, .kv_heads = kv, .head_dim = hd};
      const int W = s.qkv_width(), qk = s.q_width() + s.kv_width();
      INFO("head_dim " << hd << ", kv_heads " << kv);
      const auto inv_freq = forge::trainer::rope_table({}, hd).inv_freq;
      const auto x = randn(size_t(N) * W, 21), y = randn(size_t(N) * W, 22);
      std::vector<int32_t> by_row(N);
      for (int r = 0; r < N; ++r) by_row[size_t(r)] = r % T;

      for (const bool inverse : {false, true}) {
        INFO((inverse ? "inverse" : "forward"));
        std::vector<float> a = x;
        k::rope(a.data(), nullptr, inv_freq.data(), m, N, T, s, inverse);
        CHECK(max_rel(a, reference_rope(x, by_row, inv_freq, m, s, inverse)) < 1e-6);
        CHECK(same_bits(columns(a, W, qk, W), columns(x, W, qk, W)));
        // Explicit positions equal to r % T are the null positions.
        std::vector<float> b = x;
        k::rope(b.data(), by_row.data(), inv_freq.data(), m, N, T, s, inverse);
        CHECK(same_bits(a, b));
      }

      // The backward (inverse) is the adjoint of the forward: <R x, y> = <x, R^T y>, magnitude included.
      std::vector<float> rx = x, ry = y;
      k::rope(rx.data(), nullptr, inv_freq.data(), m, N, T, s, false);
      k::rope(ry.data(), nullptr, inv_freq.data(), m, N, T, s, true);
      CHECK(std::abs(dot(rx, y) - dot(x, ry)) < 1e-6 * std::sqrt(dot(rx, rx) * dot(y, y)));
      // The inverse with magnitude 1 / m undoes the forward.
      k::rope(rx.data(), nullptr, inv_freq.data(), 1.0f / m, N, T, s, true);
      CHECK(max_rel(rx, x) < 1e-6);
      // The magnitude scales the rotated values (v is not rotated).
      std::vector<float> unit = x, scaled = x;
      k::rope(unit.data(), nullptr, inv_freq.data(), 1.0f, N, T, s, false);
      k::rope(scaled.data(), nullptr, inv_freq.data(), m, N, T, s, false);
      for (auto& v : unit) v *= m;
      CHECK(max_rel(columns(scaled, W, 0, qk), columns(unit, W, 0, qk)) < 1e-6);
    }
}

TEST_CASE("RoPE follows position ids: packed documents restart at 0, long contexts", "[trainer][ops]") {
  const int N = 38;
  const AttentionShape s{.heads = 4, .kv_heads = 2, .head_dim = 16};
  const int W = s.qkv_width();
  const auto inv_freq = forge::trainer::rope_table({.theta = 500000}, 16).inv_freq;
  const auto x = randn(size_t(N) * W, 23);
  const int starts[] = {0, 10, 25, N};  // documents of 10, 15 and 13 rows
  std::vector<int32_t> packed(N), distant(N);
  for (int d = 0; d < 3; ++d)
    for (int r = starts[d]; r < starts[d + 1]; ++r) packed[size_t(r)] = r - starts[d];
  for (int r = 0; r < N; ++r) distant[size_t(r)] = 4000 + 37 * r;
  for (const auto& positions : {packed, distant}) {
    std::vector<float> a = x;
    k::rope(a.data(), positions.data(), inv_freq.data(), 1.0f, N, N, s, false);
    CHECK(max_rel(a, reference_rope(x, positions, inv_freq, 1.0, s, false)) < 1e-6);
  }
  // Each packed document turns exactly as it would alone at the start of a sequence.
  std::vector<float> a = x;
  k::rope(a.data(), packed.data(), inv_freq.data(), 1.0f, N, N, s, false);
  for (int d = 0; d < 3; ++d) {
    const auto rows = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + long(starts[d]) * W, v.begin() + long(starts[d + 1]) * W);
    };
    std::vector<float> alone = rows(x);
    const int len = starts[d + 1] - starts[d];
    k::rope(alone.data(), nullptr, inv_freq.data(), 1.0f, len, len, s, false);
    CHECK(same_bits(rows(a), alone));
  }
}

// Pinned values: Hugging Face's modeling_rope_utils formulas (_compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters, _compute_yarn_parameters without
// `truncate`) transcribed into numpy (Debian's python3-numpy 1.24; PyTorch was not installed) and evaluated
// in float64; the float32 evaluation HF itself does differs from these by at most 2.7e-7 relative (llama3's
// blended band), 6.4e-8 elsewhere.
TEST_CASE("RoPE frequency tables match Hugging Face's for each scaling", "[trainer][ops]") {
  namespace t = forge::trainer;
  const auto check = [](const t::RopeTable& table, const std::vector<double>& expected, double magnitude) {
    REQUIRE(table.inv_freq.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("i = " << i);
      CHECK(table.inv_freq[i] == Approx(expected[i]).epsilon(1e-7));
    }
    CHECK(table.magnitude == Approx(magnitude).epsilon(1e-7));
  };
  const std::vector<double> plain = {1,    0.31622776601683794,   0.1,   0.031622776601683791,
                                     0.01, 0.0031622776601683798, 0.001, 0.00031622776601683794};
  check(t::rope_table({.theta = 10000}, 16), plain, 1);
  check(t::rope_table({.theta = 10000, .scaling = t::RopeScaling::kLinear, .factor = 4}, 16),
        {0.25, 0.079056941504209485, 0.025, 0.0079056941504209478, 0.0025, 0.00079056941504209496, 0.00025,
         7.9056941504209485e-05},
        1);
  // Wavelengths 6.3, 32, 167, 862, 4443, 22911, ...: kept below 2048, / 8 above 8192, blended at 4443.
  check(t::rope_table({.theta = 500000,
                       .scaling = t::RopeScaling::kLlama3,
                       .factor = 8,
                       .low_freq_factor = 1,
                       .high_freq_factor = 4,
                       .original_positions = 8192},
                      16),
        {1, 0.19392274474868576, 0.037606030930863933, 0.0072926647372171102, 0.0005248461609929549,
         3.4281021959525912e-05, 6.6478698711812362e-06, 1.2891731721515574e-06},
        1);
  // Correction range [2, 6]: dimensions 0-2 kept, 6-7 / 4, a ramp between; attention factor 0.1 ln 4 + 1.
  const t::RopeSpec yarn{.theta = 10000,
                         .scaling = t::RopeScaling::kYarn,
                         .factor = 4,
                         .original_positions = 4096,
                         .beta_fast = 32,
                         .beta_slow = 1};
  check(t::rope_table(yarn, 16),
        {1, 0.31622776601683794, 0.1, 0.02569350598886808, 0.00625, 0.0013834964763236662, 0.00025,
         7.9056941504209485e-05},
        1.138629436111989);
  // YaRN at factor 1 is the plain table.
  t::RopeSpec unscaled = yarn;
  unscaled.factor = 1;
  check(t::rope_table(unscaled, 16), plain, 1);

  CHECK_THROWS_AS(t::rope_table({}, 15), std::invalid_argument);
  CHECK_THROWS_AS(t::rope_table({}, 0), std::invalid_argument);
  CHECK_THROWS_AS(t::rope_table({.theta = 0}, 16), std::invalid_argument);
  CHECK_THROWS_AS(t::rope_table({.scaling = t::RopeScaling::kLinear, .factor = 0}, 16),
                  std::invalid_argument);
  CHECK_THROWS_AS(t::rope_table({.scaling = t::RopeScaling::kYarn, .factor = -2}, 16), std::invalid_argument);
}

// Through the backend with BF16 activations: each op computes in FP32 on the widened values and rounds
// what it writes once (as kernels_test's BF16 case does for the GPT ops).
TEST_CASE("the CPU backend's Llama ops on BF16 activations round each FP32 result once", "[trainer][ops]") {
  namespace t = forge::trainer;
  t::Backend& be = t::cpu_backend();
  const int N = 37, C = 43, H = 40;
  const AttentionShape s{.heads = 4, .kv_heads = 2, .head_dim = 16};
  const int W = s.qkv_width();
  const auto to_half = [](std::vector<float> v) {
    std::vector<uint16_t> h(v.size());
    k::to_bf16(h.data(), v.data(), int64_t(v.size()));
    return h;
  };
  const auto widened = [](const std::vector<uint16_t>& h) {
    std::vector<float> v(h.size());
    k::from_bf16(v.data(), h.data(), int64_t(h.size()));
    return v;
  };
  const auto rounded = [](std::vector<float> v) {
    k::round_to_bf16(v.data(), int64_t(v.size()));
    return v;
  };

  const auto x = randn(size_t(N) * C, 24), w = randn(size_t(C), 25);
  std::vector<uint16_t> norm(x.size(), 0xffffu);  // NaN: what an op leaves unwritten shows
  std::vector<float> norm32(x.size()), rstd(N), rstd32(N);
  be.rmsnorm_forward(norm.data(), rstd.data(), x.data(), w.data(), 1e-6f, N, C);
  k::rmsnorm_forward(norm32.data(), rstd32.data(), x.data(), w.data(), 1e-6f, N, C);
  CHECK(same_bits(widened(norm), rounded(norm32)));
  CHECK(same_bits(rstd, rstd32));

  const auto gate_up = to_half(randn(size_t(N) * 2 * H, 26, 3.0f));
  std::vector<uint16_t> act(size_t(N) * H, 0xffffu);
  std::vector<float> act32(act.size());
  be.swiglu_forward(act.data(), gate_up.data(), N, H);
  k::swiglu_forward(act32.data(), widened(gate_up).data(), N, H);
  CHECK(same_bits(widened(act), rounded(act32)));

  // The in-place ops on BF16 qkv: q and k heads rounded once, v's values kept.
  const auto qkv0 = to_half(randn(size_t(N) * W, 27));
  const auto inv_freq = t::rope_table({}, 16).inv_freq;
  auto qkv = qkv0;
  auto qkv32 = widened(qkv0);
  be.rope(qkv.data(), nullptr, inv_freq.data(), 1.1f, N, 19, s, false);
  k::rope(qkv32.data(), nullptr, inv_freq.data(), 1.1f, N, 19, s, false);
  CHECK(same_bits(widened(qkv), rounded(qkv32)));

  const auto wq = randn(16, 28), wk = randn(16, 29);
  const size_t qk = size_t(N) * size_t(s.q_width() + s.kv_width());
  std::vector<float> saved(qk), saved32(qk), hrstd(size_t(N) * 6), hrstd32(hrstd.size());
  qkv = qkv0;
  qkv32 = widened(qkv0);
  be.head_rmsnorm_forward(qkv.data(), saved.data(), hrstd.data(), wq.data(), wk.data(), 1e-6f, N, s);
  k::head_rmsnorm_forward(qkv32.data(), saved32.data(), hrstd32.data(), wq.data(), wk.data(), 1e-6f, N, s);
  CHECK(same_bits(widened(qkv), rounded(qkv32)));
  CHECK(same_bits(saved, saved32));
  CHECK(same_bits(hrstd, hrstd32));
}
