// Token + learned position embedding.
#include "kernels.h"

#include <omp.h>

namespace forge::trainer::cpu {

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < int64_t(B) * T; ++r) {
    const int32_t t = tokens[r];
    float* o = out + r * C;
    const float* e = t >= vocab_begin && t < vocab_end ? wte + int64_t(t - vocab_begin) * C : nullptr;
    const float* p =
        wpe != nullptr ? wpe + int64_t(positions != nullptr ? positions[r] : r % T) * C : nullptr;
    if (e != nullptr && p != nullptr) {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (e != nullptr || p != nullptr) {
      const float* src = e != nullptr ? e : p;
      for (int c = 0; c < C; ++c) o[c] = src[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int B, int T, int C, int vocab_begin, int vocab_end) {
  // Rows of dwte collide when a token repeats, so threads own column ranges instead of rows: every
  // thread walks all rows but touches only its columns, which needs no atomics and stays deterministic.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int per = (C + nt - 1) / nt;
    const int c0 = id * per, c1 = c0 + per < C ? c0 + per : C;
    for (int64_t r = 0; r < int64_t(B) * T; ++r) {
      const int32_t t = tokens[r];
      const float* d = dout + r * C;
      if (dwpe != nullptr) {
        float* dp = dwpe + int64_t(positions != nullptr ? positions[r] : r % T) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) dp[c] += d[c];
      }
      if (t < vocab_begin || t >= vocab_end) continue;
      float* dw = dwte + int64_t(t - vocab_begin) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) dw[c] += d[c];
    }
  }
}

}  // namespace forge::trainer::cpu
