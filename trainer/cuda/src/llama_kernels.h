// The kernels of the Llama-family blocks (llama_kernels.cu), private to the CUDA backend (backend.cpp):
// RMSNorm (plain and fused with the residual add), Qwen 3's per-head RMSNorm of q and k, SwiGLU and rotary
// positions. Arguments and semantics are those of the Backend op of the same name (backend.h); all pointers
// are device memory. `T`, `I`, `O`: float or bf16 storage of the activations an op takes as Act; math in
// FP32, each BF16 value written rounded once, to nearest even.
#pragma once

#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <cstdint>

namespace forge::trainer::cuda::llama {

template <class O>
void rmsnorm_forward(O* out, float* rstd, const float* in, const float* weight, float eps, int N, int C);
// delta_bias may be null.
template <class O>
void residual_rmsnorm_forward(float* res_out, O* out, float* rstd, const float* res_in, const float* delta,
                              const float* delta_bias, const float* weight, float eps, int N, int C);
// din += dL/din; dweight +=, summed deterministically: per-block partials (in `scratch`, grown as needed)
// added in block order by a second kernel.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int N, int C, DeviceBuffer& scratch);

template <class T>
void head_rmsnorm_forward(T* qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                          float eps, int N, const AttentionShape& shape);
void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                           const float* rstd, const float* q_weight, const float* k_weight, int N,
                           const AttentionShape& shape, DeviceBuffer& scratch);

template <class I, class O>
void swiglu_forward(O* out, const I* in, int N, int H);
template <class I>
void swiglu_backward(float* din, const float* dout, const I* in, int N, int H);

template <class T>
void rope(T* qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T_,
          const AttentionShape& shape, bool inverse);

}  // namespace forge::trainer::cuda::llama
