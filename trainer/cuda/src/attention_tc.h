// The BF16 attention on tensor cores, which attention.cu dispatches to: same arguments and results as its
// CUDA-core kernels. attention_mma.cu (mma.sync, scores in registers) takes head dims 32 and 64;
// attention_wmma.cu (WMMA, scores in shared memory) takes 32, 64 and 128. Each returns false, launching
// nothing, when it cannot run the shape (head dim, or a tensor not 16-byte aligned).
#pragma once

#include <cuda_bf16.h>

namespace forge::trainer::cuda {

bool attention_forward_mma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                           int NH);
bool attention_forward_wmma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                            int NH);
// `D`: the per-row dot(dout, out), B*NH*T floats, already computed.
bool attention_backward_mma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                            const __nv_bfloat16* qkv, const float* lse, int B, int T_, int C, int NH);
bool attention_backward_wmma(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                             const __nv_bfloat16* qkv, const float* lse, int B, int T_, int C, int NH);

}  // namespace forge::trainer::cuda
