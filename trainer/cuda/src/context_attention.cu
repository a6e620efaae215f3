// Context parallelism's attention unit on the GPU (Backend::attention_chunk_forward / _backward,
// attention_delta; the CPU reference is trainer/src/cpu/context_attention.cpp): the query rows of one chunk
// over the key/value rows of another, with the masks in sequence indices. FP32 on CUDA cores, in
// attention.cu's schedule: tiles of 32 query rows x 32 key rows in shared memory, one warp per 4 query rows
// (forward, dQ) or key rows (dK, dV), a lane per key (or query) for the scores and a lane per head-dim slice
// (lane + 32 i) for the outputs. Any head dim up to 256: the tiles are padded with zeros to 32, 64, 128 or
// 256 columns (the kernels' template), so the padding adds nothing to the dot products.
//
// A query row t sees the keys [first(t), last(t)] of the key chunk (Visible, as the CPU's). A block of 32
// query rows walks the key tiles from its first row's first key to its last row's last one; a block whose
// rows see nothing returns at once, leaving out and lse untouched.
//
// Forward: FlashAttention's online softmax over the key tiles gives the chunk's (part, lse_b) per row, merged
// into the running (out, lse) by log-sum-exp: out = (e^la out + e^lb part) / (e^la + e^lb), lse = log(e^la +
// e^lb); a row whose lse is -inf (no key merged yet) takes (part, lse_b) as they are.
//
// Backward (adds): dQ in one kernel over query tiles, dK and dV in another over key tiles, which loops over
// the query tiles that may see its keys, for each query head of its key/value head's group in turn. Each
// block owns its output rows and adds to them once at its end: no atomics, the same bits on every run.
#include "attention_tc.h"
#include "attention_warp.cuh"
#include "backend_kernels.h"
#include "device_math.cuh"
#include "forge/trainer/backend.h"
#include "forge/trainer/cuda/context.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace forge::trainer::cuda::seam {

namespace {

constexpr int kTile = 32;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr unsigned kFull = 0xffffffffu;

// Rows of a chunk in device code (ChunkRows): row t of sequence b at base + b * seq + t * ld.
struct Rows {
  float* base = nullptr;
  int64_t seq = 0;
  int64_t ld = 0;
  __device__ float* row(int b, int t) const { return base + int64_t(b) * seq + int64_t(t) * ld; }
};
Rows rows_of(ChunkRows r) {
  return Rows{r.base, r.seq, r.ld};
}

// The first index of the sorted ids[0, n) that is >= value (std::lower_bound).
__device__ int first_at_least(const int32_t* ids, int n, int32_t value) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ids[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// An AttentionChunks as the kernels take it (a kernel parameter).
struct Chunk {
  int n = 0, heads = 0, kv_heads = 0, group = 1, hd = 0, window = 0;
  int q_first = 0, k_first = 0;
  Rows q, k, v;
  const int32_t *q_seg = nullptr, *k_seg = nullptr;  // both set, or both null (one document)
  int64_t seg_seq = 0, stats_seq = 0;
  float scale = 1;

  // The keys that query row t of sequence b sees: [first, last], empty when first > last (cpu's Visible).
  __device__ int last(int t) const { return min(n - 1, q_first + t - k_first); }
  __device__ int first(int b, int t) const {
    int f = 0;
    if (q_seg != nullptr)
      f = first_at_least(k_seg + int64_t(b) * seg_seq, n, q_seg[int64_t(b) * seg_seq + t]);
    if (window > 0) f = max(f, q_first + t - window + 1 - k_first);
    return f;
  }
  // Where query head h's row values (lse, delta) of sequence b start.
  __device__ int64_t stats(int b, int h) const { return (int64_t(b) * heads + h) * stats_seq; }
};

// Rows [t0, t0 + count) (count <= 32) of one head's slice (columns col.. of `rows`' rows of sequence b) as
// float into `dst` with row pitch `pitch`, HDP columns: rows past count and columns past hd are zero.
template <int HDP>
__device__ void load_tile(float* dst, int pitch, const Rows& rows, int b, int col, int t0, int count,
                          int hd) {
  for (int i = threadIdx.x; i < kTile * HDP; i += blockDim.x) {
    const int r = i / HDP, d = i % HDP;
    dst[r * pitch + d] = r < count && d < hd ? rows.row(b, t0 + r)[col + d] : 0.0f;
  }
}

// Each query row's visible keys for the rows [t0, t0 + 32) of sequence b, into shared memory (rows past n:
// none, first > last).
__device__ void visible_rows(int* first, int* last, const Chunk& c, int b, int t0) {
  if (threadIdx.x < kTile) {
    const int t = t0 + int(threadIdx.x);
    first[threadIdx.x] = t < c.n ? c.first(b, t) : 1;
    last[threadIdx.x] = t < c.n ? c.last(t) : 0;
  }
}

// The tile of 32 query rows a block of the forward and dQ kernels holds (grid: query tiles, B * heads), and
// the keys its rows see: row r [row_first[r], row_last[r]] (in shared memory the kernel declares), the
// block [lo, hi] (first and last never decrease with the row, as on the CPU); lo > hi when no row sees a
// key of the chunk.
struct QueryTile {
  int b, h, kvh, q0, rows, lo, hi;
};
__device__ QueryTile query_tile(const Chunk& c, int* row_first, int* row_last) {
  QueryTile t;
  t.b = int(blockIdx.y) / c.heads;
  t.h = int(blockIdx.y) % c.heads;
  t.kvh = t.h / c.group;
  t.q0 = int(blockIdx.x) * kTile;
  t.rows = min(kTile, c.n - t.q0);
  visible_rows(row_first, row_last, c, t.b, t.q0);
  __syncthreads();
  t.lo = row_first[0];
  t.hi = row_last[t.rows - 1];
  return t;
}

// Grid: (query tiles, B * heads).
template <int DPL>
__global__ void __launch_bounds__(kThreads) chunk_forward_kernel(Chunk c, Rows out, float* lse) {
  constexpr int HDP = DPL * 32;
  extern __shared__ float sm[];
  float* q = sm;                     // [32][HDP]
  float* k = q + kTile * HDP;        // [32][HDP + 1]: lane j reads row j
  float* v = k + kTile * (HDP + 1);  // [32][HDP]
  __shared__ int row_first[kTile], row_last[kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const auto [b, h, kvh, q0, rows, lo, hi] = query_tile(c, row_first, row_last);
  if (lo > hi) return;  // the whole block: out and lse untouched
  load_tile<HDP>(q, HDP, c.q, b, h * c.hd, q0, rows, c.hd);
  float o[kRowsPerWarp][DPL], mrow[kRowsPerWarp], lrow[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    mrow[rr] = -INFINITY;
    lrow[rr] = 0;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) o[rr][dd] = 0;
  }
  for (int k0 = lo; k0 <= hi; k0 += kTile) {
    const int count = min(kTile, hi + 1 - k0);
    __syncthreads();  // the previous tile is read
    load_tile<HDP>(k, HDP + 1, c.k, b, kvh * c.hd, k0, count, c.hd);
    load_tile<HDP>(v, HDP, c.v, b, kvh * c.hd, k0, count, c.hd);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, tk = k0 + lane;
      if (r >= rows) continue;  // the whole warp
      const bool visible = lane < count && tk >= row_first[r] && tk <= row_last[r];
      float s = -INFINITY;
      if (visible) {
        float acc = 0;
#pragma unroll 16
        for (int d = 0; d < HDP; ++d) acc += q[r * HDP + d] * k[lane * (HDP + 1) + d];
        s = acc * c.scale;
      }
      // A row may see nothing in a tile (before its first key).
      online_softmax_tile(s, visible, mrow[rr], lrow[rr], o[rr], v, HDP);
    }
  }
  // The merge, one warp per row (mrow and lrow are the same on every lane: butterfly reductions).
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows || mrow[rr] == -INFINITY) continue;  // no key of this chunk: untouched
    const float lb = mrow[rr] + logf(lrow[rr]), inv_l = 1.0f / lrow[rr];
    float* orow = out.row(b, q0 + r) + h * c.hd;
    float* lrow_at = lse + c.stats(b, h) + q0 + r;
    const float la = __shfl_sync(kFull, lane == 0 ? *lrow_at : 0.0f, 0);  // read before lane 0 writes it
    float ea = 0, eb = 1, inv = 1, merged = lb;
    if (la != -INFINITY) {
      const float m = fmaxf(la, lb);
      ea = expf(la - m);
      eb = expf(lb - m);
      inv = 1.0f / (ea + eb);
      merged = m + logf(ea + eb);
    }
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      const int d = lane + dd * 32;
      if (d >= c.hd) continue;
      const float part = o[rr][dd] * inv_l;
      orow[d] = la == -INFINITY ? part : (ea * orow[d] + eb * part) * inv;
    }
    if (lane == 0) *lrow_at = merged;
  }
}

// dQ += dS K for one tile of 32 query rows, over the key tiles its rows see. Grid: (query tiles, B * heads).
template <int DPL>
__global__ void __launch_bounds__(kThreads)
    chunk_dq_kernel(Chunk c, Rows dout, const float* lse, const float* delta, Rows dq) {
  constexpr int HDP = DPL * 32;
  extern __shared__ float sm[];
  float* q = sm;                     // [32][HDP]
  float* go = q + kTile * HDP;       // [32][HDP]
  float* k = go + kTile * HDP;       // [32][HDP + 1]
  float* v = k + kTile * (HDP + 1);  // [32][HDP + 1]
  __shared__ int row_first[kTile], row_last[kTile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const auto [b, h, kvh, q0, rows, lo, hi] = query_tile(c, row_first, row_last);
  if (lo > hi) return;
  load_tile<HDP>(q, HDP, c.q, b, h * c.hd, q0, rows, c.hd);
  load_tile<HDP>(go, HDP, dout, b, h * c.hd, q0, rows, c.hd);
  float acc[kRowsPerWarp][DPL], l[kRowsPerWarp], dl[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    l[rr] = r < rows ? lse[c.stats(b, h) + q0 + r] : 0.0f;
    dl[rr] = r < rows ? delta[c.stats(b, h) + q0 + r] : 0.0f;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) acc[rr][dd] = 0;
  }
  for (int k0 = lo; k0 <= hi; k0 += kTile) {
    const int count = min(kTile, hi + 1 - k0);
    __syncthreads();
    load_tile<HDP>(k, HDP + 1, c.k, b, kvh * c.hd, k0, count, c.hd);
    load_tile<HDP>(v, HDP + 1, c.v, b, kvh * c.hd, k0, count, c.hd);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, tk = k0 + lane;
      if (r >= rows) continue;
      float ds = 0;
      if (lane < count && tk >= row_first[r] && tk <= row_last[r]) {
        float s = 0, dp = 0;
#pragma unroll 16
        for (int d = 0; d < HDP; ++d) {
          s += q[r * HDP + d] * k[lane * (HDP + 1) + d];
          dp += go[r * HDP + d] * v[lane * (HDP + 1) + d];
        }
        const float p = expf(s * c.scale - l[rr]);
        ds = p * (dp - dl[rr]) * c.scale;
      }
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(kFull, ds, j);
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd) acc[rr][dd] += dsj * k[j * (HDP + 1) + lane + dd * 32];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    float* row = dq.row(b, q0 + r) + h * c.hd;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      const int d = lane + dd * 32;
      if (d < c.hd) row[d] += acc[rr][dd];
    }
  }
}

// dK += dS^T Q and dV += P^T dO for one tile of 32 key rows of one key/value head: over the query tiles
// that may see them, of each query head of its group in turn. Grid: (key tiles, B * kv_heads).
template <int DPL>
__global__ void __launch_bounds__(kThreads)
    chunk_dkv_kernel(Chunk c, Rows dout, const float* lse, const float* delta, Rows dk, Rows dv) {
  constexpr int HDP = DPL * 32;
  extern __shared__ float sm[];
  float* k = sm;                      // [32][HDP]
  float* v = k + kTile * HDP;         // [32][HDP]
  float* q = v + kTile * HDP;         // [32][HDP + 1]: lane i reads query row i
  float* go = q + kTile * (HDP + 1);  // [32][HDP + 1]
  __shared__ int row_first[kTile], row_last[kTile];
  __shared__ float row_lse[kTile], row_delta[kTile];
  const int bkv = blockIdx.y, b = bkv / c.kv_heads, kvh = bkv % c.kv_heads;
  const int k0 = blockIdx.x * kTile, keys = min(kTile, c.n - k0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The query rows that may see a key of [k0, k0 + keys): from the first whose causal past reaches k0 to
  // the last whose window still reaches the tile's last key (documents are masked row by row below).
  const int t_lo = max(0, k0 + c.k_first - c.q_first);
  int t_hi = c.n - 1;
  if (c.window > 0) t_hi = min(t_hi, k0 + keys - 1 + c.k_first - c.q_first + c.window - 1);
  if (t_lo > t_hi) return;  // no query row sees these keys: dk and dv untouched
  const int tile_lo = t_lo / kTile, tiles = t_hi / kTile - tile_lo + 1;
  load_tile<HDP>(k, HDP, c.k, b, kvh * c.hd, k0, keys, c.hd);
  load_tile<HDP>(v, HDP, c.v, b, kvh * c.hd, k0, keys, c.hd);
  float gk[kRowsPerWarp][DPL], gv[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) gk[rr][dd] = gv[rr][dd] = 0;
  // Step `step`: query head kvh * group + step / tiles, query tile tile_lo + step % tiles.
  for (int step = 0; step < c.group * tiles; ++step) {
    const int h = kvh * c.group + step / tiles, q0 = (tile_lo + step % tiles) * kTile;
    const int qrows = min(kTile, c.n - q0);
    __syncthreads();  // the previous query tile is read
    load_tile<HDP>(q, HDP + 1, c.q, b, h * c.hd, q0, qrows, c.hd);
    load_tile<HDP>(go, HDP + 1, dout, b, h * c.hd, q0, qrows, c.hd);
    visible_rows(row_first, row_last, c, b, q0);
    if (threadIdx.x < kTile) {
      const int i = int(threadIdx.x);
      row_lse[i] = i < qrows ? lse[c.stats(b, h) + q0 + i] : 0.0f;
      row_delta[i] = i < qrows ? delta[c.stats(b, h) + q0 + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int j = warp * kRowsPerWarp + rr, tk = k0 + j;
      if (j >= keys) continue;  // the whole warp
      float p = 0, ds = 0;
      if (lane < qrows && tk >= row_first[lane] && tk <= row_last[lane]) {
        float s = 0, dp = 0;
#pragma unroll 16
        for (int d = 0; d < HDP; ++d) {
          s += k[j * HDP + d] * q[lane * (HDP + 1) + d];
          dp += v[j * HDP + d] * go[lane * (HDP + 1) + d];
        }
        p = expf(s * c.scale - row_lse[lane]);
        ds = p * (dp - row_delta[lane]) * c.scale;
      }
      accumulate_dkv(p, ds, gv[rr], gk[rr], go, q, HDP + 1);
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int j = warp * kRowsPerWarp + rr;
    if (j >= keys) continue;
    float* krow = dk.row(b, k0 + j) + kvh * c.hd;
    float* vrow = dv.row(b, k0 + j) + kvh * c.hd;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      const int d = lane + dd * 32;
      if (d >= c.hd) continue;
      krow[d] += gk[rr][dd];
      vrow[d] += gv[rr][dd];
    }
  }
}

// delta[(b * heads + h) * T + t] = <out, dout> over head h of row b * T + t: one warp per (b, h, t).
__global__ void delta_kernel(float* delta, const float* out, const float* dout, int T, int heads, int hd,
                             int64_t items) {
  const int64_t w = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= items) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = w / T;
  const int t = int(w % T), b = int(bh / heads), h = int(bh % heads);
  const int64_t at = (int64_t(b) * T + t) * int64_t(heads) * hd + int64_t(h) * hd;
  float s = 0;
  for (int d = lane; d < hd; d += 32) s += out[at + d] * dout[at + d];
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// The chunk pair as the kernels take it, checked.
Chunk chunk_of(const AttentionChunks& a, const char* op) {
  const AttentionShape& s = a.shape;
  const HeadLayout L = head_layout(s, op);
  if ((a.q_seg == nullptr) != (a.k_seg == nullptr))
    usage_fail(std::string("CUDA backend ") + op + ": document ids for the queries or the keys only");
  Chunk c;
  c.n = a.n;
  c.heads = L.heads, c.kv_heads = L.kv_heads, c.group = L.group, c.hd = s.head_dim, c.window = L.window;
  c.q_first = a.q_first, c.k_first = a.k_first;
  c.q = rows_of(a.q), c.k = rows_of(a.k), c.v = rows_of(a.v);
  c.q_seg = a.q_seg, c.k_seg = a.k_seg, c.seg_seq = a.seg_seq;
  c.stats_seq = a.stats_seq;
  c.scale = 1.0f / std::sqrt(float(s.head_dim));  // on the host, as the CPU computes it
  return c;
}

// Dynamic shared memory of the kernels for DPL: the forward's q, k, v tiles; the backward's four.
template <int DPL>
size_t forward_smem() {
  return sizeof(float) * kTile * (3 * DPL * 32 + 1);
}
template <int DPL>
size_t backward_smem() {
  return sizeof(float) * kTile * (4 * DPL * 32 + 2);
}
void fits(size_t bytes, const char* op) {
  if (bytes + 1024 > max_shared_memory())
    usage_fail(std::string("CUDA backend ") + op + ": needs " + std::to_string(bytes) +
               " bytes of shared memory per block, more than the device has (" +
               std::to_string(max_shared_memory()) + ")");
}

template <int DPL>
void forward_dpl(const Chunk& c, int B, Rows out, float* lse) {
  const size_t smem = forward_smem<DPL>();
  fits(smem, "attention_chunk_forward");
  allow_smem(chunk_forward_kernel<DPL>, smem, "cudaFuncSetAttribute (attention_chunk_forward)");
  const dim3 grid((c.n + kTile - 1) / kTile, B * c.heads);
  chunk_forward_kernel<DPL><<<grid, kThreads, smem, stream()>>>(c, out, lse);
  check_launch("attention_chunk_forward");
}

template <int DPL>
void backward_dpl(const Chunk& c, int B, Rows dout, const float* lse, const float* delta, Rows dq, Rows dk,
                  Rows dv) {
  const size_t smem = backward_smem<DPL>();
  fits(smem, "attention_chunk_backward");
  const int tiles = (c.n + kTile - 1) / kTile;
  allow_smem(chunk_dq_kernel<DPL>, smem, "cudaFuncSetAttribute (attention_chunk_backward dq)");
  chunk_dq_kernel<DPL><<<dim3(tiles, B * c.heads), kThreads, smem, stream()>>>(c, dout, lse, delta, dq);
  check_launch("attention_chunk_backward (dq)");
  allow_smem(chunk_dkv_kernel<DPL>, smem, "cudaFuncSetAttribute (attention_chunk_backward dk, dv)");
  chunk_dkv_kernel<DPL>
      <<<dim3(tiles, B * c.kv_heads), kThreads, smem, stream()>>>(c, dout, lse, delta, dk, dv);
  check_launch("attention_chunk_backward (dk, dv)");
}

}  // namespace

void attention_chunk_forward(const AttentionChunks& a, ChunkRows out, float* lse) {
  const Chunk c = chunk_of(a, "attention_chunk_forward");
  if (int64_t(a.B) * c.n <= 0) return;
  const Rows o = rows_of(out);
  if (c.hd <= 32) return forward_dpl<1>(c, a.B, o, lse);
  if (c.hd <= 64) return forward_dpl<2>(c, a.B, o, lse);
  if (c.hd <= 128) return forward_dpl<4>(c, a.B, o, lse);
  forward_dpl<8>(c, a.B, o, lse);
}

void attention_chunk_backward(const AttentionChunks& a, ChunkRows dout, const float* lse, const float* delta,
                              ChunkRows dq, ChunkRows dk, ChunkRows dv) {
  const Chunk c = chunk_of(a, "attention_chunk_backward");
  if (int64_t(a.B) * c.n <= 0) return;
  const Rows g = rows_of(dout), q = rows_of(dq), k = rows_of(dk), v = rows_of(dv);
  if (c.hd <= 32) return backward_dpl<1>(c, a.B, g, lse, delta, q, k, v);
  if (c.hd <= 64) return backward_dpl<2>(c, a.B, g, lse, delta, q, k, v);
  if (c.hd <= 128) return backward_dpl<4>(c, a.B, g, lse, delta, q, k, v);
  backward_dpl<8>(c, a.B, g, lse, delta, q, k, v);
}

void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                     const AttentionShape& shape) {
  const int64_t items = int64_t(B) * shape.heads * T;
  if (items <= 0 || shape.head_dim <= 0) return;
  delta_kernel<<<int((items + kWarps - 1) / kWarps), kThreads, 0, stream()>>>(
      delta, out, dout, T, shape.heads, shape.head_dim, items);
  check_launch("attention_delta");
}

}  // namespace forge::trainer::cuda::seam
