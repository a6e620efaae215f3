// Classifier (tied to the token embedding) fused with softmax cross-entropy. Rows are processed in
// chunks: logits of one chunk are formed, turned into their own gradient in place, and consumed by the
// two backward products before the next chunk, so no full [rows, vocab] buffer exists (at vocab 8192 and
// 2048 rows that would be 64 MiB, twice over with its gradient).
#include "fast_math.h"
#include "forge/common/huge_buffer.h"
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace forge::trainer::cpu {

namespace {
constexpr int kChunkRows = 256;
}

double classifier_forward_backward(float* dx, float* dwte, const float* x, const float* wte,
                                   const int32_t* targets, int N, int C, int V, float grad_scale,
                                   float* logits_out, GroupReduce* group, int vocab_begin) {
  // The logits chunk (8 MiB at vocab 8192) sits in huge pages: the products stream through it each step.
  thread_local HugeBuffer<float> chunk;
  thread_local std::vector<float> stats;
  if (const size_t need = size_t(std::min(N, kChunkRows)) * V; chunk.size() < need)
    chunk = HugeBuffer<float>(need);
  stats.resize(size_t(3) * kChunkRows);
  double total = 0;
  for (int r0 = 0; r0 < N; r0 += kChunkRows) {
    const int rows = std::min(kChunkRows, N - r0);
    float* logits = chunk.data();
    // Per row: max, then (sum of exponentials, target logit) next to each other so a group combines
    // both with one reduction.
    float* mx = stats.data();
    float* sum_tgt = mx + kChunkRows;
    sgemm(false, true, rows, V, C, 1.0f, x + int64_t(r0) * C, C, wte, C, 0.0f, logits, V);
    if (logits_out != nullptr)
      std::memcpy(logits_out + int64_t(r0) * V, logits, sizeof(float) * size_t(rows) * V);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; ++i) {
      const float* row = logits + int64_t(i) * V;
      float m = row[0];
      for (int j = 1; j < V; ++j) m = std::max(m, row[j]);
      mx[i] = m;
    }
    if (group != nullptr) group->max(mx, rows);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; ++i) {
      float* row = logits + int64_t(i) * V;
      const int t = targets[r0 + i] - vocab_begin;
      sum_tgt[2 * i + 1] = t >= 0 && t < V ? row[t] : 0.0f;
      const float m = mx[i];
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        row[j] = fast_exp(row[j] - m);
        sum += row[j];
      }
      sum_tgt[2 * i] = sum;
    }
    if (group != nullptr) group->sum(sum_tgt, 2 * rows);
    double chunk_loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss)
    for (int i = 0; i < rows; ++i) {
      const float sum = sum_tgt[2 * i];
      chunk_loss += std::log(sum) - (sum_tgt[2 * i + 1] - mx[i]);  // logsumexp - logit[target]
      if (dx == nullptr) continue;
      float* row = logits + int64_t(i) * V;
      const float inv = grad_scale / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] *= inv;
      const int t = targets[r0 + i] - vocab_begin;
      if (t >= 0 && t < V) row[t] -= grad_scale;
    }
    total += chunk_loss;
    if (dx == nullptr) continue;
    sgemm(false, false, rows, C, V, 1.0f, logits, V, wte, C, 0.0f, dx + int64_t(r0) * C, C);
    sgemm(true, false, V, C, rows, 1.0f, logits, V, x + int64_t(r0) * C, C, 1.0f, dwte, C);
  }
  return total;
}

}  // namespace forge::trainer::cpu
