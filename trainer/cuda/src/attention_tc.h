// The BF16 attention on tensor cores (attention_tc.cu), which attention.cu dispatches to: same arguments and
// results as its CUDA-core kernels. Each returns false, launching nothing, when it cannot run the shape (head
// dim not 32, 64 or 128, or a tensor not 16-byte aligned).
#pragma once

#include <cuda_bf16.h>

namespace forge::trainer::cuda {

bool attention_forward_tc(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                          int NH);
// `D`: the per-row dot(dout, out), B*NH*T floats, already computed.
bool attention_backward_tc(__nv_bfloat16* dqkv, const float* D, const __nv_bfloat16* dout,
                           const __nv_bfloat16* qkv, const float* lse, int B, int T_, int C, int NH);

}  // namespace forge::trainer::cuda
