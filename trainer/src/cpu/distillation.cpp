// The distillation loss of one chunk of logits (Backend::distillation, backend.h): cross-entropy to the
// targets and KL divergence from the teacher's tempered distribution, in one pass over the student's
// logits, turned into their gradient in place.
#include "fast_math.h"
#include "forge/common/batch.h"
#include "kernels.h"
#include "ordered_sum.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace forge::trainer::cpu {

double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights, int rows,
                    int V, int vocab_begin, float temperature, float alpha, float scale, bool backward,
                    VocabGroup* group, double* kl_sum) {
  // Per row: the two maxima, then five sums a group combines with one reduction each. With z the
  // student's logits, t the teacher's, a = (z - max z) / T and b = (t - max t) / T:
  //   S1 = sum exp(z - max z), ST = sum exp(a), SB = sum exp(b), D = sum exp(b) (b - a), zt = z[target],
  // so CE = log S1 - (zt - max z) and KL(p_t || p_s) = D / SB - log SB + log ST. When the teacher's
  // logits equal the student's, b - a is exactly 0 and so is the KL.
  thread_local std::vector<float> stats;
  stats.resize(size_t(7) * size_t(rows));
  float* mx = stats.data();     // [rows][2]: max z, max t
  float* sums = mx + 2 * rows;  // [rows][5]: S1, ST, SB, D, zt
  const float inv_t = 1.0f / temperature;
  const auto weight = [&](int i) {
    return targets[i] == MicroBatch::kIgnore ? 0.0f : weights != nullptr ? weights[i] : 1.0f;
  };
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows; ++i) {
    const float* z = logits + int64_t(i) * V;
    const float* t = teacher + int64_t(i) * V;
    float mz = z[0], mt = t[0];
    for (int j = 1; j < V; ++j) {
      mz = std::max(mz, z[j]);
      mt = std::max(mt, t[j]);
    }
    mx[2 * i] = mz;
    mx[2 * i + 1] = mt;
  }
  if (group != nullptr) group->max(mx, 2 * rows);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows; ++i) {
    float* s = sums + 5 * int64_t(i);
    std::fill_n(s, 5, 0.0f);
    if (weight(i) == 0.0f) continue;  // every rank of a group sees the same weights
    const float* z = logits + int64_t(i) * V;
    float* t = teacher + int64_t(i) * V;
    const float mz = mx[2 * i], mt = mx[2 * i + 1];
    const int target = targets[i] - vocab_begin;
    if (target >= 0 && target < V) s[4] = z[target];
    float s1 = 0, st = 0, sb = 0, d = 0;
#pragma omp simd reduction(+ : s1, st, sb, d)
    for (int j = 0; j < V; ++j) {
      const float a = (z[j] - mz) * inv_t, b = (t[j] - mt) * inv_t;
      const float eb = fast_exp(b);
      s1 += fast_exp(z[j] - mz);
      st += fast_exp(a);
      sb += eb;
      d += eb * (b - a);
      t[j] = eb;  // kept for the gradient
    }
    s[0] = s1;
    s[1] = st;
    s[2] = sb;
    s[3] = d;
  }
  if (group != nullptr) group->sum(sums, 5 * rows);
  const auto totals = ordered_sum<2>(rows, [&](int64_t lo, int64_t hi, std::array<double, 2>& acc) {
    for (int64_t i = lo; i < hi; ++i) {
      const float w = weight(i);
      float* z = logits + int64_t(i) * V;
      const float* s = sums + 5 * int64_t(i);
      if (w == 0.0f) {
        if (backward) std::fill_n(z, V, 0.0f);
        continue;
      }
      const float mz = mx[2 * i];
      const float ce = std::log(s[0]) - (s[4] - mz);
      const float kl = s[3] / s[2] - std::log(s[2]) + std::log(s[1]);
      acc[0] += double(w) * (double(alpha) * temperature * temperature * kl + (1.0 - alpha) * ce);
      acc[1] += double(w) * kl;
      if (!backward) continue;
      // dL/dz = (1 - alpha) (softmax(z) - onehot(target)) + alpha T (softmax(z / T) - softmax(t / T)),
      // times w x scale.
      const float c_ce = w * scale * (1.0f - alpha) / s[0];
      const float c_st = w * scale * alpha * temperature / s[1];
      const float c_sb = w * scale * alpha * temperature / s[2];
      const float* eb = teacher + int64_t(i) * V;
#pragma omp simd
      for (int j = 0; j < V; ++j)
        z[j] = c_ce * fast_exp(z[j] - mz) + c_st * fast_exp((z[j] - mz) * inv_t) - c_sb * eb[j];
      const int target = targets[i] - vocab_begin;
      if (target >= 0 && target < V) z[target] -= w * scale * (1.0f - alpha);
    }
  });
  if (kl_sum != nullptr) *kl_sum = totals[1];
  return totals[0];
}

}  // namespace forge::trainer::cpu
