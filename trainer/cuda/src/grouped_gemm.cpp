// Grouped expert GEMMs (grouped_gemm.h): one cuBLASLt product per expert with rows, through gemm.cpp's
// matmul_forward / matmul_backward, on the context's stream.
#include "forge/trainer/cuda/grouped_gemm.h"

#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cstdint>

namespace forge::trainer::cuda {

namespace {

// The group offsets must be a partition of a row range: a bad router or exchange would otherwise read
// and write out of bounds on the device.
void check_groups(const char* op, const int* begin_host, int experts, int C, int OC) {
  if (experts < 0 || C <= 0 || OC <= 0)
    fail(ExitCode::kUsage, "CUDA {}: needs experts >= 0, C > 0 and OC > 0 (got {}, {}, {})", op, experts, C,
         OC);
  if (experts > 0 && begin_host == nullptr) fail(ExitCode::kUsage, "CUDA {}: no group offsets", op);
  if (experts > 0 && begin_host[0] < 0)
    fail(ExitCode::kUsage, "CUDA {}: the first group starts at row {}", op, begin_host[0]);
  for (int e = 0; e < experts; ++e)
    if (begin_host[e + 1] < begin_host[e])
      fail(ExitCode::kUsage, "CUDA {}: expert {} has rows [{}, {})", op, e, begin_host[e], begin_host[e + 1]);
}

}  // namespace

template <class T, class O>
void grouped_matmul_forward(O* out, const T* in, const T* w, const O* bias, const int* begin_host,
                            int experts, int C, int OC) {
  check_groups("grouped_matmul_forward", begin_host, experts, C, OC);
  for (int e = 0; e < experts; ++e) {
    const int r0 = begin_host[e], n = begin_host[e + 1] - r0;
    if (n == 0) continue;
    matmul_forward<T, O>(out + int64_t(r0) * OC, in + int64_t(r0) * C, w + int64_t(e) * OC * C,
                         bias != nullptr ? bias + int64_t(e) * OC : nullptr, n, C, OC);
  }
}

template <class T>
void grouped_matmul_backward(T* din, float* dw, float* dbias, const T* dout, const T* in, const T* w,
                             const int* begin_host, int experts, int C, int OC) {
  check_groups("grouped_matmul_backward", begin_host, experts, C, OC);
  for (int e = 0; e < experts; ++e) {
    const int r0 = begin_host[e], n = begin_host[e + 1] - r0;
    if (n == 0) continue;
    matmul_backward<T>(din != nullptr ? din + int64_t(r0) * C : nullptr, dw + int64_t(e) * OC * C,
                       dbias != nullptr ? dbias + int64_t(e) * OC : nullptr, dout + int64_t(r0) * OC,
                       in + int64_t(r0) * C, w + int64_t(e) * OC * C, n, C, OC);
  }
}

template void grouped_matmul_forward<float, float>(float*, const float*, const float*, const float*,
                                                   const int*, int, int, int);
template void grouped_matmul_forward<bf16, bf16>(bf16*, const bf16*, const bf16*, const bf16*, const int*,
                                                 int, int, int);
template void grouped_matmul_forward<bf16, float>(float*, const bf16*, const bf16*, const float*, const int*,
                                                  int, int, int);
template void grouped_matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                             const int*, int, int, int);
template void grouped_matmul_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                            const int*, int, int, int);

}  // namespace forge::trainer::cuda
