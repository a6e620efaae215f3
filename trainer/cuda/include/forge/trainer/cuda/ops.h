// CUDA forward and backward of every op of the CPU trainer (trainer/src/cpu/kernels.h), with the same
// argument order and the same semantics, so that each can be checked 1:1 against its CPU op. All pointers
// are device memory; every call is queued on the context's stream (context.h).
//
// Element types: `T` is the activation and working-weight type, float (FP32 mode) or bf16 (BF16 mode).
// What stays FP32 in both modes, as in the CPU model: the residual stream and its gradient, LayerNorm
// statistics, the attention log-sum-exp, logits, parameter gradients and the optimizer state.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace forge::trainer {
struct AttentionShape;  // backend.h
}

namespace forge::trainer::cuda {

using bf16 = __nv_bfloat16;

// ---- kernels.cu ----
// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
template <class T>
void embedding_forward(float* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:]
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_,
                        int C);

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const float* in, const T* weight, const T* bias,
                       float eps, int N, int C);
// din += dL/din; dweight, dbias +=. din_t, if not null, receives the updated din as T (the copy of the
// residual gradient the next matrix product reads).
template <class T>
void layernorm_backward(float* din, T* din_t, float* dweight, float* dbias, const T* dout, const float* in,
                        const T* weight, const float* mean, const float* rstd, int N, int C);
// res_out = res_in + delta + delta_bias; ln_out = LayerNorm(res_out).
template <class T>
void residual_layernorm_forward(float* res_out, T* ln_out, float* mean, float* rstd, const float* res_in,
                                const float* delta, const T* delta_bias, const T* weight, const T* bias,
                                float eps, int N, int C);

// pre += bias (row-wise); out = gelu(pre), tanh approximation.
template <class T>
void bias_gelu_forward(T* out, T* pre, const T* bias, int N, int C);
// dinout: dL/d(out) in, dL/d(pre) out. P = bf16 with T = float: an FP32 gradient of BF16 activations.
template <class T, class P = T>
void gelu_backward(T* dinout, const P* pre, int N, int C);
// dbias[j] += sum_i dout[i, j]
template <class T>
void bias_backward(float* dbias, const T* dout, int N, int OC);

// out[i] = T(in[i])
template <class T>
void convert(T* out, const float* in, int64_t n);
// dst[i] += src[i]
void add_to(float* dst, const float* src, int64_t n);

// Cross-entropy rows of a logits chunk: losses[i] = logsumexp(row i) - row_i[target_i]; if dlogits is not
// null it receives grad_scale * (softmax(row i) - onehot(target_i)).
template <class T>
void cross_entropy_rows(T* dlogits, float* losses, const float* logits, const int32_t* targets, int rows,
                        int V, float grad_scale);

// AdamW on one parameter tensor (the update of forge::trainer::AdamW, with the clipping factor applied to
// the gradient first). `work`, when not null, receives the updated weights as T (the BF16 working copy).
template <class T>
void adamw_update(float* w, T* work, const float* g, float* m, float* v, size_t n, float grad_scale, float b1,
                  float b2, float eps, float keep, float step_size, float inv_sqrt_bc2);

// *out += sum of g[i]^2 (out: one device double, zeroed by the caller).
void sum_squares(double* out, const float* g, size_t n);

// ---- gemm.cpp (cuBLASLt; FP32 accumulation; weights in PyTorch's Linear layout [OC, C]) ----
// out = in @ w^T (+ bias if not null, in the output's type)
template <class T, class O>
void matmul_forward(O* out, const T* in, const T* w, const O* bias, int N, int C, int OC);
// out = gelu(pre), pre = in @ w^T + bias: matmul_forward and bias_gelu_forward in one product where
// cuBLASLt has the epilogue (pre is then rounded to T once, out computed from the unrounded value).
template <class T>
void matmul_bias_gelu_forward(T* out, T* pre, const T* in, const T* w, const T* bias, int N, int C, int OC);
// din = dout @ w (overwrites; skipped if null), times gelu'(gelu_pre) if gelu_pre is not null (the product
// fused with gelu_backward; din then in the input type); dw += dout^T @ in; dbias += column sums of dout
// (if not null)
template <class T, class O = T>
void matmul_backward(O* din, float* dw, float* dbias, const T* dout, const T* in, const T* w, int N, int C,
                     int OC, const T* gelu_pre = nullptr);

// ---- attention.cu ---- causal attention on the fused qkv rows [B*T, shape.qkv_width()] as
// Backend::attention_forward lays them out (grouped-query heads, a sliding window), without documents:
// tiled with an online softmax (FlashAttention-2's schedule; BF16 on tensor cores), no T x T matrix. Head
// dims 32, 64 and 128. out [B*T, shape.q_width()], lse [B, heads, T].
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, const AttentionShape& shape);
// dqkv = gradient of the attention inputs (overwrites). `scratch`: B * heads * T floats.
template <class T>
void attention_backward(T* dqkv, float* scratch, const T* dout, const T* qkv, const T* out, const float* lse,
                        int B, int T_, const AttentionShape& shape);

// ---- classifier.cpp ---- logits = x @ wte^T fused with cross-entropy, in chunks of rows (the logits of all
// rows never exist at once). Returns the sum of the per-row losses (synchronizes the stream). If dx is not
// null: dx = dL/dx (overwrites) and dwte += dL/dwte for L = grad_scale * sum of losses.
template <class T>
double classifier_forward_backward(T* dx, float* dwte, const T* x, const T* wte, const int32_t* targets,
                                   int N, int C, int V, float grad_scale);

}  // namespace forge::trainer::cuda
