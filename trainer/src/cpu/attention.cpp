// Causal grouped-query attention, optionally inside packed documents and a sliding window: a query sees
// the keys of its own document up to itself, the last `window` of them when window > 0; or bidirectional
// attention (shape.causal = false, a vision encoder's): every query sees every key of its sequence. Query
// head h reads key/value head h / (heads / kv_heads). Per (batch, query head), query rows are processed in
// blocks of kBlock: scores for a block against the keys it may see are formed by sgemm in per-thread scratch,
// softmaxed in place, and multiplied with V. Only the row log-sum-exp survives the forward; backward
// recomputes the probabilities from it (FlashAttention's trade: one extra Q.K^T product instead of keeping
// B*heads*T*T probabilities per layer). Masked keys are mostly never multiplied: a block touches keys [its
// first row's first visible key, block end), so future keys, earlier documents and keys that slid out of
// the window cost nothing. Without documents or window that range is [0, block end) and the arithmetic is
// exactly the plain causal kernel's; with kv_heads = heads it is exactly the multi-head kernel's.
//
// OpenMP splits (batch, query head) pairs over threads; OpenBLAS runs single-threaded inside each, so the
// two thread pools never run at the same time. In the backward, the query heads of a group all add to
// their shared key/value head's gradient: the group's first head accumulates into it directly, the others
// into per-thread scratch that is added in head order (an ordered region), so the sums do not depend on
// the threads.
#include "blas_threads.h"
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

// The keys [first(t), last(t)) the query at position t of a batch row sees: causal, from its document's
// start (doc_start: the row's starts, null: 0), moved up to t - window + 1 when window > 0, to t itself;
// bidirectional, all T. first never decreases with t, so a row block's first row sees the block's
// earliest key, and its last row the latest.
struct VisibleKeys {
  const int32_t* doc_start;
  const AttentionShape& shape;
  int T;
  int first(int t) const {
    if (!shape.causal) return 0;
    const int doc = doc_start != nullptr ? doc_start[t] : 0;
    return shape.window > 0 ? std::max(doc, t - shape.window + 1) : doc;
  }
  int last(int t) const { return shape.causal ? t + 1 : T; }
};

// The most keys one row block touches: the scratch width.
size_t block_keys(int T, const AttentionShape& shape) {
  return size_t(shape.causal && shape.window > 0 ? std::min(T, kBlock + shape.window - 1) : T);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                       const AttentionShape& shape) {
  const int NH = shape.heads, hd = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int W = shape.qkv_width(), QW = shape.q_width(), KW = shape.kv_width();
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    std::vector<float> scores(size_t(kBlock) * block_keys(T, shape));
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const float* q = qkv + int64_t(b) * T * W + h * hd;
      const float* k = qkv + int64_t(b) * T * W + QW + (h / group) * hd;
      const float* v = k + KW;
      float* o = out + int64_t(b) * T * QW + h * hd;
      float* l = lse + int64_t(bh) * T;
      const VisibleKeys visible_keys{doc_start != nullptr ? doc_start + int64_t(b) * T : nullptr, shape, T};
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        // Keys [lo, keys): the block's first row sees the earliest key, its last row the latest.
        const int rows = std::min(kBlock, T - r0), keys = visible_keys.last(r0 + rows - 1);
        const int lo = visible_keys.first(r0), nk = keys - lo;
        float* s = scores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, q + int64_t(r0) * W, W,
                    k + int64_t(lo) * W, W, 0.0f, s, nk);
        for (int i = 0; i < rows; ++i) {
          float* row = s + int64_t(i) * nk;
          const int first = visible_keys.first(r0 + i) - lo;
          const int visible = visible_keys.last(r0 + i) - lo;
          float* seen = row + first;  // the keys this query may attend to
          const int n = visible - first;
          l[r0 + i] = softmax_in_place(seen, n);
          std::fill(row, seen, 0.0f);
          std::fill(row + visible, row + nk, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, s, nk, v + int64_t(lo) * W,
                    W, 0.0f, o + int64_t(r0) * QW, QW);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* doc_start, int B, int T, const AttentionShape& shape) {
  const int NH = shape.heads, hd = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int W = shape.qkv_width(), QW = shape.q_width(), KW = shape.kv_width();
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    const size_t width = block_keys(T, shape);
    std::vector<float> probs(size_t(kBlock) * width), dprobs(size_t(kBlock) * width), delta(T);
    // dK and dV of a group's later query heads, [T, hd] each, before they are added in head order.
    std::vector<float> dk_part(group > 1 ? size_t(T) * hd : 0), dv_part(dk_part.size());
    // Query head bh's gradients: dQ into dqkv; dK and dV accumulate into dk, dv (leading dimension ld),
    // which this zeroes first.
    const auto head = [&](int bh, float* dk, float* dv, int ld) {
      const int b = bh / NH, h = bh % NH;
      const float* q = qkv + int64_t(b) * T * W + h * hd;
      const float* k = qkv + int64_t(b) * T * W + QW + (h / group) * hd;
      const float* v = k + KW;
      float* dq = dqkv + int64_t(b) * T * W + h * hd;
      const float* o = out + int64_t(b) * T * QW + h * hd;
      const float* dO = dout + int64_t(b) * T * QW + h * hd;
      const float* l = lse + int64_t(bh) * T;
      const VisibleKeys visible_keys{doc_start != nullptr ? doc_start + int64_t(b) * T : nullptr, shape, T};
      for (int t = 0; t < T; ++t) {
        float d = 0;
        const float* a = o + int64_t(t) * QW;
        const float* g = dO + int64_t(t) * QW;
#pragma omp simd reduction(+ : d)
        for (int c = 0; c < hd; ++c) d += a[c] * g[c];
        delta[t] = d;
        std::fill(dk + int64_t(t) * ld, dk + int64_t(t) * ld + hd, 0.0f);
        std::fill(dv + int64_t(t) * ld, dv + int64_t(t) * ld + hd, 0.0f);
      }
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int rows = std::min(kBlock, T - r0), keys = visible_keys.last(r0 + rows - 1);
        const int lo = visible_keys.first(r0), nk = keys - lo;
        const float* k_lo = k + int64_t(lo) * W;
        float* p = probs.data();
        float* dp = dprobs.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, q + int64_t(r0) * W, W,
                    k_lo, W, 0.0f, p, nk);
        for (int i = 0; i < rows; ++i) {
          float* row = p + int64_t(i) * nk;
          const int first = visible_keys.first(r0 + i) - lo;
          const int visible = visible_keys.last(r0 + i) - lo;
          float* seen = row + first;
          const int n = visible - first;
          const float li = l[r0 + i];
#pragma omp simd
          for (int j = 0; j < n; ++j) seen[j] = fast_exp(seen[j] - li);
          std::fill(row, seen, 0.0f);
          std::fill(row + visible, row + nk, 0.0f);
        }
        // dV[lo:keys] += P^T dO_block
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, p, nk, dO + int64_t(r0) * QW,
                    QW, 1.0f, dv + int64_t(lo) * ld, ld);
        // dP = dO_block V[lo:keys]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, 1.0f, dO + int64_t(r0) * QW, QW,
                    v + int64_t(lo) * W, W, 0.0f, dp, nk);
        // dS = P * (dP - delta) * scale (the 1/sqrt(hd) of the forward folded in)
        for (int i = 0; i < rows; ++i) {
          float* ds = dp + int64_t(i) * nk;
          const float* pr = p + int64_t(i) * nk;
          const float di = delta[r0 + i];
#pragma omp simd
          for (int j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - di) * scale;
        }
        // dQ_block = dS K[lo:keys] ; dK[lo:keys] += dS^T Q_block
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, dp, nk, k_lo, W, 0.0f,
                    dq + int64_t(r0) * W, W);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, dp, nk, q + int64_t(r0) * W,
                    W, 1.0f, dk + int64_t(lo) * ld, ld);
      }
    };
    // dK (part 0) or dV (part 1) of the key/value head that query head bh reads, in dqkv.
    const auto shared = [&](int bh, int part) {
      const int b = bh / NH, h = bh % NH;
      return dqkv + int64_t(b) * T * W + QW + part * KW + (h / group) * hd;
    };
    if (group == 1) {
#pragma omp for schedule(dynamic, 1)
      for (int bh = 0; bh < B * NH; ++bh) head(bh, shared(bh, 0), shared(bh, 1), W);
    } else {
      // A group's heads are consecutive: its first writes dK and dV in place, and each later one adds its
      // part once the heads before it are done (ordered regions run in iteration order).
#pragma omp for ordered schedule(dynamic, 1)
      for (int bh = 0; bh < B * NH; ++bh) {
        const bool leader = bh % group == 0;
        if (leader) {
          head(bh, shared(bh, 0), shared(bh, 1), W);
        } else {
          head(bh, dk_part.data(), dv_part.data(), hd);
        }
#pragma omp ordered
        if (!leader) {
          float *dk = shared(bh, 0), *dv = shared(bh, 1);
          for (int t = 0; t < T; ++t) {
            float* kt = dk + int64_t(t) * W;
            float* vt = dv + int64_t(t) * W;
            const float* pk = dk_part.data() + int64_t(t) * hd;
            const float* pv = dv_part.data() + int64_t(t) * hd;
#pragma omp simd
            for (int c = 0; c < hd; ++c) kt[c] += pk[c];
#pragma omp simd
            for (int c = 0; c < hd; ++c) vt[c] += pv[c];
          }
        }
      }
    }
  }
}

void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                      const int32_t* pos, int rows, int max_len, const AttentionShape& shape) {
  const int NH = shape.heads, hd = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int W = shape.qkv_width(), QW = shape.q_width(), KW = shape.kv_width();
  const float scale = 1.0f / std::sqrt(float(hd));
  const auto at = [&](int r) { return (int64_t(seq[r]) * max_len + pos[r]) * KW; };
  // Every key first: a prompt's rows, prefilled in one call, attend to each other's.
  for (int r = 0; r < rows; ++r) {
    std::copy_n(qkv + int64_t(r) * W + QW, KW, k_cache + at(r));
    std::copy_n(qkv + int64_t(r) * W + QW + KW, KW, v_cache + at(r));
  }
  // One query row and head at a time: a decoding step has one row per sequence, so the (row, head) pairs
  // are what there is to split over threads; each reads its sequence's keys once, in order.
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
    for (int rh = 0; rh < rows * NH; ++rh) {
      const int r = rh / NH, h = rh % NH, n = pos[r] + 1;
      const int j0 = shape.window > 0 ? std::max(0, n - shape.window) : 0;  // the first key it sees
      const float* q = qkv + int64_t(r) * W + h * hd;
      const float* k = k_cache + int64_t(seq[r]) * max_len * KW + (h / group) * hd;
      const float* v = v_cache + int64_t(seq[r]) * max_len * KW + (h / group) * hd;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = j0; j < n; ++j) {
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < hd; ++i) dot += q[i] * k[int64_t(j) * KW + i];
        p[size_t(j)] = dot * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float sum = 0;
      for (int j = j0; j < n; ++j) {
        p[size_t(j)] = fast_exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      float* o = out + int64_t(r) * QW + h * hd;
      std::fill_n(o, hd, 0.0f);
      for (int j = j0; j < n; ++j) {
        const float w = p[size_t(j)] / sum;
#pragma omp simd
        for (int i = 0; i < hd; ++i) o[i] += w * v[int64_t(j) * KW + i];
      }
    }
  }
}

}  // namespace forge::trainer::cpu
