// Linear layers through OpenBLAS sgemm on flat [rows, channels] activations; weights [OC, C] as in
// PyTorch, so the forward is a product with the transposed weight and nothing is ever transposed in
// memory.
#include "kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

namespace forge::trainer::cpu {

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (omp_in_parallel()) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const bool split_m = M >= N;
    const int total = split_m ? M : N;
    const int per = ((total + nt - 1) / nt + 15) / 16 * 16;
    const int s0 = std::min(total, id * per), s1 = std::min(total, s0 + per);
    if (s1 > s0) {
      if (split_m) {
        const float* a = trans_a ? A + s0 : A + int64_t(s0) * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, s1 - s0, N, K, alpha, a, lda, B, ldb, beta, C + int64_t(s0) * ldc,
                    ldc);
      } else {
        const float* b = trans_b ? B + int64_t(s0) * ldb : B + s0;
        cblas_sgemm(CblasRowMajor, ta, tb, M, s1 - s0, K, alpha, A, lda, b, ldb, beta, C + s0, ldc);
      }
    }
  }
}

void matmul_forward(float* out, const float* in, const float* w, const float* bias, int N, int C, int OC) {
  if (N == 1 && !omp_in_parallel()) {
    // One row (a decoding step): a matrix-vector product, bound by reading the weights once. sgemm's
    // panels are made for many rows and stream the weights at half the memory bandwidth; sgemv over
    // each thread's output rows reads them at its full rate.
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int per = ((OC + nt - 1) / nt + 15) / 16 * 16;
      const int o0 = std::min(OC, id * per), o1 = std::min(OC, o0 + per);
      if (o1 > o0) {
        if (bias != nullptr) std::copy(bias + o0, bias + o1, out + o0);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, o1 - o0, C, 1.0f, w + int64_t(o0) * C, C, in, 1,
                    bias != nullptr ? 1.0f : 0.0f, out + o0, 1);
      }
    }
    return;
  }
  sgemm(false, true, N, OC, C, 1.0f, in, C, w, C, 0.0f, out, OC);
  if (bias != nullptr) add_bias(out, bias, N, OC);
}

void add_bias(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* o = out + r * OC;
#pragma omp simd
    for (int j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

void bias_backward(float* dbias, const float* dout, int N, int OC) {
  // Threads own column ranges (no reduction between threads, deterministic).
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int per = ((OC + nt - 1) / nt + 15) / 16 * 16;
    const int j0 = id * per < OC ? id * per : OC, j1 = j0 + per < OC ? j0 + per : OC;
    for (int64_t r = 0; r < N; ++r) {
      const float* d = dout + r * OC;
#pragma omp simd
      for (int j = j0; j < j1; ++j) dbias[j] += d[j];
    }
  }
}

void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                     int N, int C, int OC) {
  if (din != nullptr) sgemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, din, C);
  if (dw != nullptr) sgemm(true, false, OC, C, N, 1.0f, dout, OC, in, C, 1.0f, dw, C);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

}  // namespace forge::trainer::cpu
