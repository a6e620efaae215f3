// The kernels backend_kernels.cu (and context_attention.cu, sequence_kernels.cu) add for the CUDA backend
// (backend.cpp), private to it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace forge::trainer {
struct AttentionShape;  // backend.h
struct AttentionChunks;
struct ChunkRows;
}  // namespace forge::trainer

namespace forge::trainer::cuda {

struct HeadLayout;  // attention_tc.h

// The kernels backend_kernels.cu adds for the backend, one per op that ops.h has no exact match for. All
// pointers are device memory; arguments and semantics are those of the Backend op of the same name.
namespace seam {

void fill(float* x, float value, size_t n);
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int B, int T, int C, int vocab_begin, int vocab_end);
void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias, int N,
                      int C);
void add_bias(float* out, const float* bias, int N, int OC);
// The attention with everything the tensor-core kernels (ops.h) leave out: documents, any head dim up to
// 256; grouped-query heads and a sliding window as well.
void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                       const AttentionShape& shape);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* doc_start, int B, int T, const AttentionShape& shape);
void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                      const int32_t* pos, int rows, int max_len, const AttentionShape& shape);
// in: FP32, or BF16 bits (uint16_t)
template <class T>
void gather_rows(float* out, const T* in, const int32_t* index, const float* scale, int rows, int C);
void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k, int C,
                  bool accumulate);
void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k, int C);

// The loss ops in steps, so that the host can combine the row statistics over a VocabGroup in between.
// Cross-entropy: stats = [rows] maxima then [rows][2] (sum of exponentials, target logit); `row_loss`
// ([rows] doubles) receives each row's weighted loss, which the host sums.
void cross_entropy_max(float* mx, const float* logits, int rows, int V);
void cross_entropy_exp(float* sum_tgt, float* logits, const float* mx, const int32_t* targets, int rows,
                       int V, int vocab_begin);
void cross_entropy_finish(double* row_loss, float* nll, float* logits, const float* mx, const float* sum_tgt,
                          const int32_t* targets, const float* weights, int rows, int V, int vocab_begin,
                          float scale, bool backward);
// Distillation: mx [rows][2] (max z, max t), sums [rows][5] (S1, ST, SB, D, z[target]; cpu/distillation.cpp),
// row_loss [rows][2] (weighted loss, weighted KL).
void distillation_max(float* mx, const float* logits, const float* teacher, int rows, int V);
void distillation_sums(float* sums, const float* logits, float* teacher, const float* mx,
                       const int32_t* targets, const float* weights, int rows, int V, int vocab_begin,
                       float temperature);
void distillation_finish(double* row_loss, float* logits, const float* teacher, const float* mx,
                         const float* sums, const int32_t* targets, const float* weights, int rows, int V,
                         int vocab_begin, float temperature, float alpha, float scale, bool backward);

// The attention kernels' view of `shape`, checked (a head dim up to 256, query heads in whole groups): a
// usage error naming `op` otherwise.
HeadLayout head_layout(const AttentionShape& shape, const char* op);

void round_to_bf16(float* out, const float* in, size_t n);
void to_bf16(uint16_t* out, float* values, size_t n);
// As to_bf16, leaving `in` as it is (Backend::convert).
void narrow_bf16(uint16_t* out, const float* in, size_t n);
void from_bf16(float* out, const uint16_t* in, size_t n);
void scale(float* x, float factor, size_t n);

// Context parallelism (context_attention.cu): the chunk attention on CUDA cores in FP32, and the backward's
// delta.
void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse);
void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse, const float* delta,
                              ChunkRows dq, ChunkRows dk, ChunkRows dv);
void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                     const AttentionShape& shape);

// Sequence parallelism (sequence_kernels.cu): the weight gradients' terms of the norms' backward summed per
// chunk of kNormChunkRows rows into partial (overwritten: [chunks, C]; LayerNorm [chunks, 2C], the weight's
// then the bias's), din being the norms' backward kernels' (Backend::rmsnorm_backward_partials,
// layernorm_backward_partials); and Backend::add_chunk_sums.
void rmsnorm_chunk_partials(float* partial, const float* dout, const float* in, const float* rstd, int N,
                            int C);
void layernorm_chunk_partials(float* partial, const float* dout, const float* in, const float* mean,
                              const float* rstd, int N, int C);
void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride);

}  // namespace seam

}  // namespace forge::trainer::cuda
