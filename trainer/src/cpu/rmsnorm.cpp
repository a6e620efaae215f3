// RMSNorm (Llama, Qwen, Mistral): out = x / sqrt(mean(x^2) + eps) x weight, over a row or, for Qwen 3's
// qk-norm, over each q and k head of a qkv row. The product is taken as (x x rstd) x weight, the order of
// Hugging Face's RMSNorm, so that FP32 results round as theirs do.
//
// The weight gradients are sums over rows, taken chunk by chunk (row_chunks.h).
#include "kernels.h"
#include "row_chunks.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace forge::trainer::cpu {

namespace {

float sum_squares(const float* x, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < n; ++c) s += x[c] * x[c];
  return s;
}

// out = (x x rstd) x w for the row whose sum of squares is ss; returns rstd.
float normalize(float* out, const float* x, const float* w, float ss, float eps, int n) {
  const float rs = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
  for (int c = 0; c < n; ++c) out[c] = x[c] * rs * w[c];
  return rs;
}

// One row's backward. With y = x r w and r = (mean(x^2) + eps)^(-1/2), dr/dx = -r^3 x / n, so
// dx = r (g w) - x r^3 mean(g w x). Accumulate: dx +=, else dx = (dx may then be g: in place). dw += g x r.
template <bool Accumulate>
void backward_row(float* dx, float* dw, const float* g, const float* x, const float* w, float rs, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < n; ++c) s += g[c] * w[c] * x[c];
  const float k = rs * rs * rs * s / float(n);
#pragma omp simd
  for (int c = 0; c < n; ++c) {
    const float gc = g[c];
    dw[c] += gc * x[c] * rs;
    const float d = rs * (gc * w[c]) - x[c] * k;
    if constexpr (Accumulate) {
      dx[c] += d;
    } else {
      dx[c] = d;
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = in + r * C;
    rstd[r] = normalize(out + r * C, x, weight, sum_squares(x, C), eps, C);
  }
}

void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                               const float* weight, const float* rstd, int N, int C) {
  chunk_partials(partial, N, C, [&](float* dw, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      backward_row<true>(din + r * C, dw, dout + r * C, in + r * C, weight, rstd[r], C);
  });
}

void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride) {
  if (grad == nullptr) return;  // a frozen weight
  sum_chunks(partial, chunks, width, stride,
             [&](int c, double sum) { grad[c] = float(double(grad[c]) + sum); });
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int N, int C) {
  const auto partial = std::make_unique_for_overwrite<float[]>(size_t(row_chunks(N)) * size_t(C));
  rmsnorm_backward_partials(din, partial.get(), dout, in, weight, rstd, N, C);
  add_chunk_sums(dweight, partial.get(), row_chunks(N), C, C);
}

void residual_rmsnorm_forward(float* res_out, float* out, float* rstd, const float* res_in,
                              const float* delta, const float* delta_bias, const float* weight, float eps,
                              int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* a = res_in + r * C;
    const float* d = delta + r * C;
    float* x = res_out + r * C;
    float ss = 0;
    if (delta_bias != nullptr) {
#pragma omp simd reduction(+ : ss)
      for (int c = 0; c < C; ++c) {
        x[c] = a[c] + d[c] + delta_bias[c];
        ss += x[c] * x[c];
      }
    } else {
#pragma omp simd reduction(+ : ss)
      for (int c = 0; c < C; ++c) {
        x[c] = a[c] + d[c];
        ss += x[c] * x[c];
      }
    }
    rstd[r] = normalize(out + r * C, x, weight, ss, eps, C);
  }
}

// The q and k heads are the first (heads + kv_heads) x head_dim columns of a qkv row, contiguous, and
// `saved` keeps exactly those columns.
void head_rmsnorm_forward(float* qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                          float eps, int N, const AttentionShape& shape) {
  const int hd = shape.head_dim, heads = shape.heads + shape.kv_heads, width = heads * hd;
  const int W = shape.qkv_width();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* row = qkv + r * W;
    float* s = saved + r * width;
    std::copy(row, row + width, s);
    for (int h = 0; h < heads; ++h) {
      const float* x = s + h * hd;
      const float* w = h < shape.heads ? q_weight : k_weight;
      rstd[r * heads + h] = normalize(row + h * hd, x, w, sum_squares(x, hd), eps, hd);
    }
  }
}

void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                           const float* rstd, const float* q_weight, const float* k_weight, int N,
                           const AttentionShape& shape) {
  const int hd = shape.head_dim, heads = shape.heads + shape.kv_heads, width = heads * hd;
  const int W = shape.qkv_width();
  // One partial of 2 x head_dim per chunk: the query weight's gradient, then the key weight's.
  const auto partial = std::make_unique_for_overwrite<float[]>(size_t(row_chunks(N)) * 2 * size_t(hd));
  chunk_partials(partial.get(), N, 2 * hd, [&](float* dw, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int h = 0; h < heads; ++h) {
        const bool query = h < shape.heads;
        float* g = dqkv + r * W + h * hd;
        backward_row<false>(g, query ? dw : dw + hd, g, saved + r * width + h * hd,
                            query ? q_weight : k_weight, rstd[r * heads + h], hd);
      }
  });
  add_chunk_sums(dq_weight, partial.get(), row_chunks(N), hd, 2 * hd);
  add_chunk_sums(dk_weight, partial.get() + hd, row_chunks(N), hd, 2 * hd);
}

}  // namespace forge::trainer::cpu
