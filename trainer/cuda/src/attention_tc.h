// The BF16 attention on tensor cores, which attention.cu dispatches to: same arguments and results as its
// CUDA-core kernels, for head dim HD; every tensor 16-byte aligned (attention.cu checks). attention_mma.cu
// (mma.sync, scores in registers) has HD 32 and 64; attention_wmma.cu (WMMA, scores in shared memory) has
// 32, 64 and 128.
#pragma once

#include <cuda_bf16.h>

namespace forge::trainer::cuda {

template <int HD>
void attention_forward_mma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                           int NH);
template <int HD>
void attention_forward_wmma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                            int NH);
// `D`: the per-row dot(dout, out), B*NH*T floats, already computed.
template <int HD>
void attention_backward_mma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                            const __nv_bfloat16* qkv, const float* lse, int B, int T_, int C, int NH);
template <int HD>
void attention_backward_wmma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                             const __nv_bfloat16* qkv, const float* lse, int B, int T_, int C, int NH);

}  // namespace forge::trainer::cuda
