// The CUDA backend's own kernels (backend.h, namespace seam): the ops whose Backend semantics the kernels of
// ops.h do not have (position ids, a vocabulary range, document masks, decode caches, MoE row moves, weighted
// and vocabulary-split losses, BF16 storage, ranges). Written to be read and checked against the CPU kernels
// (trainer/src/cpu/) line by line, not to be fast: one thread per element, one warp per row of a head, or one
// block per row of logits, in the CPU's order of operations wherever the result depends on it.
#include "attention_tc.h"
#include "backend_kernels.h"
#include "device_math.cuh"
#include "forge/common/batch.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/cuda/context.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace forge::trainer::cuda::seam {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kIgnore = MicroBatch::kIgnore;
// The attention kernels keep a head's vector in registers, kPerLane values per lane.
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

// Element-wise kernels stride over the grid, so a capped grid still covers any n.
int blocks_for(int64_t n) {
  return int(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16));
}
// One warp per item (kWarps items a block).
int warp_blocks(int64_t items) {
  return int((items + kWarps - 1) / kWarps);
}
__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}
__device__ __forceinline__ int64_t warp_item() {
  return int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
}
__device__ __forceinline__ int lane_id() {
  return int(threadIdx.x % 32);
}

// ---- memory, embedding, residual, bias

__global__ void fill_kernel(float* x, float value, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const int32_t* positions,
                                         const float* wte, const float* wpe, int T, int C, int vocab_begin,
                                         int vocab_end, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / C;
    const int c = int(i % C);
    const int32_t t = tokens[r];
    const float* e = t >= vocab_begin && t < vocab_end ? wte + int64_t(t - vocab_begin) * C : nullptr;
    const float* p =
        wpe != nullptr ? wpe + int64_t(positions != nullptr ? positions[r] : r % T) * C : nullptr;
    out[i] = e != nullptr && p != nullptr ? e[c] + p[c] : e != nullptr ? e[c] : p != nullptr ? p[c] : 0.0f;
  }
}

// Rows of dwte (a repeated token) and dwpe (a repeated position) collide: atomics, so the sums' order
// varies from run to run, within FP32 rounding of the CPU's.
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                          const int32_t* positions, int T, int C, int vocab_begin,
                                          int vocab_end, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / C;
    const int c = int(i % C);
    if (dwpe != nullptr)
      atomicAdd(dwpe + int64_t(positions != nullptr ? positions[r] : r % T) * C + c, dout[i]);
    const int32_t t = tokens[r];
    if (t >= vocab_begin && t < vocab_end) atomicAdd(dwte + int64_t(t - vocab_begin) * C + c, dout[i]);
  }
}

__global__ void residual_kernel(float* res_out, const float* res_in, const float* delta,
                                const float* delta_bias, int C, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    res_out[i] = res_in[i] + delta[i] + (delta_bias != nullptr ? delta_bias[i % C] : 0.0f);
}

__global__ void add_bias_kernel(float* out, const float* bias, int OC, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] += bias[i % OC];
}

// ---- attention: one warp per (batch, head, query) row, lanes over the head's channels (lane + 32 i).
// Grouped-query attention: query head h reads key/value head h / group (HeadLayout, attention_tc.h).

// The dot product of a lane-distributed register vector with a head vector in memory, summed over the warp.
__device__ __forceinline__ float warp_dot(const float (&a)[kPerLane], const float* b, int hd) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane_id() + 32 * i;
    if (c < hd) s += a[i] * b[c];
  }
  return warp_sum(s);
}
__device__ __forceinline__ void load_head(float (&a)[kPerLane], const float* p, int hd) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane_id() + 32 * i;
    a[i] = c < hd ? p[c] : 0.0f;
  }
}
__device__ __forceinline__ void store_head(float* p, const float (&a)[kPerLane], int hd) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane_id() + 32 * i;
    if (c < hd) p[c] = a[i];
  }
}

// Query t of row b sees keys [first, t]: the later of its document's start (doc_start null: 0) and the
// window's first key.
__device__ __forceinline__ int first_key(const int32_t* doc_start, int b, int T, int t, int window) {
  const int doc = doc_start != nullptr ? doc_start[int64_t(b) * T + t] : 0;
  return max(doc, first_visible_key(t, window));
}

// Online softmax over the visible keys: the running maximum m and sum l, the output rescaled whenever m
// grows. lse = m + log l, as the CPU's max + log(sum).
__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, const int32_t* doc_start,
                                         int B, int T, HeadLayout L, int hd, float scale) {
  const int64_t item = warp_item();
  if (item >= int64_t(B) * L.heads * T) return;
  const int t = int(item % T);
  const int64_t bh = item / T;
  const int b = int(bh / L.heads), h = int(bh % L.heads);
  const float* rows = qkv + int64_t(b) * T * L.qkv_stride;  // batch row b's position 0
  const float* k0 = rows + L.k_col + (h / L.group) * hd;
  const float* v0 = rows + L.v_col + (h / L.group) * hd;
  float q[kPerLane], acc[kPerLane];
  load_head(q, rows + int64_t(t) * L.qkv_stride + h * hd, hd);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0;
  float m = -INFINITY, l = 0;
  for (int j = first_key(doc_start, b, T, t, L.window); j <= t; ++j) {
    const float* k = k0 + int64_t(j) * L.qkv_stride;
    const float* v = v0 + int64_t(j) * L.qkv_stride;
    const float s = warp_dot(q, k, hd) * scale;
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new);  // 0 at the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * rescale + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane_id() + 32 * i;
      if (c < hd) acc[i] = acc[i] * rescale + p * v[c];
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] /= l;
  store_head(out + (int64_t(b) * T + t) * L.out_stride + h * hd, acc, hd);
  if (lane_id() == 0) lse[bh * T + t] = m + logf(l);
}

// Backward, as the CPU's: P = exp(S - lse), delta_t = <out_t, dout_t>, dS = P (dP - delta) scale with
// dP_tj = <dout_t, v_j>; dQ_t = sum_j dS_tj k_j here (one warp per query), dK_j = sum_t dS_tj q_t and
// dV_j = sum_t P_tj dout_t in the kernel below (one warp per key of a key/value head, summing over the
// group's query heads in order). Each writes its rows whole: no atomics.
__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                             const float* out, const float* lse, const int32_t* doc_start,
                                             int B, int T, HeadLayout L, int hd, float scale) {
  const int64_t item = warp_item();
  if (item >= int64_t(B) * L.heads * T) return;
  const int t = int(item % T);
  const int64_t bh = item / T;
  const int b = int(bh / L.heads), h = int(bh % L.heads);
  const float* rows = qkv + int64_t(b) * T * L.qkv_stride;
  const float* k0 = rows + L.k_col + (h / L.group) * hd;
  const float* v0 = rows + L.v_col + (h / L.group) * hd;
  const int64_t at = (int64_t(b) * T + t) * L.out_stride + h * hd;  // this query's head in out and dout
  float q[kPerLane], g[kPerLane], o[kPerLane], dq[kPerLane];
  load_head(q, rows + int64_t(t) * L.qkv_stride + h * hd, hd);
  load_head(g, dout + at, hd);
  load_head(o, out + at, hd);
  const float delta = warp_dot(o, dout + at, hd);
  const float l = lse[bh * T + t];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dq[i] = 0;
  for (int j = first_key(doc_start, b, T, t, L.window); j <= t; ++j) {
    const float* k = k0 + int64_t(j) * L.qkv_stride;
    const float* v = v0 + int64_t(j) * L.qkv_stride;
    const float p = expf(warp_dot(q, k, hd) * scale - l);
    const float ds = p * (warp_dot(g, v, hd) - delta) * scale;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane_id() + 32 * i;
      if (c < hd) dq[i] += ds * k[c];
    }
  }
  store_head(dqkv + (int64_t(b) * T + t) * L.qkv_stride + h * hd, dq, hd);
}

__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv,
                                              const float* out, const float* lse, const int32_t* doc_start,
                                              int B, int T, HeadLayout L, int hd, float scale) {
  const int64_t item = warp_item();
  if (item >= int64_t(B) * L.kv_heads * T) return;
  const int j = int(item % T);  // the key
  const int64_t bkv = item / T;
  const int b = int(bkv / L.kv_heads), kvh = int(bkv % L.kv_heads);
  const float* rows = qkv + int64_t(b) * T * L.qkv_stride;
  float k[kPerLane], v[kPerLane], dk[kPerLane], dv[kPerLane];
  load_head(k, rows + int64_t(j) * L.qkv_stride + L.k_col + kvh * hd, hd);
  load_head(v, rows + int64_t(j) * L.qkv_stride + L.v_col + kvh * hd, hd);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dk[i] = dv[i] = 0;
  // The queries that may see key j: [j, j + window) within the sequence.
  const int last = L.window > 0 ? min(T - 1, j + L.window - 1) : T - 1;
  for (int h = kvh * L.group; h < (kvh + 1) * L.group; ++h) {
    const int64_t bh = int64_t(b) * L.heads + h;
    for (int t = j; t <= last; ++t) {
      if (first_key(doc_start, b, T, t, 0) > j) continue;  // query t is in a later document
      const float* q = rows + int64_t(t) * L.qkv_stride + h * hd;
      const int64_t at = (int64_t(b) * T + t) * L.out_stride + h * hd;
      const float* g = dout + at;
      float o[kPerLane];
      load_head(o, out + at, hd);
      const float delta = warp_dot(o, g, hd);
      const float p = expf(warp_dot(k, q, hd) * scale - lse[bh * T + t]);
      const float ds = p * (warp_dot(v, g, hd) - delta) * scale;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int c = lane_id() + 32 * i;
        if (c < hd) {
          dv[i] += p * g[c];
          dk[i] += ds * q[c];
        }
      }
    }
  }
  float* d = dqkv + (int64_t(b) * T + j) * L.qkv_stride;
  store_head(d + L.k_col + kvh * hd, dk, hd);
  store_head(d + L.v_col + kvh * hd, dv, hd);
}

// Decoding: every new key and value head into the caches first (this kernel), then the queries (the next
// one, queued after it on the stream), so that rows of one sequence see each other's keys.
__global__ void decode_store_kernel(float* k_cache, float* v_cache, const float* qkv, const int32_t* seq,
                                    const int32_t* pos, int max_len, HeadLayout L, int kv_width, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / kv_width;
    const int c = int(i % kv_width);
    const int64_t at = (int64_t(seq[r]) * max_len + pos[r]) * kv_width + c;
    k_cache[at] = qkv[r * L.qkv_stride + L.k_col + c];
    v_cache[at] = qkv[r * L.qkv_stride + L.v_col + c];
  }
}

__global__ void decode_attend_kernel(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                                     const int32_t* seq, const int32_t* pos, int rows, int max_len,
                                     HeadLayout L, int hd, int kv_width, float scale) {
  const int64_t item = warp_item();
  if (item >= int64_t(rows) * L.heads) return;
  const int64_t r = item / L.heads;
  const int h = int(item % L.heads), kvh = h / L.group;
  const float* k0 = k_cache + int64_t(seq[r]) * max_len * kv_width + kvh * hd;
  const float* v0 = v_cache + int64_t(seq[r]) * max_len * kv_width + kvh * hd;
  float q[kPerLane], acc[kPerLane];
  load_head(q, qkv + r * L.qkv_stride + h * hd, hd);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0;
  float m = -INFINITY, l = 0;
  for (int j = max(0, first_visible_key(pos[r], L.window)); j <= pos[r]; ++j) {
    const float s = warp_dot(q, k0 + int64_t(j) * kv_width, hd) * scale;
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * rescale + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane_id() + 32 * i;
      if (c < hd) acc[i] = acc[i] * rescale + p * v0[int64_t(j) * kv_width + c];
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] /= l;
  store_head(out + r * L.out_stride + h * hd, acc, hd);
}

// ---- Mixture-of-Experts row moves

__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ float widen(uint16_t bf16) {
  return __uint_as_float(uint32_t(bf16) << 16);
}

template <class T>
__global__ void gather_rows_kernel(float* out, const T* in, const int32_t* index, const float* scale, int C,
                                   int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t r = i / C;
    const float f = scale != nullptr ? scale[r] : 1.0f;
    out[i] = f * widen(in[int64_t(index[r]) * C + i % C]);
  }
}

// Each output element sums its k terms in order j = 0..k-1, as the CPU does.
__global__ void combine_rows_kernel(float* out, const float* in, const int32_t* index, const float* weight,
                                    int k, int C, bool accumulate, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t t = i / C;
    const int c = int(i % C);
    float s = accumulate ? out[i] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = index[t * k + j];
      if (r < 0) continue;
      const float f = weight != nullptr ? weight[t * k + j] : 1.0f;
      s += f * in[int64_t(r) * C + c];
    }
    out[i] = s;
  }
}

__global__ void row_dots_kernel(float* dot, const float* a, const float* b, const int32_t* index, int k,
                                int C, int64_t n) {
  const int64_t i = warp_item();
  if (i >= n) return;
  const int32_t r = index[i];
  float s = 0;
  if (r >= 0)
    for (int c = lane_id(); c < C; c += 32) s += a[(i / k) * C + c] * b[int64_t(r) * C + c];
  s = warp_sum(s);
  if (lane_id() == 0) dot[i] = r >= 0 ? s : 0.0f;
}

// ---- the losses: one block per row of logits, each pass a kernel so the host can combine the row
// statistics over a VocabGroup between them.

__device__ __forceinline__ float row_weight(const int32_t* targets, const float* weights, int64_t i) {
  return targets[i] == kIgnore ? 0.0f : weights != nullptr ? weights[i] : 1.0f;
}

__global__ void cross_entropy_max_kernel(float* mx, const float* logits, int V) {
  __shared__ float scratch[32];
  const float* row = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce<true>(m, scratch);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

// The row becomes its exponentials (the gradient's numerators, as on the CPU); its target logit is read
// first.
__global__ void cross_entropy_exp_kernel(float* sum_tgt, float* logits, const float* mx,
                                         const int32_t* targets, int V, int vocab_begin) {
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  float* row = logits + i * V;
  const int t = targets[i] - vocab_begin;
  if (threadIdx.x == 0) sum_tgt[2 * i + 1] = t >= 0 && t < V ? row[t] : 0.0f;
  __syncthreads();
  const float m = mx[i];
  float s = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    row[j] = expf(row[j] - m);
    s += row[j];
  }
  s = block_reduce<false>(s, scratch);
  if (threadIdx.x == 0) sum_tgt[2 * i] = s;
}

__global__ void cross_entropy_finish_kernel(double* row_loss, float* nll, float* logits, const float* mx,
                                            const float* sum_tgt, const int32_t* targets,
                                            const float* weights, int V, int vocab_begin, float scale,
                                            bool backward) {
  const int64_t i = blockIdx.x;
  const float w = row_weight(targets, weights, i);
  const float sum = sum_tgt[2 * i];
  const float loss = w != 0.0f ? logf(sum) - (sum_tgt[2 * i + 1] - mx[i]) : 0.0f;  // lse - logit
  if (threadIdx.x == 0) {
    row_loss[i] = w != 0.0f ? double(w) * loss : 0.0;
    if (nll != nullptr) nll[i] = loss;
  }
  if (!backward) return;
  // dL/dlogit = c (softmax - onehot(target)), c = w x scale
  const float c = w * scale;
  const float inv = c / sum;
  const int t = targets[i] - vocab_begin;
  float* row = logits + i * V;
  for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = row[j] * inv - (j == t ? c : 0.0f);
}

__global__ void distillation_max_kernel(float* mx, const float* logits, const float* teacher, int V) {
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  float mz = -INFINITY, mt = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    mz = fmaxf(mz, logits[i * V + j]);
    mt = fmaxf(mt, teacher[i * V + j]);
  }
  mz = block_reduce<true>(mz, scratch);
  mt = block_reduce<true>(mt, scratch);
  if (threadIdx.x == 0) mx[2 * i] = mz, mx[2 * i + 1] = mt;
}

// With a = (z - max z) / T and b = (t - max t) / T: S1 = sum exp(z - max z), ST = sum exp(a), SB = sum
// exp(b), D = sum exp(b) (b - a), and z[target]; the teacher's row becomes exp(b) (kept for the gradient).
// Rows that weigh 0 are skipped, their sums 0 and their teacher row untouched, as on the CPU.
__global__ void distillation_sums_kernel(float* sums, const float* logits, float* teacher, const float* mx,
                                         const int32_t* targets, const float* weights, int V, int vocab_begin,
                                         float inv_t) {
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  float* s = sums + 5 * i;
  if (row_weight(targets, weights, i) == 0.0f) {
    if (threadIdx.x < 5) s[threadIdx.x] = 0.0f;
    return;
  }
  const float* z = logits + i * V;
  float* t = teacher + i * V;
  const float mz = mx[2 * i], mt = mx[2 * i + 1];
  float s1 = 0, st = 0, sb = 0, d = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float a = (z[j] - mz) * inv_t, b = (t[j] - mt) * inv_t;
    const float eb = expf(b);
    s1 += expf(z[j] - mz);
    st += expf(a);
    sb += eb;
    d += eb * (b - a);
    t[j] = eb;
  }
  s1 = block_reduce<false>(s1, scratch);
  st = block_reduce<false>(st, scratch);
  sb = block_reduce<false>(sb, scratch);
  d = block_reduce<false>(d, scratch);
  if (threadIdx.x == 0) {
    const int target = targets[i] - vocab_begin;
    s[0] = s1, s[1] = st, s[2] = sb, s[3] = d;
    s[4] = target >= 0 && target < V ? z[target] : 0.0f;
  }
}

// CE = log S1 - (z[target] - max z), KL = D / SB - log SB + log ST; the row's loss in double as the CPU sums
// it. Gradient: (1 - alpha) (softmax(z) - onehot) + alpha T (softmax(z / T) - softmax(t / T)), times w x
// scale.
__global__ void distillation_finish_kernel(double* row_loss, float* logits, const float* teacher,
                                           const float* mx, const float* sums, const int32_t* targets,
                                           const float* weights, int V, int vocab_begin, float temperature,
                                           float inv_t, float alpha, float scale, bool backward) {
  const int64_t i = blockIdx.x;
  const float w = row_weight(targets, weights, i);
  float* z = logits + i * V;
  if (w == 0.0f) {
    if (threadIdx.x == 0) row_loss[2 * i] = 0.0, row_loss[2 * i + 1] = 0.0;
    if (backward)
      for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] = 0.0f;
    return;
  }
  const float* s = sums + 5 * i;
  const float mz = mx[2 * i];
  const float ce = logf(s[0]) - (s[4] - mz);
  const float kl = s[3] / s[2] - logf(s[2]) + logf(s[1]);
  if (threadIdx.x == 0) {
    row_loss[2 * i] = double(w) * (double(alpha) * temperature * temperature * kl + (1.0 - alpha) * ce);
    row_loss[2 * i + 1] = double(w) * kl;
  }
  if (!backward) return;
  const float c_ce = w * scale * (1.0f - alpha) / s[0];
  const float c_st = w * scale * alpha * temperature / s[1];
  const float c_sb = w * scale * alpha * temperature / s[2];
  const float c_target = w * scale * (1.0f - alpha);
  const float* eb = teacher + i * V;
  const int target = targets[i] - vocab_begin;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float g = c_ce * expf(z[j] - mz) + c_st * expf((z[j] - mz) * inv_t) - c_sb * eb[j];
    z[j] = j == target ? g - c_target : g;
  }
}

// ---- BF16: integer arithmetic on the bits, identical to cpu/bf16.cpp (round to nearest, ties to even;
// NaN stays a quiet NaN). No float arithmetic, so fast-math and flush-to-zero cannot touch it.

__device__ __forceinline__ uint32_t bf16_bits(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) != 0x7f800000u)
    bits += 0x7fffu + ((bits >> 16) & 1u);
  else if ((bits & 0x007fffffu) != 0)
    bits |= 0x00400000u;
  return bits & 0xffff0000u;
}

__global__ void round_to_bf16_kernel(float* out, const float* in, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __uint_as_float(bf16_bits(in[i]));
}

__global__ void to_bf16_kernel(uint16_t* out, float* values, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const uint32_t bits = bf16_bits(values[i]);
    values[i] = __uint_as_float(bits);
    out[i] = uint16_t(bits >> 16);
  }
}

__global__ void narrow_bf16_kernel(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = uint16_t(bf16_bits(in[i]) >> 16);
}

__global__ void from_bf16_kernel(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __uint_as_float(uint32_t(in[i]) << 16);
}

__global__ void scale_kernel(float* x, float factor, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= factor;
}

}  // namespace

HeadLayout head_layout(const AttentionShape& shape, const char* op) {
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim)
    usage_fail(std::string("CUDA backend ") + op + ": head dim must be in [1, " +
               std::to_string(kMaxHeadDim) + "], not " + std::to_string(shape.head_dim));
  if (shape.heads <= 0 || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0)
    usage_fail(std::string("CUDA backend ") + op + ": " + std::to_string(shape.heads) +
               " query heads do not divide into " + std::to_string(shape.kv_heads) + " key/value heads");
  HeadLayout L;
  L.heads = shape.heads, L.kv_heads = shape.kv_heads, L.group = shape.heads / shape.kv_heads;
  L.qkv_stride = shape.qkv_width();
  L.k_col = shape.q_width(), L.v_col = shape.q_width() + shape.kv_width();
  L.out_stride = shape.q_width();
  L.window = std::max(shape.window, 0);
  if (L.window > 0) L.span = unsigned(L.window);
  return L;
}

// Every launch is skipped for an empty op: a grid of zero blocks is a launch error.

void fill(float* x, float value, size_t n) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(x, value, int64_t(n));
  check_launch("fill");
}

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                       const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) {
  const int64_t n = int64_t(B) * T * C;
  if (n == 0) return;
  embedding_forward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, tokens, positions, wte, wpe, T, C,
                                                                     vocab_begin, vocab_end, n);
  check_launch("embedding_forward");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int B, int T, int C, int vocab_begin, int vocab_end) {
  const int64_t n = int64_t(B) * T * C;
  if (n == 0) return;
  embedding_backward_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(dwte, dwpe, dout, tokens, positions, T,
                                                                      C, vocab_begin, vocab_end, n);
  check_launch("embedding_backward");
}

void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias, int N,
                      int C) {
  const int64_t n = int64_t(N) * C;
  if (n == 0) return;
  residual_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(res_out, res_in, delta, delta_bias, C, n);
  check_launch("residual_forward");
}

void add_bias(float* out, const float* bias, int N, int OC) {
  const int64_t n = int64_t(N) * OC;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, bias, OC, n);
  check_launch("add_bias");
}

void attention_forward(float* out, float* lse, const float* qkv, const int32_t* doc_start, int B, int T,
                       const AttentionShape& shape) {
  const HeadLayout L = head_layout(shape, "attention_forward");
  const int64_t items = int64_t(B) * L.heads * T;
  if (items == 0) return;
  const float scale = 1.0f / std::sqrt(float(shape.head_dim));
  attention_forward_kernel<<<warp_blocks(items), kThreads, 0, stream()>>>(out, lse, qkv, doc_start, B, T, L,
                                                                          shape.head_dim, scale);
  check_launch("attention_forward");
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* doc_start, int B, int T, const AttentionShape& shape) {
  const HeadLayout L = head_layout(shape, "attention_backward");
  const int64_t items = int64_t(B) * L.heads * T;
  if (items == 0) return;
  const int hd = shape.head_dim;
  const float scale = 1.0f / std::sqrt(float(hd));
  attention_backward_dq_kernel<<<warp_blocks(items), kThreads, 0, stream()>>>(dqkv, dout, qkv, out, lse,
                                                                              doc_start, B, T, L, hd, scale);
  check_launch("attention_backward (dq)");
  attention_backward_dkv_kernel<<<warp_blocks(int64_t(B) * L.kv_heads * T), kThreads, 0, stream()>>>(
      dqkv, dout, qkv, out, lse, doc_start, B, T, L, hd, scale);
  check_launch("attention_backward (dk, dv)");
}

void attention_decode(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* seq,
                      const int32_t* pos, int rows, int max_len, const AttentionShape& shape) {
  const HeadLayout L = head_layout(shape, "attention_decode");
  const int kv_width = shape.kv_width();
  const int64_t n = int64_t(rows) * kv_width;
  if (n == 0) return;
  decode_store_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(k_cache, v_cache, qkv, seq, pos, max_len, L,
                                                                kv_width, n);
  check_launch("attention_decode (cache)");
  const float scale = 1.0f / std::sqrt(float(shape.head_dim));
  decode_attend_kernel<<<warp_blocks(int64_t(rows) * L.heads), kThreads, 0, stream()>>>(
      out, qkv, k_cache, v_cache, seq, pos, rows, max_len, L, shape.head_dim, kv_width, scale);
  check_launch("attention_decode");
}

template <class T>
void gather_rows(float* out, const T* in, const int32_t* index, const float* scale, int rows, int C) {
  const int64_t n = int64_t(rows) * C;
  if (n == 0) return;
  gather_rows_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, in, index, scale, C, n);
  check_launch("gather_rows");
}
template void gather_rows<float>(float*, const float*, const int32_t*, const float*, int, int);
template void gather_rows<uint16_t>(float*, const uint16_t*, const int32_t*, const float*, int, int);

void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k, int C,
                  bool accumulate) {
  const int64_t n = int64_t(N) * C;
  if (n == 0) return;
  combine_rows_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out, in, index, weight, k, C, accumulate, n);
  check_launch("combine_rows");
}

void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k, int C) {
  const int64_t n = int64_t(N) * k;
  if (n == 0) return;
  row_dots_kernel<<<warp_blocks(n), kThreads, 0, stream()>>>(dot, a, b, index, k, C, n);
  check_launch("row_dots");
}

void cross_entropy_max(float* mx, const float* logits, int rows, int V) {
  if (rows == 0) return;
  cross_entropy_max_kernel<<<rows, kThreads, 0, stream()>>>(mx, logits, V);
  check_launch("cross_entropy (max)");
}

void cross_entropy_exp(float* sum_tgt, float* logits, const float* mx, const int32_t* targets, int rows,
                       int V, int vocab_begin) {
  if (rows == 0) return;
  cross_entropy_exp_kernel<<<rows, kThreads, 0, stream()>>>(sum_tgt, logits, mx, targets, V, vocab_begin);
  check_launch("cross_entropy (exp)");
}

void cross_entropy_finish(double* row_loss, float* nll, float* logits, const float* mx, const float* sum_tgt,
                          const int32_t* targets, const float* weights, int rows, int V, int vocab_begin,
                          float scale, bool backward) {
  if (rows == 0) return;
  cross_entropy_finish_kernel<<<rows, kThreads, 0, stream()>>>(row_loss, nll, logits, mx, sum_tgt, targets,
                                                               weights, V, vocab_begin, scale, backward);
  check_launch("cross_entropy (finish)");
}

void distillation_max(float* mx, const float* logits, const float* teacher, int rows, int V) {
  if (rows == 0) return;
  distillation_max_kernel<<<rows, kThreads, 0, stream()>>>(mx, logits, teacher, V);
  check_launch("distillation (max)");
}

void distillation_sums(float* sums, const float* logits, float* teacher, const float* mx,
                       const int32_t* targets, const float* weights, int rows, int V, int vocab_begin,
                       float temperature) {
  if (rows == 0) return;
  // 1 / T on the host, as the CPU computes it (fast-math would make the device's division approximate).
  const float inv_t = 1.0f / temperature;
  distillation_sums_kernel<<<rows, kThreads, 0, stream()>>>(sums, logits, teacher, mx, targets, weights, V,
                                                            vocab_begin, inv_t);
  check_launch("distillation (sums)");
}

void distillation_finish(double* row_loss, float* logits, const float* teacher, const float* mx,
                         const float* sums, const int32_t* targets, const float* weights, int rows, int V,
                         int vocab_begin, float temperature, float alpha, float scale, bool backward) {
  if (rows == 0) return;
  const float inv_t = 1.0f / temperature;
  distillation_finish_kernel<<<rows, kThreads, 0, stream()>>>(row_loss, logits, teacher, mx, sums, targets,
                                                              weights, V, vocab_begin, temperature, inv_t,
                                                              alpha, scale, backward);
  check_launch("distillation (finish)");
}

void round_to_bf16(float* out, const float* in, size_t n) {
  if (n == 0) return;
  round_to_bf16_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(out, in, int64_t(n));
  check_launch("round_to_bf16");
}

void to_bf16(uint16_t* out, float* values, size_t n) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(out, values, int64_t(n));
  check_launch("to_bf16");
}

void narrow_bf16(uint16_t* out, const float* in, size_t n) {
  if (n == 0) return;
  narrow_bf16_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(out, in, int64_t(n));
  check_launch("convert (FP32 to BF16)");
}

void from_bf16(float* out, const uint16_t* in, size_t n) {
  if (n == 0) return;
  from_bf16_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(out, in, int64_t(n));
  check_launch("from_bf16");
}

void scale(float* x, float factor, size_t n) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(int64_t(n)), kThreads, 0, stream()>>>(x, factor, int64_t(n));
  check_launch("scale");
}

}  // namespace forge::trainer::cuda::seam
