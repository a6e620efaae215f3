// Matrix products through cuBLASLt: FP32 accumulation always; BF16 or FP32 inputs; outputs in the input
// type or FP32. Row-major [rows, cols] matrices are cuBLAS's column-major [cols, rows], so each product is
// issued transposed (C^T = B^T A^T). The algorithm the heuristic picks is cached per shape.
#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>

namespace forge::trainer::cuda {

namespace {

template <class T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

void check_lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    int device = -1;
    cudaGetDevice(&device);
    fail(ExitCode::kComm, "CUDA device {} rank {}: {} failed: {}", device, error_rank(), call,
         cublasLtGetStatusString(status));
  }
}

// The largest power of two (<= 256) dividing the address: cuBLASLt algorithms assume 256-byte aligned
// operands unless told otherwise, and parameter views and row chunks are not always that aligned.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct GemmKey {
  bool ta, tb;
  int m, n, k, lda, ldb, ldd;
  cudaDataType_t ab, d;
  bool bias, accumulate;
  uint32_t align_a, align_b, align_d;
  auto tie() const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldd, ab, d, bias, accumulate, align_a, align_b, align_d);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

// Owns the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major D[m, n] = alpha op(A) op(B) + beta D (+ bias[m] broadcast over columns). Leading dimensions
// are the stored (untransposed) row counts.
void gemm(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb, void* D,
          int ldd, cudaDataType_t ab, cudaDataType_t d, bool accumulate, const void* bias) {
  auto* lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  Descs desc;
  check_lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
           "cublasLtMatmulDescSetAttribute (transa)");
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
           "cublasLtMatmulDescSetAttribute (transb)");
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check_lt(
        cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "cublasLtMatmulDescSetAttribute (epilogue)");
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "cublasLtMatmulDescSetAttribute (bias)");
  }
  check_lt(cublasLtMatrixLayoutCreate(&desc.a, ab, ta ? k : m, ta ? m : k, lda),
           "cublasLtMatrixLayoutCreate (A)");
  check_lt(cublasLtMatrixLayoutCreate(&desc.b, ab, tb ? n : k, tb ? k : n, ldb),
           "cublasLtMatrixLayoutCreate (B)");
  check_lt(cublasLtMatrixLayoutCreate(&desc.c, d, m, n, ldd), "cublasLtMatrixLayoutCreate (C)");

  size_t ws_bytes = 0;
  void* ws = gemm_workspace(&ws_bytes);
  static std::map<GemmKey, cublasLtMatmulAlgo_t> algos;
  const GemmKey key{
      ta,           tb,           m,           n, k, lda, ldb, ldd, ab, d, bias != nullptr, accumulate,
      alignment(A), alignment(B), alignment(D)};
  auto it = algos.find(key);
  if (it == algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                         sizeof(ws_bytes));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attr, value] : aligns)
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, desc.op, desc.a, desc.b, desc.c, desc.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) {
      int device = -1;
      cudaGetDevice(&device);
      fail(ExitCode::kComm, "CUDA device {} rank {}: cuBLASLt has no algorithm for a {}x{}x{} product",
           device, error_rank(), m, n, k);
    }
    it = algos.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(lt, desc.op, &alpha, A, desc.a, B, desc.b, &beta, D, desc.c, D, desc.c, &it->second,
                          ws, ws_bytes, stream()),
           "cublasLtMatmul");
}

}  // namespace

template <class T, class O>
void matmul_forward(O* out, const T* in, const T* w, const T* bias, int N, int C, int OC) {
  if (bias != nullptr && !std::is_same_v<T, O>)
    fail(ExitCode::kUsage, "CUDA matmul_forward: a bias needs the output in the input type");
  // out^T[OC, N] = w^T(stored [C, OC]) ^T x in^T[C, N]
  gemm(true, false, OC, N, C, w, C, in, C, out, OC, data_type<T>(), data_type<O>(), false, bias);
}

template <class T>
void matmul_backward(T* din, float* dw, float* dbias, const T* dout, const T* in, const T* w, int N, int C,
                     int OC) {
  // din^T[C, N] = w(stored [C, OC]) x dout^T[OC, N]
  if (din != nullptr)
    gemm(false, false, C, N, OC, w, C, dout, OC, din, C, data_type<T>(), data_type<T>(), false, nullptr);
  // dw^T[C, OC] += in^T[C, N] x dout[N, OC]
  gemm(false, true, C, OC, N, in, C, dout, OC, dw, C, data_type<T>(), CUDA_R_32F, true, nullptr);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

template void matmul_forward<float, float>(float*, const float*, const float*, const float*, int, int, int);
template void matmul_forward<bf16, bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int);
template void matmul_forward<bf16, float>(float*, const bf16*, const bf16*, const bf16*, int, int, int);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*, int,
                                     int, int);
template void matmul_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int, int,
                                    int);

}  // namespace forge::trainer::cuda
