// Classifier (tied to the token embedding) fused with softmax cross-entropy. Rows are processed in
// chunks: logits of one chunk are formed, turned into their own gradient in place, and consumed by the
// two backward products before the next chunk, so no full [rows, vocab] buffer exists (at vocab 8192 and
// 2048 rows that would be 64 MiB, twice over with its gradient).
#include "fast_math.h"
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
                                   float* logits_out) {
  thread_local std::vector<float> chunk;
  chunk.resize(size_t(std::min(N, kChunkRows)) * V);
  double total = 0;
  for (int r0 = 0; r0 < N; r0 += kChunkRows) {
    const int rows = std::min(kChunkRows, N - r0);
    float* logits = chunk.data();
    sgemm(false, true, rows, V, C, 1.0f, x + int64_t(r0) * C, C, wte, C, 0.0f, logits, V);
    if (logits_out != nullptr)
      std::memcpy(logits_out + int64_t(r0) * V, logits, sizeof(float) * size_t(rows) * V);
    double chunk_loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss)
    for (int i = 0; i < rows; ++i) {
      float* row = logits + int64_t(i) * V;
      float mx = row[0];
      for (int j = 1; j < V; ++j) mx = std::max(mx, row[j]);
      const int target = targets[r0 + i];
      const float shifted_target = row[target] - mx;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        row[j] = fast_exp(row[j] - mx);
        sum += row[j];
      }
      chunk_loss += std::log(sum) - shifted_target;  // logsumexp - logit[target]
      if (dx == nullptr) continue;
      const float inv = grad_scale / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] *= inv;
      row[target] -= grad_scale;
    }
    total += chunk_loss;
    if (dx == nullptr) continue;
    sgemm(false, false, rows, C, V, 1.0f, logits, V, wte, C, 0.0f, dx + int64_t(r0) * C, C);
    sgemm(true, false, V, C, rows, 1.0f, logits, V, x + int64_t(r0) * C, C, 1.0f, dwte, C);
  }
  return total;
}

}  // namespace forge::trainer::cpu
