// Softmax cross-entropy of one chunk of logits, turned into its own gradient in place (the classifier
// layer, model.cpp, forms the logits chunk by chunk so no full [rows, vocab] buffer ever exists).
#include "fast_math.h"
#include "forge/common/batch.h"
#include "kernels.h"
#include "ordered_sum.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace forge::trainer::cpu {

double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                     int vocab_begin, float scale, bool backward, VocabGroup* group, float* nll) {
  // Per row: max, then (sum of exponentials, target logit) next to each other so a group combines both
  // with one reduction.
  thread_local std::vector<float> stats;
  stats.resize(size_t(3) * size_t(rows));
  float* mx = stats.data();
  float* sum_tgt = mx + rows;
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
    const int t = targets[i] - vocab_begin;
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
  return ordered_sum<1>(rows, [&](int64_t lo, int64_t hi, std::array<double, 1>& total) {
    for (int64_t i = lo; i < hi; ++i) {
      const float w = targets[i] == MicroBatch::kIgnore ? 0.0f : weights != nullptr ? weights[i] : 1.0f;
      const float sum = sum_tgt[2 * i];
      const float loss = w != 0.0f ? std::log(sum) - (sum_tgt[2 * i + 1] - mx[i]) : 0.0f;  // lse - logit
      if (w != 0.0f) total[0] += double(w) * loss;
      if (nll != nullptr) nll[i] = loss;
      if (!backward) continue;
      float* row = logits + i * V;
      const float c = w * scale;  // dL/dlogit = c * (softmax - onehot(target))
      const float inv = c / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) row[j] *= inv;
      const int t = targets[i] - vocab_begin;
      if (t >= 0 && t < V) row[t] -= c;
    }
  })[0];
}

}  // namespace forge::trainer::cpu
