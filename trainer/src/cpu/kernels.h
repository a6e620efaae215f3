// CPU kernels of the GPT, one op per file with its backward next to its forward. Activations are flat
// row-major [rows, channels] with rows = batch * time. Backward kernels add into parameter gradients;
// what they do to input gradients is stated per kernel. Threads: one OpenMP team, split over rows, heads
// or channels for the memory-bound ops and over output panels for the matrix products (sgemm below).
#pragma once

#include "forge/trainer/backend.h"

#include <bit>
#include <cstdint>
#include <span>

namespace forge::trainer::cpu {

// ---- embedding.cpp ----
// out[b,t,:] = wte[tokens[b,t],:] + wpe[p,:] with p = positions[b,t] (null: t). Vocabulary-parallel: this
// rank holds rows [vocab_begin, vocab_end) of the table (wte points at row vocab_begin); other tokens
// contribute zeros, and wpe may be null (one rank of the group adds it) so that the sum over the group is
// the full embedding.
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin = 0, int vocab_end = 1 << 30);
// dwte[tokens[b,t],:] += dout[b,t,:] (rows this rank holds); dwpe[p,:] += dout[b,t,:] (dwpe may be null)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int B, int T, int C, int vocab_begin = 0,
                        int vocab_end = 1 << 30);

// ---- layernorm.cpp ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, float eps, int N, int C);
// din += dL/din (accumulates: the residual stream's gradient); dweight, dbias +=.
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
// Backend::layernorm_backward_partials: partial [row_chunks(N), 2C], the weight's terms then the bias's.
void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* mean, const float* rstd, int N, int C);

// ---- residual.cpp ----
// The residual add fused with the LayerNorm that always follows it:
// res_out = res_in + delta + delta_bias (null: none); ln_out = LayerNorm(res_out). Its backward is the
// identity on the residual stream plus layernorm_backward (which accumulates into the stream's gradient).
void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd, const float* res_in,
                                const float* delta, const float* delta_bias, const float* weight,
                                const float* bias, float eps, int N, int C);

// res_out = res_in + delta + delta_bias (null: none; a residual add with no LayerNorm after it: a pipeline
// stage's last block hands the stream to the next stage, which owns that LayerNorm).
void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias, int N,
                      int C);

// ---- matmul.cpp ---- (weights in PyTorch's Linear layout [OC, C])
// Row-major C = alpha op(A) op(B) + beta C on all threads: OpenMP splits C into row or column panels,
// one single-threaded OpenBLAS call each (inside an OpenMP region: one call on the calling thread).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);
// out = in @ w^T (+ bias if not null)
void matmul_forward(float* out, const float* in, const float* w, const float* bias, int N, int C, int OC);
// din = dout @ w (overwrites; skipped if null); dw += dout^T @ in; dbias += column sums of dout (if not null)
void matmul_backward(float* din, float* dw, float* dbias, const float* dout, const float* in, const float* w,
                     int N, int C, int OC);
// out[i, j] += bias[j]
void add_bias(float* out, const float* bias, int N, int OC);
// dbias[j] += sum_i dout[i, j]
void bias_backward(float* dbias, const float* dout, int N, int OC);

// ---- attention.cpp ---- causal grouped-query attention on the fused qkv rows [B*T, shape.qkv_width()]
// (Backend::attention_forward: q | k | v, query head h reading key/value head h / (heads / kv_heads)).
// out: [B*T, shape.q_width()]. A query at position t of row b sees keys [doc_start[b*T + t], t] (doc_start
// null: [0, t]), the last shape.window of them when window > 0. Keeps only the row log-sum-exp lse
// [B, heads, T] for backward; scores are recomputed there, in row blocks, in per-thread scratch.
void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                       const AttentionShape& shape);
// dqkv = gradient of the attention inputs (overwrites).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* doc_start, int B, int T, const AttentionShape& shape);

// ---- context_attention.cpp ---- one chunk's queries over another chunk's keys and values, merged into
// the running (out, lse) (Backend::attention_chunk_forward); and its share of the gradients, added.
void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse);
void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse, const float* delta,
                              ChunkRows dq, ChunkRows dk, ChunkRows dv);
void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                     const AttentionShape& shape);

// Incremental decoding: writes the key and value heads of `rows` new positions (row r: sequence seq[r],
// position pos[r]) into the caches [sequences, max_len, kv_width], then attends each row's query over its
// sequence's positions [0, pos[r]] (the last `window`) (Backend::attention_decode).
void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                      const int32_t* pos, int rows, int max_len, const AttentionShape& shape);

// ---- rope.cpp ---- rotary positions in place on the q and k heads of qkv rows (Backend::rope).
void rope(float* qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
          const AttentionShape& shape, bool inverse);

// ---- rmsnorm.cpp ---- (Backend::rmsnorm_forward, ...)
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, float eps, int N, int C);
// din += dL/din; dweight +=.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int N, int C);
// Backend::rmsnorm_backward_partials and Backend::add_chunk_sums (row_chunks.h).
void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                               const float* weight, const float* rstd, int N, int C);
void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride);
// res_out = res_in + delta + delta_bias (null: none); out = RMSNorm(res_out).
void residual_rmsnorm_forward(float* res_out, float* out, float* rstd, const float* res_in,
                              const float* delta, const float* delta_bias, const float* weight, float eps,
                              int N, int C);
// Per-head RMSNorm of the q and k heads of qkv rows, in place (Backend::head_rmsnorm_forward).
void head_rmsnorm_forward(float* qkv, float* saved, float* rstd, const float* q_weight, const float* k_weight,
                          float eps, int N, const AttentionShape& shape);
void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                           const float* rstd, const float* q_weight, const float* k_weight, int N,
                           const AttentionShape& shape);

// ---- swiglu.cpp ---- in [N, 2H] = gate | up per row; out [N, H] = silu(gate) x up.
void swiglu_forward(float* out, const float* in, int N, int H);
// din [N, 2H] (overwrites) from dout [N, H].
void swiglu_backward(float* din, const float* dout, const float* in, int N, int H);

// ---- moe.cpp ---- (Backend's gather_rows, combine_rows, row_dots)
void gather_rows(float* out, const float* in, const int32_t* index, const float* scale, int rows, int C);
void gather_rows(float* out, const uint16_t* in, const int32_t* index, const float* scale, int rows, int C);
void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k, int C,
                  bool accumulate);
void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k, int C);

// ---- gelu.cpp ---- (tanh approximation, as GPT-2)
// pre += bias (row-wise); out = gelu(pre). `pre` keeps the biased pre-activation for backward.
void bias_gelu_forward(float* out, float* pre, const float* bias, int N, int C);
// dinout: dL/d(out) in, dL/d(pre) out.
void gelu_backward(float* dinout, const float* pre, int N, int C);

// ---- cross_entropy.cpp ---- Backend::cross_entropy (backend.h): softmax cross-entropy of a chunk of
// logits, with the softmax statistics combined over `group` when the vocabulary is split.
double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                     int vocab_begin, float scale, bool backward, VocabGroup* group, float* nll = nullptr);

// ---- distillation.cpp ---- Backend::distillation (backend.h): cross-entropy plus KL divergence from a
// teacher's logits, combined over `group` like cross_entropy; `teacher` is overwritten (scratch).
double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights, int rows,
                    int V, int vocab_begin, float temperature, float alpha, float scale, bool backward,
                    VocabGroup* group, double* kl_sum);

// ---- optimizer.cpp ---- the optimizer's element-wise passes over ranges of the flat buffers, each in one
// parallel region.
double sum_squares(const float* x, std::span<const FlatRange> ranges);
void scale(float* x, float factor, std::span<const FlatRange> ranges);
void adamw(float* w, const float* g, float* m, float* v, std::span<const AdamWSegment> segments,
           const AdamWStep& step);

// ---- bf16 storage (bf16.cpp) ----
// Rounds each value to the nearest BF16 (ties to even), keeping it in an fp32 container.
void round_to_bf16(float* data, int64_t n);
void round_to_bf16(float* out, const float* in, int64_t n);
// Rounds `values` in place as above and stores them as 2-byte BF16 in `out` (one pass); and back (exact).
void to_bf16(uint16_t* out, float* values, int64_t n);
void to_bf16(uint16_t* out, const float* values, int64_t n);  // leaves `values` as they are
void from_bf16(float* out, const uint16_t* in, int64_t n);
// One BF16 value as fp32 (exact).
inline float widen(uint16_t bf16) {
  return std::bit_cast<float>(uint32_t(bf16) << 16);
}

}  // namespace forge::trainer::cpu
