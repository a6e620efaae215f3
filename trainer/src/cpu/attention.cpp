// Causal multi-head attention, optionally inside packed documents: a query sees the keys of its own
// document up to itself. Per (batch, head), query rows are processed in blocks of kBlock: scores for a
// block against the keys it may see are formed by sgemm in per-thread scratch, softmaxed in place, and
// multiplied with V. Only the row log-sum-exp survives the forward; backward recomputes the probabilities
// from it (FlashAttention's trade: one extra Q.K^T product instead of keeping B*NH*T*T probabilities per
// layer). Masked keys are mostly never multiplied: a block touches keys [its first row's document start,
// block end), so future keys and earlier documents cost nothing. Without documents that range is
// [0, block end) and the arithmetic is exactly the plain causal kernel's.
//
// OpenMP splits (batch, head) pairs over threads; OpenBLAS runs single-threaded inside each, so the two
// thread pools never run at the same time.
#include "fast_math.h"
#include "kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace forge::trainer::cpu {

namespace {

constexpr int kBlock = 64;

// OpenBLAS single-threaded for the scope (the callers are OpenMP threads).
class BlasSingleThread {
 public:
  BlasSingleThread() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~BlasSingleThread() { openblas_set_num_threads(saved_); }
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                       int C, int NH) {
  const int hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    std::vector<float> scores(size_t(kBlock) * T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const float* q = qkv + int64_t(b) * T * C3 + h * hd;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* o = out + int64_t(b) * T * C + h * hd;
      float* l = lse + int64_t(bh) * T;
      const int32_t* first_key = doc_start != nullptr ? doc_start + int64_t(b) * T : nullptr;
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        // Keys [lo, keys): the block's first row starts the earliest document (starts never decrease).
        const int rows = std::min(kBlock, T - r0), keys = r0 + rows;
        const int lo = first_key != nullptr ? first_key[r0] : 0, nk = keys - lo;
        float* s = scores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, q + int64_t(r0) * C3, C3,
                    k + int64_t(lo) * C3, C3, 0.0f, s, nk);
        for (int i = 0; i < rows; ++i) {
          float* row = s + int64_t(i) * nk;
          const int first = (first_key != nullptr ? first_key[r0 + i] : 0) - lo;
          const int visible = r0 + i + 1 - lo;
          float* seen = row + first;  // the keys this query may attend to
          const int n = visible - first;
          float mx = -std::numeric_limits<float>::infinity();
          for (int j = 0; j < n; ++j) mx = std::max(mx, seen[j]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int j = 0; j < n; ++j) {
            seen[j] = fast_exp(seen[j] - mx);
            sum += seen[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int j = 0; j < n; ++j) seen[j] *= inv;
          std::fill(row, seen, 0.0f);
          std::fill(row + visible, row + nk, 0.0f);
          l[r0 + i] = mx + std::log(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, s, nk,
                    v + int64_t(lo) * C3, C3, 0.0f, o + int64_t(r0) * C, C);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* doc_start, int B, int T, int C, int NH) {
  const int hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    std::vector<float> probs(size_t(kBlock) * T), dprobs(size_t(kBlock) * T), delta(T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const int64_t base = int64_t(b) * T * C3 + h * hd;
      const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
      const float* o = out + int64_t(b) * T * C + h * hd;
      const float* dO = dout + int64_t(b) * T * C + h * hd;
      const float* l = lse + int64_t(bh) * T;
      const int32_t* first_key = doc_start != nullptr ? doc_start + int64_t(b) * T : nullptr;
      for (int t = 0; t < T; ++t) {
        float d = 0;
        const float* a = o + int64_t(t) * C;
        const float* g = dO + int64_t(t) * C;
#pragma omp simd reduction(+ : d)
        for (int c = 0; c < hd; ++c) d += a[c] * g[c];
        delta[t] = d;
        std::fill(dk + int64_t(t) * C3, dk + int64_t(t) * C3 + hd, 0.0f);
        std::fill(dv + int64_t(t) * C3, dv + int64_t(t) * C3 + hd, 0.0f);
      }
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int rows = std::min(kBlock, T - r0), keys = r0 + rows;
        const int lo = first_key != nullptr ? first_key[r0] : 0, nk = keys - lo;
        const float* k_lo = k + int64_t(lo) * C3;
        float* p = probs.data();
        float* dp = dprobs.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, q + int64_t(r0) * C3, C3,
                    k_lo, C3, 0.0f, p, nk);
        for (int i = 0; i < rows; ++i) {
          float* row = p + int64_t(i) * nk;
          const int first = (first_key != nullptr ? first_key[r0 + i] : 0) - lo;
          const int visible = r0 + i + 1 - lo;
          float* seen = row + first;
          const int n = visible - first;
          const float li = l[r0 + i];
#pragma omp simd
          for (int j = 0; j < n; ++j) seen[j] = fast_exp(seen[j] - li);
          std::fill(row, seen, 0.0f);
          std::fill(row + visible, row + nk, 0.0f);
        }
        // dV[lo:keys] += P^T dO_block
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, p, nk, dO + int64_t(r0) * C,
                    C, 1.0f, dv + int64_t(lo) * C3, C3);
        // dP = dO_block V[lo:keys]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, 1.0f, dO + int64_t(r0) * C, C,
                    v + int64_t(lo) * C3, C3, 0.0f, dp, nk);
        // dS = P * (dP - delta) * scale (the 1/sqrt(hd) of the forward folded in)
        for (int i = 0; i < rows; ++i) {
          float* ds = dp + int64_t(i) * nk;
          const float* pr = p + int64_t(i) * nk;
          const float di = delta[r0 + i];
#pragma omp simd
          for (int j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - di) * scale;
        }
        // dQ_block = dS K[lo:keys] ; dK[lo:keys] += dS^T Q_block
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, dp, nk, k_lo, C3, 0.0f,
                    dq + int64_t(r0) * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, dp, nk, q + int64_t(r0) * C3,
                    C3, 1.0f, dk + int64_t(lo) * C3, C3);
      }
    }
  }
}

void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                      const int32_t* pos, int rows, int max_len, int C, int NH) {
  const int hd = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hd));
  const auto at = [&](int r) { return (int64_t(seq[r]) * max_len + pos[r]) * C; };
  // Every key first: a prompt's rows, prefilled in one call, attend to each other's.
  for (int r = 0; r < rows; ++r) {
    std::copy_n(qkv + int64_t(r) * C3 + C, C, k_cache + at(r));
    std::copy_n(qkv + int64_t(r) * C3 + 2 * C, C, v_cache + at(r));
  }
  // One query row and head at a time: a decoding step has one row per sequence, so the (row, head) pairs
  // are what there is to split over threads; each reads its sequence's keys once, in order.
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
    for (int rh = 0; rh < rows * NH; ++rh) {
      const int r = rh / NH, h = rh % NH, n = pos[r] + 1;
      const float* q = qkv + int64_t(r) * C3 + h * hd;
      const float* k = k_cache + int64_t(seq[r]) * max_len * C + h * hd;
      const float* v = v_cache + int64_t(seq[r]) * max_len * C + h * hd;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) {
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < hd; ++i) dot += q[i] * k[int64_t(j) * C + i];
        p[size_t(j)] = dot * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float sum = 0;
      for (int j = 0; j < n; ++j) {
        p[size_t(j)] = fast_exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      float* o = out + int64_t(r) * C + h * hd;
      std::fill_n(o, hd, 0.0f);
      for (int j = 0; j < n; ++j) {
        const float w = p[size_t(j)] / sum;
#pragma omp simd
        for (int i = 0; i < hd; ++i) o[i] += w * v[int64_t(j) * C + i];
      }
    }
  }
}

}  // namespace forge::trainer::cpu
