// Matrix products through cuBLASLt: FP32 accumulation always; BF16 or FP32 inputs; outputs in the input
// type or FP32. Row-major [rows, cols] matrices are cuBLAS's column-major [cols, rows], so each product is
// issued transposed (C^T = B^T A^T). The algorithm the heuristic picks is cached per shape.
#include "backend_kernels.h"
#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
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

// What the product's epilogue does beyond D = alpha op(A) op(B) + beta D (cublasLtEpilogue_t).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS, GELU_AUX_BIAS: the bias read; BGRADB: the bias gradient written
  const void* aux = nullptr;   // GELU_AUX_BIAS: the GELU input written; DGELU: the GELU input read
  int64_t aux_ld = 0;
};

struct GemmKey {
  bool ta, tb;
  int m, n, k, lda, ldb, ldd;
  cudaDataType_t ab, d;
  cublasLtEpilogue_t epilogue;
  bool accumulate;
  uint32_t align_a, align_b, align_d, align_aux;
  auto tie() const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldd, ab, d, epilogue, accumulate, align_a, align_b, align_d,
                    align_aux);
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

template <class V>
void set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& value,
              const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)), what);
}

// The fused GELU and bias-gradient epilogues are used where cuBLASLt has them; FORGE_CUDA_GEMM_FUSION=off
// turns them off (the separate kernels then run), for comparing the two.
bool fusion_enabled() {
  const char* env = std::getenv("FORGE_CUDA_GEMM_FUSION");
  return env == nullptr || std::string_view(env) != "off";
}

// Column-major D[m, n] = alpha op(A) op(B) + beta D, then the epilogue (a bias has m entries, broadcast over
// columns). Leading dimensions are the stored (untransposed) row counts. Returns false, having done
// nothing, when cuBLASLt has no algorithm for a fused GELU or bias-gradient epilogue, or for a bias with
// `optional_bias` (the caller then runs the separate kernels); a plain product or bias without an algorithm
// is an error.
bool gemm(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb, void* D,
          int ldd, cudaDataType_t ab, cudaDataType_t d, bool accumulate, const Epilogue& ep = {},
          bool optional_bias = false) {
  const bool optional =
      ep.kind != CUBLASLT_EPILOGUE_DEFAULT && (ep.kind != CUBLASLT_EPILOGUE_BIAS || optional_bias);
  if (optional && !fusion_enabled()) return false;
  auto* lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  Descs desc;
  check_lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, opa, "cublasLtMatmulDescSetAttribute (transa)");
  set_attr(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, opb, "cublasLtMatmulDescSetAttribute (transb)");
  if (ep.kind != CUBLASLT_EPILOGUE_DEFAULT)
    set_attr(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, ep.kind, "cublasLtMatmulDescSetAttribute (epilogue)");
  if (ep.bias != nullptr)
    set_attr(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ep.bias, "cublasLtMatmulDescSetAttribute (bias)");
  if (ep.aux != nullptr) {
    set_attr(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ep.aux,
             "cublasLtMatmulDescSetAttribute (aux)");
    set_attr(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ep.aux_ld,
             "cublasLtMatmulDescSetAttribute (aux ld)");
  }
  check_lt(cublasLtMatrixLayoutCreate(&desc.a, ab, ta ? k : m, ta ? m : k, lda),
           "cublasLtMatrixLayoutCreate (A)");
  check_lt(cublasLtMatrixLayoutCreate(&desc.b, ab, tb ? n : k, tb ? k : n, ldb),
           "cublasLtMatrixLayoutCreate (B)");
  check_lt(cublasLtMatrixLayoutCreate(&desc.c, d, m, n, ldd), "cublasLtMatrixLayoutCreate (C)");

  size_t ws_bytes = 0;
  void* ws = gemm_workspace(&ws_bytes);
  // The algorithm per shape; an empty entry remembers that a fused epilogue has none.
  static std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> algos;
  const GemmKey key{ta,
                    tb,
                    m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldd,
                    ab,
                    d,
                    ep.kind,
                    accumulate,
                    alignment(A),
                    alignment(B),
                    alignment(D),
                    ep.aux ? alignment(ep.aux) : 256};
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
    if (optional && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
      algos.emplace(key, std::nullopt);
      return false;
    }
    check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) {
      int device = -1;
      cudaGetDevice(&device);
      fail(ExitCode::kComm, "CUDA device {} rank {}: cuBLASLt has no algorithm for a {}x{}x{} product",
           device, error_rank(), m, n, k);
    }
    it = algos.emplace(key, result.algo).first;
  }
  if (!it->second) return false;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cublasStatus_t st = cublasLtMatmul(lt, desc.op, &alpha, A, desc.a, B, desc.b, &beta, D, desc.c, D,
                                           desc.c, &*it->second, ws, ws_bytes, stream());
  if (optional && st != CUBLAS_STATUS_SUCCESS) {  // refused at validation: nothing was launched
    it->second.reset();
    return false;
  }
  check_lt(st, "cublasLtMatmul");
  return true;
}

// The bias gradient a BGRADB epilogue writes (it cannot add to the gradient being accumulated): one
// buffer per process, grown to the widest layer.
float* bias_grad_scratch(int n) {
  static DeviceBuffer buffer;
  if (buffer.bytes() < sizeof(float) * size_t(n)) {
    synchronize();  // the smaller buffer may still be read by a queued add_to
    buffer = DeviceBuffer(sizeof(float) * size_t(n));
  }
  return buffer.as<float>();
}

}  // namespace

template <class T, class O>
void matmul_forward(O* out, const T* in, const T* w, const O* bias, int N, int C, int OC) {
  // out^T[OC, N] = w^T(stored [C, OC]) ^T x in^T[C, N]; cuBLASLt reads the bias in the output's type. With
  // BF16 operands and an FP32 output (the CUDA backend's BF16 products) the bias epilogue may have no
  // algorithm: then the plain product and a separate pass.
  constexpr bool mixed = !std::is_same_v<T, O>;
  if (bias != nullptr && gemm(true, false, OC, N, C, w, C, in, C, out, OC, data_type<T>(), data_type<O>(),
                              false, {CUBLASLT_EPILOGUE_BIAS, bias}, mixed))
    return;
  gemm(true, false, OC, N, C, w, C, in, C, out, OC, data_type<T>(), data_type<O>(), false);
  if constexpr (mixed)
    if (bias != nullptr) seam::add_bias(out, bias, N, OC);
}

template <class T>
void matmul_bias_gelu_forward(T* out, T* pre, const T* in, const T* w, const T* bias, int N, int C, int OC) {
  if (gemm(true, false, OC, N, C, w, C, in, C, out, OC, data_type<T>(), data_type<T>(), false,
           {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre, OC}))
    return;
  matmul_forward<T, T>(pre, in, w, nullptr, N, C, OC);
  bias_gelu_forward<T>(out, pre, bias, N, OC);
}

template <class T, class O>
void matmul_backward(O* din, float* dw, float* dbias, const T* dout, const T* in, const T* w, int N, int C,
                     int OC, const T* gelu_pre) {
  // din^T[C, N] = w(stored [C, OC]) x dout^T[OC, N], times GELU'(gelu_pre) if given
  if (din != nullptr) {
    constexpr bool same = std::is_same_v<T, O>;
    bool fused = false;
    if constexpr (same)
      fused =
          gelu_pre != nullptr && gemm(false, false, C, N, OC, w, C, dout, OC, din, C, data_type<T>(),
                                      data_type<T>(), false, {CUBLASLT_EPILOGUE_DGELU, nullptr, gelu_pre, C});
    else if (gelu_pre != nullptr)
      usage_fail("CUDA matmul_backward: the GELU gradient needs din in the input type");
    if (!fused) {
      gemm(false, false, C, N, OC, w, C, dout, OC, din, C, data_type<T>(), data_type<O>(), false);
      if constexpr (same)
        if (gelu_pre != nullptr) gelu_backward<T>(din, gelu_pre, N, C);
    }
  }
  if (dw == nullptr) {  // a frozen weight (and so its bias): only din is wanted
    if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
    return;
  }
  // dw^T[C, OC] += in^T[C, N] x dout[N, OC]; the bias gradient (column sums of dout) from the same pass
  // over dout where cuBLASLt can (BGRADB reduces B = dout over k = N).
  float* bgrad = dbias != nullptr ? bias_grad_scratch(OC) : nullptr;
  if (dbias != nullptr && gemm(false, true, C, OC, N, in, C, dout, OC, dw, C, data_type<T>(), CUDA_R_32F,
                               true, {CUBLASLT_EPILOGUE_BGRADB, bgrad})) {
    add_to(dbias, bgrad, OC);
    return;
  }
  gemm(false, true, C, OC, N, in, C, dout, OC, dw, C, data_type<T>(), CUDA_R_32F, true);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

template void matmul_forward<float, float>(float*, const float*, const float*, const float*, int, int, int);
template void matmul_forward<bf16, bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int);
template void matmul_forward<bf16, float>(float*, const bf16*, const bf16*, const float*, int, int, int);
template void matmul_bias_gelu_forward<float>(float*, float*, const float*, const float*, const float*, int,
                                              int, int);
template void matmul_bias_gelu_forward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, int, int,
                                             int);
template void matmul_backward<float, float>(float*, float*, float*, const float*, const float*, const float*,
                                            int, int, int, const float*);
template void matmul_backward<bf16, bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int,
                                          int, int, const bf16*);
template void matmul_backward<bf16, float>(float*, float*, float*, const bf16*, const bf16*, const bf16*, int,
                                           int, int, const bf16*);

}  // namespace forge::trainer::cuda
