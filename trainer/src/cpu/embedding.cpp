// Token + learned position embedding.
#include "kernels.h"

#include <omp.h>

namespace forge::trainer::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < int64_t(B) * T; ++r) {
    const float* e = wte + int64_t(tokens[r]) * C;
    const float* p = wpe + (r % T) * C;
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) {
  // Rows of dwte collide when a token repeats, so threads own column ranges instead of rows: every
  // thread walks all rows but touches only its columns, which needs no atomics and stays deterministic.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int per = (C + nt - 1) / nt;
    const int c0 = id * per, c1 = c0 + per < C ? c0 + per : C;
    for (int64_t r = 0; r < int64_t(B) * T; ++r) {
      float* dw = dwte + int64_t(tokens[r]) * C;
      float* dp = dwpe + (r % T) * C;
      const float* d = dout + r * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        dw[c] += d[c];
        dp[c] += d[c];
      }
    }
  }
}

}  // namespace forge::trainer::cpu
