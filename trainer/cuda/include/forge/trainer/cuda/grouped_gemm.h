// Grouped expert GEMMs for the Mixture-of-Experts layer (forge/trainer/moe.h, trainer/src/moe.cpp): the
// rows of each local expert are contiguous, rows [begin[e], begin[e + 1]) of the input, and expert e
// multiplies them by its own weight w_e = w + e x OC x C ([OC, C], PyTorch's Linear layout; w is
// [experts, OC, C]) and adds its own bias bias_e = bias + e x OC (bias [experts, OC]).
//
// Element types as in ops.h's matmul_forward / matmul_backward: T (float or bf16) for activations and
// working weights, FP32 accumulation, FP32 weight and bias gradients.
//
// How "grouped": one cuBLASLt product per expert that has rows (experts with none are skipped), queued back
// to back on the context's stream through gemm.cpp's matmul_forward / matmul_backward, so the grouped
// products share their cuBLASLt handle, workspace, per-shape algorithm cache and epilogues (bias in the
// forward product, the bias gradient from the weight-gradient product where cuBLASLt has BGRADB). Why not
// one call: cuBLASLt has no grouped matmul that every CUDA 12.x release ships, and the group sizes are on
// the host anyway (the router runs there, moe.cpp), so per-expert launches cost no synchronization. The
// cost is one launch per expert and one heuristic query per new group size (the algorithm cache is keyed
// by shape; it is bounded by the distinct row counts seen). The next step is a device-side grouped kernel
// (CUTLASS grouped GEMM) reading the sizes from the device; cuBLAS's (not cuBLASLt's) host-sized
// cublasGemmGroupedBatchedEx, from 12.5 on, would only save the launches.
//
// `begin_host`: experts + 1 non-decreasing host row offsets, begin_host[0] >= 0 (rows before
// begin_host[0] and from begin_host[experts] on are not touched). All other pointers are device memory.
#pragma once

#include "forge/trainer/cuda/ops.h"

namespace forge::trainer::cuda {

// out_e = in_e @ w_e^T (+ bias_e if bias is not null, in the output's type), per expert e:
// out_e, in_e are rows [begin_host[e], begin_host[e + 1]) of out [rows, OC] and in [rows, C].
template <class T, class O>
void grouped_matmul_forward(O* out, const T* in, const T* w, const O* bias, const int* begin_host,
                            int experts, int C, int OC);

// Per expert e, over its rows: din_e = dout_e @ w_e (overwrites; skipped if din is null);
// dw_e += dout_e^T @ in_e; dbias_e += column sums of dout_e (if dbias is not null). dw: [experts, OC, C],
// dbias: [experts, OC], FP32. An expert without rows leaves its dw_e and dbias_e as they are.
template <class T>
void grouped_matmul_backward(T* din, float* dw, float* dbias, const T* dout, const T* in, const T* w,
                             const int* begin_host, int experts, int C, int OC);

}  // namespace forge::trainer::cuda
