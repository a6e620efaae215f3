// The backend seam (docs/ARCHITECTURE.md, "Backends"): where the model's buffers live and how its ops run.
// One model (model.h) and one trainer (parallel.h) are written against this interface; the CPU backend
// implements it over OpenMP and OpenBLAS (trainer/src/cpu/), a GPU backend over its own kernels and
// device memory.
//
// Every op takes pointers into memory the same backend allocated (device memory for a GPU backend, where
// the host must go through copy_to_host / copy_from_host). Activations are flat row-major
// [rows, channels] with rows = batch x time; weights are [out, in] as PyTorch's Linear. Backward ops add
// into parameter gradients; what they do to input gradients is stated per op. The activations that the
// model's BF16 mode stores as 2-byte BF16 reach the ops as Act / ConstAct; everything else is FP32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace forge::trainer {

// The rows of one partial sum of a norm's weight gradients (Backend::rmsnorm_backward_partials).
inline constexpr int kNormChunkRows = 32;
// Floats in a page of host memory (4 KiB): ZeRO-2/3 align every rank's part of a layer's parameters to a
// backend's release_floats() so that Backend::release hands back whole pages.
inline constexpr size_t kReleaseFloats = 1024;
// The same on a GPU: CUDA maps device memory in granules of 2 MiB, which hold 1M BF16 values (the BF16
// copy of the weights is released with them) or 512K FP32 ones.
inline constexpr size_t kDeviceReleaseFloats = size_t{1} << 20;

// Activations in a backend's memory, FP32 or 2-byte BF16 (bit patterns, uint16_t): the operands of the
// matrix products and of the attention, which the model's BF16 mode stores as BF16 (model.h) so that a
// GPU reads and writes half the bytes and its tensor cores take them as they are. A float or uint16_t
// pointer converts to one. An op computes in FP32 from what it reads and rounds each value it writes to
// BF16 once, to nearest even: on the CPU the same values as rounding an FP32 result afterwards.
struct Act {
  void* data = nullptr;
  bool bf16 = false;
  Act() = default;
  Act(float* values) : data(values) {}
  Act(uint16_t* values) : data(values), bf16(true) {}
  // The FP32 values; an op that has no BF16 form asks for them.
  float* f32() const {
    if (bf16) throw std::logic_error("an op that takes FP32 activations was given BF16 ones");
    return static_cast<float*>(data);
  }
};
struct ConstAct {
  const void* data = nullptr;
  bool bf16 = false;
  ConstAct() = default;
  ConstAct(const float* values) : data(values) {}
  ConstAct(const uint16_t* values) : data(values), bf16(true) {}
  ConstAct(Act a) : data(a.data), bf16(a.bf16) {}
  const float* f32() const {
    if (bf16) throw std::logic_error("an op that takes FP32 activations was given BF16 ones");
    return static_cast<const float*>(data);
  }
};

// Memory of one backend; released with the object.
class Allocation {
 public:
  virtual ~Allocation() = default;
  virtual void* data() = 0;
};

// A fixed-size, zero-initialised typed array in a backend's memory. Move-only.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::unique_ptr<Allocation> memory, size_t size) : memory_(std::move(memory)), size_(size) {}
  T* data() { return memory_ ? static_cast<T*>(memory_->data()) : nullptr; }
  const T* data() const { return memory_ ? static_cast<const T*>(memory_->data()) : nullptr; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // A span over the elements: host-readable only on a backend with host memory.
  std::span<T> span() { return {data(), size_}; }
  std::span<const T> span() const { return {data(), size_}; }

 private:
  std::unique_ptr<Allocation> memory_;
  size_t size_ = 0;
};

// Combines per-row softmax statistics across the ranks that hold the shards of a split vocabulary
// (VocabParallelCrossEntropy, tensor_parallel.h). Called inside the cross-entropy op, on its buffers.
class VocabGroup {
 public:
  virtual ~VocabGroup() = default;
  virtual void max(float* values, int n) = 0;
  virtual void sum(float* values, int n) = 0;
};

// A range [lo, hi) of a flat buffer (the model's parameters, gradients).
struct FlatRange {
  size_t lo = 0, hi = 0;
};

// One step of AdamW over a stretch of the flat buffers (optimizer.h).
struct AdamWSegment {
  size_t lo = 0, hi = 0;  // flat range of weights and gradients
  size_t at = 0;          // where its moments start
  bool decay = true;
};
struct AdamWStep {
  float beta1 = 0, beta2 = 0, eps = 0;
  float step_size = 0;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^t)
  float keep = 1;          // 1 - lr * weight_decay, for segments that decay
};

// The heads of an attention layer (Backend::attention_forward), as one rank holds them: `heads` query
// heads share `kv_heads` key/value heads (grouped-query attention; kv_heads = heads is multi-head, 1 is
// multi-query), each head_dim wide, which need not be width / heads. window > 0: a query sees at most
// `window` keys, itself included (sliding-window attention); 0: all of its causal past. causal = false: a
// query sees every key of its sequence (a vision encoder's patches; no documents, no window).
struct AttentionShape {
  int heads = 0, kv_heads = 0, head_dim = 0;
  int window = 0;
  bool causal = true;
  int q_width() const { return heads * head_dim; }
  int kv_width() const { return kv_heads * head_dim; }
  int qkv_width() const { return q_width() + 2 * kv_width(); }
};

// Context parallelism's unit of attention (context_parallel.h): the query rows of one chunk of B sequences
// over the key/value rows of another chunk of the same sequences, n rows each. A chunk's row t is
// sequence index first + t; a query sees the keys at sequence indices up to its own, of its own document
// (same id in q_seg and k_seg; both null: one document), and of those the last shape.window when
// window > 0. Row t of sequence b of a chunk is at base + b * seq + t * ld; per-head row values (lse,
// delta) of query head h at stats + (b * heads + h) * stats_seq + t.
struct ChunkRows {
  float* base = nullptr;
  int64_t seq = 0;
  int ld = 0;
  float* row(int b, int t) const { return base + int64_t(b) * seq + int64_t(t) * ld; }
};
struct AttentionChunks {
  int B = 0, n = 0;
  AttentionShape shape;
  int q_first = 0, k_first = 0;
  ChunkRows q, k, v;  // k and v hold shape.kv_heads heads
  const int32_t *q_seg = nullptr, *k_seg = nullptr;
  int64_t seg_seq = 0;  // sequence b's ids at q_seg + b * seg_seq (likewise k_seg)
  int64_t stats_seq = 0;
};

class WeightGradQueue;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Whether the host can read and write the backend's buffers directly.
  virtual bool host_memory() const = 0;
  // Whether `p` points into memory of this backend that the host cannot read (device memory): what a
  // communicator that moves host memory must stage (staged_comm.h). Always false on a host backend.
  virtual bool device_memory(const void* p) const = 0;
  // A step's time on the device's clock: mark_step_start() before the step's first op, step_seconds() after
  // its last returns the seconds between the two on the device (CUDA events) once the queued work is done.
  // A host backend runs each op as it is called and has no device clock: negative (the caller times it).
  virtual void mark_step_start() {}
  virtual double step_seconds() { return -1; }
  // Device memory in use on the backend's device (every allocation on it, the libraries' workspaces
  // included), bytes; 0 on a host backend.
  virtual size_t device_bytes_in_use() const { return 0; }

  template <typename T>
  Buffer<T> alloc(size_t n) {
    return Buffer<T>(allocate(n * sizeof(T)), n);
  }
  // `buffer` holds at least n elements: a shorter one is replaced by a new zero-filled one (its values go).
  template <typename T>
  void grow(Buffer<T>& buffer, size_t n) {
    if (buffer.size() < n) buffer = alloc<T>(n);
  }
  virtual std::unique_ptr<Allocation> allocate(size_t bytes) = 0;  // zero-filled
  // Host memory that the host copies reach at full speed: page-locked on a GPU (checkpoint snapshots),
  // plain host memory by default.
  virtual std::unique_ptr<Allocation> allocate_host(size_t bytes);
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(float* x, float value, size_t n) = 0;
  // Hands the memory of [x, x + n) back while keeping its addresses (ZeRO-2 and -3 release the gradients
  // and weights a rank does not own between uses): nothing reads or writes the range again before
  // acquire(x', n') of a range covering what it touches, after which that reads as zeros. A host backend
  // returns its whole pages to the system and needs no acquire (a page comes back zeroed when touched); a
  // GPU unmaps its whole granules, which acquire maps again (fresh memory, zeroed); what is outside them
  // is zeroed in place, as is the whole range on a backend without the means.
  virtual void release(float* x, size_t n) { fill(x, 0.0f, n); }
  virtual void acquire(float* /*x*/, size_t /*n*/) {}
  // The floats of the unit release hands back whole (a range aligned to it loses all its memory).
  virtual size_t release_floats() const { return kReleaseFloats; }
  // Bytes of [x, x + n) that occupy memory now: the host's resident pages; all of them on a backend that
  // cannot tell.
  virtual size_t resident_bytes(const float* /*x*/, size_t n) const { return n * sizeof(float); }
  // A host copy of backend memory.
  template <typename T>
  std::vector<T> host_copy(std::span<const T> values) {
    std::vector<T> out(values.size());
    copy_to_host(out.data(), values.data(), values.size_bytes());
    return out;
  }

  // The model's BF16 mode (model.h): the inputs of every matrix product and of the attention are BF16
  // values, stored in 2 bytes (Act) or held in FP32 (the weights' working copy, the final LayerNorm's
  // output), except gradients. A backend may then multiply in BF16, rounding the gradients to BF16 as they
  // enter a product (the CUDA backend: BF16 tensor cores, as BF16 trainers do); the CPU backend keeps FP32.
  // Set by the trainer for the process's run.
  virtual void set_bf16_products(bool) {}
  // BF16 mode: [values, values + n) of a model's working copy of its weights (BF16 values held in FP32),
  // all of it or a part, was just written; the model calls this after every change to it. Until the next
  // call for those values, the matrix products' `w` operands that point into them may be read from a copy
  // the backend keeps in its own format (the CUDA backend: 2-byte BF16 for its tensor cores). The default
  // keeps none.
  virtual void bf16_working_copy(const float* /*values*/, size_t /*n*/) {}

  // ---- layers
  // out[r,:] = wte[tokens[r] - vocab_begin,:] + wpe[positions[r],:] for the vocabulary rows
  // [vocab_begin, vocab_end) this rank holds (others contribute zeros); wpe may be null (another rank
  // of the group adds it); positions null: r % T.
  virtual void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                                 const float* wte, const float* wpe, int B, int T, int C, int vocab_begin,
                                 int vocab_end) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                  const int32_t* positions, int B, int T, int C, int vocab_begin,
                                  int vocab_end) = 0;
  virtual void layernorm_forward(Act out, float* mean, float* rstd, const float* in, const float* weight,
                                 const float* bias, float eps, int N, int C) = 0;
  // din += dL/din (the residual stream's gradient accumulates); dweight, dbias += (both null: not formed).
  virtual void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout,
                                  const float* in, const float* weight, const float* mean, const float* rstd,
                                  int N, int C) = 0;
  // res_out = res_in + delta + delta_bias (null: none); ln_out = LayerNorm(res_out) (epsilon eps, as in
  // layernorm_forward: inside the square root, as PyTorch).
  virtual void residual_layernorm_forward(float* res_out, Act ln_out, float* mean, float* rstd,
                                          const float* res_in, const float* delta, const float* delta_bias,
                                          const float* weight, const float* bias, float eps, int N,
                                          int C) = 0;
  // res_out = res_in + delta + delta_bias (null: none).
  virtual void residual_forward(float* res_out, const float* res_in, const float* delta,
                                const float* delta_bias, int N, int C) = 0;
  // out = in @ w^T (+ bias if not null).
  virtual void matmul_forward(Act out, ConstAct in, const float* w, const float* bias, int N, int C,
                              int OC) = 0;
  // pre = in @ w^T + bias; out = gelu(pre) (tanh approximation) of pre before it is stored: the MLP's
  // first product with the bias add and GELU fused into it (cuBLASLt's GELU_AUX_BIAS epilogue). out and
  // pre are both FP32 or both BF16.
  virtual void matmul_bias_gelu_forward(Act out, Act pre, ConstAct in, const float* w, const float* bias,
                                        int N, int C, int OC) = 0;
  // din = dout @ w (overwrites; skipped if null); dw += dout^T @ in; dbias += column sums. A null dw or
  // dbias is not formed (a weight train.freeze leaves as it is); `in` is then not read.
  virtual void matmul_backward(float* din, float* dw, float* dbias, const float* dout, ConstAct in,
                               const float* w, int N, int C, int OC) = 0;
  // out[r,:] += bias.
  virtual void add_bias(float* out, const float* bias, int N, int OC) = 0;
  // Causal attention on the fused qkv rows [B*T, shape.qkv_width()] (q | k | v: shape.heads query heads,
  // then shape.kv_heads key and value heads, head h at columns h x head_dim of its part), out
  // [B*T, shape.q_width()], row log-sum-exp lse [B, heads, T]. Query head h reads key/value head
  // h / (heads / kv_heads) (grouped-query attention). A query at row position t sees keys
  // [doc_start[b*T + t], t] (its document; doc_start null: [0, t]), and of those at most shape.window, itself
  // included, when window > 0.
  virtual void attention_forward(Act out, float* lse, ConstAct qkv, const int32_t* doc_start, int B, int T,
                                 const AttentionShape& shape) = 0;
  // dqkv = gradient of the attention inputs (overwrites).
  virtual void attention_backward(float* dqkv, const float* dout, ConstAct qkv, ConstAct out,
                                  const float* lse, const int32_t* doc_start, int B, int T,
                                  const AttentionShape& shape) = 0;
  // Context parallelism (AttentionChunks): merges the attention of c's query chunk over its key chunk into
  // out ([rows, q_width] as c.q's rows) and lse, which hold the result over the key chunks merged so far
  // (0 and -inf before the first): out = the softmax-weighted mean over all of them, lse their log-sum-exp.
  // Row blocks with no visible key are skipped. FP32; a backend without it refuses context parallelism.
  virtual void attention_chunk_forward(const AttentionChunks& c, ChunkRows out, float* lse);
  // Adds this chunk pair's share of the gradients to dq, dk, dv, given the merged forward's out, lse and
  // delta = rowsum(dout * out) per head and row (stats layout).
  virtual void attention_chunk_backward(const AttentionChunks& c, ChunkRows dout, const float* lse,
                                        const float* delta, ChunkRows dq, ChunkRows dk, ChunkRows dv);
  // delta[(b * heads + h) * T + t] = the dot product of head h of out's and dout's row b * T + t (both
  // [B * T, q_width]): attention_chunk_backward's delta, summed over the head's values in order.
  virtual void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                               const AttentionShape& shape);
  // The rest of context parallelism's data movement, in the backend's memory: `rows` rows of `width`
  // values from src (a row every src_ld values) to dst (every dst_ld); and n activations converted (BF16
  // widened to FP32, FP32 rounded to BF16 to nearest even, or copied when both are alike).
  virtual void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int width,
                         int64_t rows);
  virtual void convert(Act out, ConstAct in, size_t n);
  // Incremental decoding (model.h, GPT::decode): `rows` new positions, row r being position pos[r] of
  // sequence seq[r]. Writes each row's key and value heads (from qkv [rows, qkv_width]) into k_cache and
  // v_cache ([sequences, max_len, kv_width]) at (seq[r], pos[r]), then out[r] = the attention of row r's
  // query over its sequence's cached positions [0, pos[r]] (the last `window` of them when window > 0): rows
  // of one sequence in one call see each other's keys.
  virtual void attention_decode(Act out, ConstAct qkv, float* k_cache, float* v_cache, const int32_t* seq,
                                const int32_t* pos, int rows, int max_len, const AttentionShape& shape) = 0;
  // Rotary positions, in place on the q and k heads of qkv rows ([N, shape.qkv_width()]), rotate-half
  // convention (the released Llama/Qwen/Mistral checkpoints'): within each head the pair (x[i],
  // x[i + head_dim/2]), i < head_dim/2, of the row at position p turns by p x inv_freq[i], and both are
  // multiplied by `magnitude` (YaRN's attention factor; 1 otherwise). positions[r] is row r's position
  // (null: r % T). inverse: turns by -angle (the backward, on the gradients of the rotated values).
  virtual void rope(Act qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
                    const AttentionShape& shape, bool inverse) = 0;
  // Per-head RMSNorm of the q and k heads of qkv rows, in place (Qwen 3's qk-norm): each head's head_dim
  // values x become x / rms(x) x w (q_weight for query heads, k_weight for key heads; eps inside the root).
  // Keeps each head's input in `saved` ([N, (heads + kv_heads) x head_dim], FP32) and 1 / rms in rstd
  // ([N, heads + kv_heads]) for the backward.
  virtual void head_rmsnorm_forward(Act qkv, float* saved, float* rstd, const float* q_weight,
                                    const float* k_weight, float eps, int N, const AttentionShape& shape) = 0;
  // In place on the q and k heads of dqkv: the gradient of the normed values becomes that of their inputs;
  // dq_weight, dk_weight += (both null: not formed).
  virtual void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                                     const float* rstd, const float* q_weight, const float* k_weight, int N,
                                     const AttentionShape& shape) = 0;
  // dinout: dL/d(out) in, dL/d(pre) out, for out = gelu(pre).
  virtual void gelu_backward(float* dinout, ConstAct pre, int N, int C) = 0;
  // SwiGLU on the fused gate | up product in ([N, 2H]: row = gate (H) | up (H)): out [N, H] =
  // silu(gate) x up.
  virtual void swiglu_forward(Act out, ConstAct in, int N, int H) = 0;
  // din [N, 2H] (overwrites) = the gradient of in from dout [N, H].
  virtual void swiglu_backward(float* din, const float* dout, ConstAct in, int N, int H) = 0;
  // RMSNorm over rows of C: out = in / sqrt(mean(in^2) + eps) x weight; rstd [N] keeps 1 / that root.
  virtual void rmsnorm_forward(Act out, float* rstd, const float* in, const float* weight, float eps, int N,
                               int C) = 0;
  // din += dL/din (the residual stream's gradient accumulates); dweight += (null: not formed).
  virtual void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in,
                                const float* weight, const float* rstd, int N, int C) = 0;
  // Sequence parallelism (a norm over this process's share of the rows): the *_backward ops, but the
  // weight gradients' terms summed per chunk of kNormChunkRows rows into partial ([chunks, C]; LayerNorm:
  // [chunks, 2C], the weight's terms then the bias's) instead of into the gradients. add_chunk_sums adds
  // `width` columns of `chunks` partials (row stride `stride`) to grad, in chunk order: the sum the
  // *_backward ops take, so the partials of consecutive rows gathered from a group give one process's
  // gradient bit for bit (grad null: adds nothing). FP32; a backend without them refuses sequence
  // parallelism.
  virtual void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                         const float* weight, const float* rstd, int N, int C);
  virtual void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                           const float* weight, const float* mean, const float* rstd, int N,
                                           int C);
  virtual void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride);
  // res_out = res_in + delta + delta_bias (delta_bias may be null); out = RMSNorm(res_out).
  virtual void residual_rmsnorm_forward(float* res_out, Act out, float* rstd, const float* res_in,
                                        const float* delta, const float* delta_bias, const float* weight,
                                        float eps, int N, int C) = 0;

  // ---- Mixture-of-Experts (moe.h): token rows to and from their experts
  // out[i,:] = scale[i] x in[index[i],:] for i < rows (scale null: 1).
  virtual void gather_rows(float* out, ConstAct in, const int32_t* index, const float* scale, int rows,
                           int C) = 0;
  // out[t,:] (accumulate: +=) sum over j < k with index[t*k+j] >= 0 of weight[t*k+j] x in[index[t*k+j],:]
  // (weight null: 1), for t < N; a token with no such j gets 0 (or keeps out[t,:]).
  virtual void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N,
                            int k, int C, bool accumulate) = 0;
  // dot[t*k+j] = <a[t,:], b[index[t*k+j],:]> (0 where index[t*k+j] < 0).
  virtual void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                        int C) = 0;

  // ---- the loss
  // Positions whose logits over `vocab` columns the classifier forms at once (the logits of all positions
  // never exist at once; layers.h): 256 by default (8 MiB at vocabulary 8192, within the caches' reach). A
  // device backend takes more: each chunk's loss is read back by the host.
  virtual int classifier_chunk_rows(int /*vocab*/) const { return 256; }
  // Softmax cross-entropy of a chunk of logits [rows, V] (vocabulary columns [vocab_begin, vocab_begin +
  // V) of a split vocabulary, combined through `group` when not null). Row i's loss is weighted by
  // weights[i] (null: 1); a target of MicroBatch::kIgnore weighs 0. Returns the weighted sum. When
  // `backward`, the logits are replaced by dL/dlogits of scale x that sum. `nll` (when not null, [rows])
  // receives each row's unweighted loss, 0 where it weighs 0.
  virtual double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                               int vocab_begin, float scale, bool backward, VocabGroup* group,
                               float* nll = nullptr) = 0;
  // Knowledge distillation of a chunk: row i's loss is alpha x T^2 x KL(softmax(teacher_i / T) ||
  // softmax(logits_i / T)) + (1 - alpha) x the cross-entropy of logits_i to targets[i] (T: temperature),
  // weighted as cross_entropy's; the teacher's logits are the same columns of the same positions.
  // Returns the weighted sum, and the weighted sum of the KL terms alone in *kl_sum (host memory, when
  // not null). When `backward`, the logits are replaced by dL/dlogits of scale x the sum; the teacher's
  // logits are overwritten either way.
  virtual double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights,
                              int rows, int V, int vocab_begin, float temperature, float alpha, float scale,
                              bool backward, VocabGroup* group, double* kl_sum) = 0;

  // ---- precision: out = in rounded to BF16 values, held in FP32
  virtual void round_to_bf16(float* out, const float* in, size_t n) = 0;

  // ---- the optimizer step
  // Sum of squares of x over the ranges, accumulated in double.
  virtual double sum_squares(const float* x, std::span<const FlatRange> ranges) = 0;
  virtual void scale(float* x, float factor, std::span<const FlatRange> ranges) = 0;
  virtual void adamw(float* weights, const float* grads, float* m, float* v,
                     std::span<const AdamWSegment> segments, const AdamWStep& step) = 0;

  // ---- a layer's product's backward
  // matmul_backward, or, while a queue is set (defer_weight_grads: a zero-bubble pipeline's input-gradient
  // pass), din now and dw, dbias queued for the queue's run() (the weight-gradient pass).
  void linear_backward(float* din, float* dw, float* dbias, const float* dout, ConstAct in, const float* w,
                       int N, int C, int OC);
  void defer_weight_grads(WeightGradQueue* queue) { deferred_ = queue; }

 private:
  WeightGradQueue* deferred_ = nullptr;
};

// Activations a backend holds for backward: n values, FP32 or (the model's BF16 mode) 2-byte BF16.
class ActBuffer {
 public:
  ActBuffer() = default;
  ActBuffer(Backend& backend, size_t n, bool bf16) : bf16_(bf16) {
    if (bf16)
      half_ = backend.alloc<uint16_t>(n);
    else
      full_ = backend.alloc<float>(n);
  }
  // The values from element i on.
  Act at(size_t i = 0) { return bf16_ ? Act(half_.data() + i) : Act(full_.data() + i); }
  size_t size() const { return full_.size() + half_.size(); }
  size_t bytes() const { return full_.size() * sizeof(float) + half_.size() * sizeof(uint16_t); }

 private:
  bool bf16_ = false;
  Buffer<float> full_;
  Buffer<uint16_t> half_;
};

// One micro-batch's weight gradients, formed after its input gradients (ZB-H1's W pass after its B
// pass): each product's dw and dbias with copies of what they read (dout, in), formed by run() in the
// order queued, each by the same matmul_backward call that would have formed them at once, so the sums
// are the same bit for bit. Its buffers are kept for the next micro-batch's products.
class WeightGradQueue {
 public:
  explicit WeightGradQueue(Backend& backend) : backend_(&backend) {}
  void add(float* dw, float* dbias, const float* dout, ConstAct in, int N, int C, int OC);
  void run();
  bool empty() const { return queued_ == 0; }
  size_t bytes() const;

 private:
  struct Product {
    float *dw = nullptr, *dbias = nullptr;
    int N = 0, C = 0, OC = 0;
    Buffer<float> dout;
    ActBuffer in;
  };
  Backend* backend_;
  std::vector<Product> products_;  // [0, queued_) wait for run(); the rest keep their buffers
  size_t queued_ = 0;
};

// The process's CPU backend.
Backend& cpu_backend();

}  // namespace forge::trainer
