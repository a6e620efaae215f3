// Context parallelism's attention unit (Backend::attention_chunk_forward / _backward): the query rows of
// one chunk over the key/value rows of another, with the masks written in sequence indices so that a
// chunk pair from two ranks is masked as the whole sequence would be. Row blocks of kBlock queries, as in
// attention.cpp: a block touches only the keys [its first row's first visible key, its last row's last],
// and one with none is skipped. Forward merges each block's result into the running (out, lse) by their
// log-sum-exps; backward recomputes the probabilities from the merged lse (FlashAttention's trade).
//
// OpenMP splits (sequence, key/value head) pairs over threads: the query heads of a group run in order on
// one thread, so their additions to the shared dk and dv rows happen in one fixed order.
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
constexpr float kNoKey = -std::numeric_limits<float>::infinity();

// The keys of the key chunk that query row t (of sequence b) sees: [first(t), last(t)], empty when
// first > last. Both never decrease with t (document ids and sequence indices only rise).
struct Visible {
  const AttentionChunks& c;
  const int32_t *q_seg, *k_seg;
  Visible(const AttentionChunks& chunks, int b)
      : c(chunks),
        q_seg(chunks.q_seg ? chunks.q_seg + int64_t(b) * chunks.seg_seq : nullptr),
        k_seg(chunks.k_seg ? chunks.k_seg + int64_t(b) * chunks.seg_seq : nullptr) {}
  int last(int t) const { return std::min(c.n - 1, c.q_first + t - c.k_first); }
  int first(int t) const {
    int f = 0;
    if (q_seg != nullptr) f = int(std::lower_bound(k_seg, k_seg + c.n, q_seg[t]) - k_seg);
    if (c.shape.window > 0) f = std::max(f, c.q_first + t - c.shape.window + 1 - c.k_first);
    return f;
  }
};

}  // namespace

void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse) {
  const int NH = c.shape.heads, hd = c.shape.head_dim, group = c.shape.heads / c.shape.kv_heads;
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    std::vector<float> scores(size_t(kBlock) * size_t(c.n)), part(size_t(kBlock) * size_t(hd)),
        block_lse(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < c.B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH, kvh = h / group;
      const Visible vis(c, b);
      float* l = lse + (int64_t(b) * NH + h) * c.stats_seq;
      for (int r0 = 0; r0 < c.n; r0 += kBlock) {
        const int rows = std::min(kBlock, c.n - r0);
        const int lo = vis.first(r0), hi = vis.last(r0 + rows - 1) + 1, nk = hi - lo;
        if (nk <= 0) continue;  // no row of the block sees a key of this chunk
        float* s = scores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, c.q.row(b, r0) + h * hd,
                    c.q.ld, c.k.row(b, lo) + kvh * hd, c.k.ld, 0.0f, s, nk);
        std::fill(block_lse.begin(), block_lse.end(), kNoKey);
        for (int i = 0; i < rows; ++i) {
          float* row = s + int64_t(i) * nk;
          const int first = std::max(vis.first(r0 + i), lo) - lo, end = vis.last(r0 + i) + 1 - lo;
          if (first >= end) {
            std::fill(row, row + nk, 0.0f);
            continue;
          }
          float* seen = row + first;
          const int n = end - first;
          block_lse[size_t(i)] = softmax_in_place(seen, n);
          std::fill(row, seen, 0.0f);
          std::fill(row + end, row + nk, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, s, nk,
                    c.v.row(b, lo) + kvh * hd, c.v.ld, 0.0f, part.data(), hd);
        // Merge: out = (e^L out + e^Lb part) / e^L', L' = log(e^L + e^Lb).
        for (int i = 0; i < rows; ++i) {
          const float lb = block_lse[size_t(i)];
          if (lb == kNoKey) continue;
          float& la = l[r0 + i];
          float* o = out.row(b, r0 + i) + h * hd;
          const float* p = part.data() + int64_t(i) * hd;
          if (la == kNoKey) {
            std::copy(p, p + hd, o);
            la = lb;
            continue;
          }
          const float m = std::max(la, lb), ea = std::exp(la - m), eb = std::exp(lb - m),
                      inv = 1.0f / (ea + eb);
#pragma omp simd
          for (int d = 0; d < hd; ++d) o[d] = (ea * o[d] + eb * p[d]) * inv;
          la = m + std::log(ea + eb);
        }
      }
    }
  }
}

void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse, const float* delta,
                              ChunkRows dq, ChunkRows dk, ChunkRows dv) {
  const int NH = c.shape.heads, KH = c.shape.kv_heads, hd = c.shape.head_dim, group = NH / KH;
  const float scale = 1.0f / std::sqrt(float(hd));
  BlasSingleThread single;
#pragma omp parallel
  {
    std::vector<float> probs(size_t(kBlock) * size_t(c.n)), dprobs(probs.size());
#pragma omp for schedule(dynamic, 1)
    for (int bg = 0; bg < c.B * KH; ++bg) {
      const int b = bg / KH, kvh = bg % KH;
      const Visible vis(c, b);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* l = lse + (int64_t(b) * NH + h) * c.stats_seq;
        const float* dl = delta + (int64_t(b) * NH + h) * c.stats_seq;
        for (int r0 = 0; r0 < c.n; r0 += kBlock) {
          const int rows = std::min(kBlock, c.n - r0);
          const int lo = vis.first(r0), hi = vis.last(r0 + rows - 1) + 1, nk = hi - lo;
          if (nk <= 0) continue;
          const float* q = c.q.row(b, r0) + h * hd;
          const float* k = c.k.row(b, lo) + kvh * hd;
          const float* v = c.v.row(b, lo) + kvh * hd;
          const float* g = dout.row(b, r0) + h * hd;
          float* p = probs.data();
          float* dp = dprobs.data();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, scale, q, c.q.ld, k, c.k.ld,
                      0.0f, p, nk);
          for (int i = 0; i < rows; ++i) {
            float* row = p + int64_t(i) * nk;
            const int first = std::min(std::max(vis.first(r0 + i), lo) - lo, nk);
            const int end = std::max(vis.last(r0 + i) + 1 - lo, first);
            const float li = l[r0 + i];
#pragma omp simd
            for (int j = first; j < end; ++j) row[j] = fast_exp(row[j] - li);
            std::fill(row, row + first, 0.0f);
            std::fill(row + end, row + nk, 0.0f);
          }
          // dV += P^T dO ; dP = dO V^T ; dS = P (dP - delta) scale ; dQ += dS K ; dK += dS^T Q
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, p, nk, g, dout.ld, 1.0f,
                      dv.row(b, lo) + kvh * hd, dv.ld);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nk, hd, 1.0f, g, dout.ld, v, c.v.ld,
                      0.0f, dp, nk);
          for (int i = 0; i < rows; ++i) {
            float* ds = dp + int64_t(i) * nk;
            const float* pr = p + int64_t(i) * nk;
            const float di = dl[r0 + i];
#pragma omp simd
            for (int j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - di) * scale;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, nk, 1.0f, dp, nk, k, c.k.ld, 1.0f,
                      dq.row(b, r0) + h * hd, dq.ld);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, rows, 1.0f, dp, nk, q, c.q.ld, 1.0f,
                      dk.row(b, lo) + kvh * hd, dk.ld);
        }
      }
    }
  }
}

void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                     const AttentionShape& s) {
  const int NH = s.heads, hd = s.head_dim, QW = s.q_width();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int64_t row = (int64_t(b) * T + t) * QW + h * hd;
        float d = 0;
        for (int c = 0; c < hd; ++c) d += out[row + c] * dout[row + c];
        delta[(int64_t(b) * NH + h) * T + t] = d;
      }
}

}  // namespace forge::trainer::cpu
