// Context parallelism: the batch's split over the cp ranks, ring and all-to-all attention
// (context_attention.h).
#include "forge/trainer/context_parallel.h"

#include "context_attention.h"

#include "forge/common/trace.h"
#include "forge/trainer/loss.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace forge::trainer {

MicroBatch context_shard(const MicroBatch& full, int cp, int rank) {
  if (cp < 1 || rank < 0 || rank >= cp || full.seq_len % (2 * cp) != 0)
    throw std::invalid_argument("context_shard: seq_len must divide into 2 x cp chunks");
  const int n = full.seq_len / (2 * cp);
  MicroBatch out;
  out.rows = full.rows;
  out.seq_len = 2 * n;
  const size_t size = out.size();
  out.inputs.reserve(size);
  out.targets.reserve(size);
  out.positions.reserve(size);
  for (int r = 0; r < full.rows; ++r)
    for (int c = 0; c < 2; ++c)
      for (int t = context_chunk_first(cp, rank, c, n), end = t + n; t < end; ++t) {
        const size_t i = size_t(r) * size_t(full.seq_len) + size_t(t);
        out.inputs.push_back(full.inputs[i]);
        out.targets.push_back(full.target(i));
        out.positions.push_back(full.positions.empty() ? t : full.positions[i]);
        if (!full.weights.empty()) out.weights.push_back(full.weights[i]);
        if (!full.segments.empty()) out.segments.push_back(full.segments[i]);
      }
  out.reference_logps = full.reference_logps;  // per row: a DPO pair's
  out.sample_ids = full.sample_ids;
  out.epochs = full.epochs;
  out.domains = full.domains;
  return out;
}

namespace {
constexpr int kKvTag = 40, kGradTag = 41;
constexpr float kNoKey = -std::numeric_limits<float>::infinity();

template <typename T>
size_t buffer_bytes(const Buffer<T>& b) {
  return b.size() * sizeof(T);
}

// The document ids of every cp rank's rows, all-gathered into scratch.host_segments ([cp][B*T]) and copied
// to scratch.segments; false when the batch has none (one document per row).
bool gather_segments(comm::Comm& cp, Backend& backend, ContextScratch& scratch, const DeviceBatch& batch,
                     int B, int T) {
  if (batch.host == nullptr || batch.host->segments.empty()) return false;
  const size_t n = size_t(cp.size()) * size_t(B) * size_t(T);
  scratch.host_segments.resize(n);
  cp.all_gather(batch.host->segments.data(), scratch.host_segments.data(), size_t(B) * size_t(T),
                comm::CommType::kI32)
      ->wait();
  backend.copy_from_host(scratch.segments.data(), scratch.host_segments.data(), n * sizeof(int32_t));
  return true;
}

// The FP32 values of a layer's activations: their own, or (BF16) widened into `wide`.
const float* widened(Backend& backend, ConstAct a, size_t n, Buffer<float>& wide) {
  if (!a.bf16) return a.f32();
  backend.convert(wide.data(), a, n);
  return wide.data();
}
}  // namespace

size_t ContextScratch::bytes() const {
  size_t n = buffer_bytes(segments) + buffer_bytes(doc_start) +
             (host_segments.capacity() + host_doc_start.capacity()) * sizeof(int32_t);
  for (const auto* b :
       {&kv[0], &kv[1], &acc[0], &acc[1], &delta, &send, &recv, &out, &dout, &dqkv, &wide_qkv, &wide_out})
    n += buffer_bytes(*b);
  return n;
}

void ContextScratch::reserve(Backend& backend, ContextComm kind, int rows, const AttentionShape& s, int cp,
                             bool bf16) {
  const size_t n = size_t(rows), kv = n * 2 * size_t(s.kv_width()), qkv = n * size_t(s.qkv_width());
  if (kind == ContextComm::kRing) {
    for (auto* b : {&this->kv[0], &this->kv[1], &acc[0], &acc[1]}) backend.grow(*b, kv);
    backend.grow(delta, n * size_t(s.heads));
  } else {
    for (auto* b : {&send, &recv, &dqkv}) backend.grow(*b, qkv);
    for (auto* b : {&out, &dout}) backend.grow(*b, n * size_t(s.q_width()));
    backend.grow(doc_start, n * size_t(cp));
    host_doc_start.reserve(n * size_t(cp));
  }
  if (bf16) {
    backend.grow(wide_qkv, qkv);
    backend.grow(wide_out, n * size_t(s.q_width()));
  }
  backend.grow(segments, n * size_t(cp));
  host_segments.reserve(n * size_t(cp));
}

// ---- ring ----

RingAttention::RingAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch, Backend& backend,
                             const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
                             std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots,
                             int rows, float* dqkv, float* datt)
    : Attention(backend, settings, std::move(qkv), std::move(proj), weights, slots, rows, dqkv, datt),
      cp_(cp),
      scratch_(std::move(scratch)) {}

void RingAttention::pack(const float* qkv, int rows, float* to) {
  const AttentionShape& s = settings().shape;
  const int KV = 2 * s.kv_width();
  backend_.copy_rows(to, KV, qkv + s.q_width(), s.qkv_width(), KV, rows);
}

std::vector<std::pair<int, int>> RingAttention::pairs(int src, int n) const {
  const int P = cp_.size(), r = cp_.rank(), window = settings().shape.window;
  std::vector<std::pair<int, int>> out;
  for (int qc = 0; qc < 2; ++qc)
    for (int kc = 0; kc < 2; ++kc) {
      const int q_first = context_chunk_first(P, r, qc, n), k_first = context_chunk_first(P, src, kc, n);
      if (k_first > q_first) continue;                                     // wholly in the future
      if (window > 0 && k_first + n - 1 < q_first - window + 1) continue;  // wholly out of the window
      out.emplace_back(qc, kc);
    }
  return out;
}

AttentionChunks RingAttention::chunks(const float* qkv, const float* kv, int src, int qc, int kc, bool docs,
                                      int B, int T) const {
  const AttentionShape& s = settings().shape;
  const int W = s.qkv_width(), KV = 2 * s.kv_width(), n = T / 2, P = cp_.size();
  AttentionChunks c;
  c.B = B;
  c.n = n;
  c.shape = s;
  c.q_first = context_chunk_first(P, cp_.rank(), qc, n);
  c.k_first = context_chunk_first(P, src, kc, n);
  c.q = {const_cast<float*>(qkv) + int64_t(qc) * n * W, int64_t(T) * W, W};
  c.k = {const_cast<float*>(kv) + int64_t(kc) * n * KV, int64_t(T) * KV, KV};
  c.v = {c.k.base + s.kv_width(), c.k.seq, KV};
  if (docs) {
    const int32_t* ids = scratch_->segments.data();
    c.q_seg = ids + int64_t(cp_.rank()) * B * T + qc * n;
    c.k_seg = ids + int64_t(src) * B * T + kc * n;
    c.seg_seq = T;
  }
  c.stats_seq = T;
  return c;
}

void RingAttention::attend_forward(int, Act out_act, float* lse, ConstAct qkv_act, const DeviceBatch& batch,
                                   int B, int T) {
  TraceSpan span("ring attention forward", "compute");
  const AttentionShape& s = settings().shape;
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, QW = s.q_width(), rows = B * T;
  const size_t count = size_t(rows) * 2 * size_t(s.kv_width());
  ContextScratch& k = *scratch_;
  const float* qkv = widened(backend_, qkv_act, size_t(rows) * size_t(s.qkv_width()), k.wide_qkv);
  float* out = out_act.bf16 ? k.wide_out.data() : out_act.f32();
  const bool docs = gather_segments(cp_, backend_, k, batch, B, T);
  pack(qkv, rows, k.kv[0].data());
  backend_.fill(out, 0.0f, size_t(rows) * size_t(QW));
  backend_.fill(lse, kNoKey, size_t(rows) * size_t(s.heads));
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    comm::RequestPtr next;  // the next step's keys arrive while this one computes
    if (step + 1 < P)
      next = cp_.exchange(kv, k.kv[(step + 1) % 2].data(), count, comm::CommType::kF32, (r + 1) % P,
                          (r + P - 1) % P, kKvTag);
    for (const auto& [qc, kc] : pairs(src, n))
      backend_.attention_chunk_forward(chunks(qkv, kv, src, qc, kc, docs, B, T),
                                       {out + int64_t(qc) * n * QW, int64_t(T) * QW, QW}, lse + qc * n);
    if (next) next->wait();
  }
  if (out_act.bf16) backend_.convert(out_act, out, size_t(rows) * size_t(QW));
}

void RingAttention::attend_backward(int, float* dqkv, const float* dout, ConstAct qkv_act, ConstAct out_act,
                                    const float* lse, const DeviceBatch& batch, int B, int T) {
  TraceSpan span("ring attention backward", "compute");
  const AttentionShape& s = settings().shape;
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, W = s.qkv_width(), QW = s.q_width();
  const int rows = B * T, KV = 2 * s.kv_width();
  const size_t count = size_t(rows) * size_t(KV);
  ContextScratch& k = *scratch_;
  const float* qkv = widened(backend_, qkv_act, size_t(rows) * size_t(W), k.wide_qkv);
  const float* out = widened(backend_, out_act, size_t(rows) * size_t(QW), k.wide_out);
  const bool docs = gather_segments(cp_, backend_, k, batch, B, T);
  backend_.attention_delta(k.delta.data(), out, dout, B, T, s);  // [B, heads, T], as lse
  pack(qkv, rows, k.kv[0].data());
  backend_.fill(dqkv, 0.0f, size_t(rows) * size_t(W));
  backend_.fill(k.acc[0].data(), 0.0f, count);
  const int left = (r + P - 1) % P, right = (r + 1) % P;
  // The accumulator of rank src's key/value gradients arrives from the left (the ranks before this one
  // have added theirs), this rank adds its share into it, and it goes on to the right: two buffers, one
  // being sent while the other receives and is added to.
  comm::RequestPtr grads;
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    float* acc = k.acc[step % 2].data();
    comm::RequestPtr next;
    if (step + 1 < P)
      next = cp_.exchange(kv, k.kv[(step + 1) % 2].data(), count, comm::CommType::kF32, right, left, kKvTag);
    if (grads) grads->wait();  // acc has arrived, and the other buffer is sent
    for (const auto& [qc, kc] : pairs(src, n)) {
      const ChunkRows dk{acc + int64_t(kc) * n * KV, int64_t(T) * KV, KV};
      backend_.attention_chunk_backward(
          chunks(qkv, kv, src, qc, kc, docs, B, T),
          {const_cast<float*>(dout) + int64_t(qc) * n * QW, int64_t(T) * QW, QW}, lse + qc * n,
          k.delta.data() + qc * n, {dqkv + int64_t(qc) * n * W, int64_t(T) * W, W}, dk,
          {dk.base + s.kv_width(), dk.seq, KV});
    }
    grads =
        cp_.exchange(acc, k.acc[(step + 1) % 2].data(), count, comm::CommType::kF32, right, left, kGradTag);
    if (next) next->wait();
  }
  // After cp steps this rank's own key/value gradients, summed over every rank's queries, are back.
  grads->wait();
  backend_.copy_rows(dqkv + QW, W, k.acc[P % 2].data(), KV, KV, rows);
}

// ---- all-to-all ----

AllToAllAttention::AllToAllAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch,
                                     Backend& backend, const AttentionSettings& settings,
                                     std::unique_ptr<Linear> qkv, std::unique_ptr<Linear> proj,
                                     const AttentionWeights& weights, int slots, int rows, float* dqkv,
                                     float* datt)
    : Attention(backend, settings, std::move(qkv), std::move(proj), weights, slots, rows, dqkv, datt),
      cp_(cp),
      scratch_(std::move(scratch)) {
  const AttentionShape& s = settings.shape;
  if (s.heads % cp.size() != 0 || s.kv_heads % cp.size() != 0)
    throw std::invalid_argument("AllToAllAttention: the rank's heads do not divide by cp (spec validation)");
  for (int i = 0; i < slots; ++i) {
    qkv_.push_back(backend.alloc<float>(size_t(rows) * size_t(s.qkv_width())));
    lse_.push_back(backend.alloc<float>(size_t(rows) * size_t(s.heads)));
  }
}

size_t AllToAllAttention::activation_bytes() const {
  size_t n = Attention::activation_bytes();
  for (size_t i = 0; i < qkv_.size(); ++i) n += (qkv_[i].size() + lse_[i].size()) * sizeof(float);
  return n;
}

AttentionShape AllToAllAttention::group_shape() const {
  AttentionShape g = settings().shape;
  g.heads /= cp_.size();
  g.kv_heads /= cp_.size();
  return g;
}

std::vector<std::pair<int, int>> AllToAllAttention::columns(Rows kind, int g) const {
  const AttentionShape& s = settings().shape;
  const AttentionShape part = group_shape();
  const int q = part.q_width(), kv = part.kv_width();
  if (kind == Rows::kOut) return {{g * q, q}};
  return {{g * q, q}, {s.q_width() + g * kv, kv}, {s.q_width() + s.kv_width() + g * kv, kv}};
}

void AllToAllAttention::to_heads(const float* local, float* whole, Rows kind, int B, int T) {
  const AttentionShape& s = settings().shape;
  const int P = cp_.size(), n = T / 2, width = kind == Rows::kQkv ? s.qkv_width() : s.q_width();
  const int part = width / P, rows = B * T;
  const size_t block = size_t(rows) * size_t(part);
  ContextScratch& k = *scratch_;
  for (int g = 0; g < P; ++g) {  // head group g's columns of every row, back to back
    int at = 0;
    for (const auto& [from, w] : columns(kind, g)) {
      backend_.copy_rows(k.send.data() + int64_t(g) * block + at, part, local + from, width, w, rows);
      at += w;
    }
  }
  const std::vector<size_t> counts(size_t(P), block);
  cp_.all_to_all_v(k.send.data(), counts.data(), k.recv.data(), counts.data(), comm::CommType::kF32)->wait();
  // Rank i's block holds its chunks' rows of this rank's heads: into their places in the sequences.
  for (int i = 0; i < P; ++i)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < 2; ++c)
        backend_.copy(whole + (int64_t(b) * P * T + context_chunk_first(P, i, c, n)) * part,
                      k.recv.data() + int64_t(i) * block + (int64_t(b) * T + c * n) * part,
                      sizeof(float) * size_t(n) * size_t(part));
}

void AllToAllAttention::to_chunks(const float* whole, float* local, Rows kind, int B, int T) {
  const AttentionShape& s = settings().shape;
  const int P = cp_.size(), n = T / 2, width = kind == Rows::kQkv ? s.qkv_width() : s.q_width();
  const int part = width / P, rows = B * T;
  const size_t block = size_t(rows) * size_t(part);
  ContextScratch& k = *scratch_;
  for (int i = 0; i < P; ++i)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < 2; ++c)
        backend_.copy(k.send.data() + int64_t(i) * block + (int64_t(b) * T + c * n) * part,
                      whole + (int64_t(b) * P * T + context_chunk_first(P, i, c, n)) * part,
                      sizeof(float) * size_t(n) * size_t(part));
  const std::vector<size_t> counts(size_t(P), block);
  cp_.all_to_all_v(k.send.data(), counts.data(), k.recv.data(), counts.data(), comm::CommType::kF32)->wait();
  for (int g = 0; g < P; ++g) {
    int at = 0;
    for (const auto& [to, w] : columns(kind, g)) {
      backend_.copy_rows(local + to, width, k.recv.data() + int64_t(g) * block + at, part, w, rows);
      at += w;
    }
  }
}

const int32_t* AllToAllAttention::doc_starts(const DeviceBatch& batch, int B, int T) {
  ContextScratch& k = *scratch_;
  if (!gather_segments(cp_, backend_, k, batch, B, T)) return nullptr;
  const int P = cp_.size(), n = T / 2, whole = P * T;
  k.host_doc_start.resize(size_t(B) * size_t(whole));
  std::vector<int32_t> ids(static_cast<size_t>(whole));
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < 2; ++c)
        std::memcpy(ids.data() + context_chunk_first(P, i, c, n),
                    k.host_segments.data() + (int64_t(i) * B + b) * T + c * n, sizeof(int32_t) * size_t(n));
    int32_t* starts = k.host_doc_start.data() + int64_t(b) * whole;
    for (int t = 0; t < whole; ++t)
      starts[t] = t == 0 || ids[size_t(t)] != ids[size_t(t) - 1] ? t : starts[t - 1];
  }
  backend_.copy_from_host(k.doc_start.data(), k.host_doc_start.data(),
                          k.host_doc_start.size() * sizeof(int32_t));
  return k.doc_start.data();
}

void AllToAllAttention::attend_forward(int slot, Act out_act, float*, ConstAct qkv_act,
                                       const DeviceBatch& batch, int B, int T) {
  TraceSpan span("all-to-all attention forward", "compute");
  const AttentionShape& s = settings().shape;
  const int P = cp_.size();
  const size_t rows = size_t(B) * size_t(T);
  ContextScratch& k = *scratch_;
  float* qkv = qkv_[size_t(slot)].data();
  to_heads(widened(backend_, qkv_act, rows * size_t(s.qkv_width()), k.wide_qkv), qkv, Rows::kQkv, B, T);
  backend_.attention_forward(k.out.data(), lse_[size_t(slot)].data(), qkv, doc_starts(batch, B, T), B, P * T,
                             group_shape());
  float* out = out_act.bf16 ? k.wide_out.data() : out_act.f32();
  to_chunks(k.out.data(), out, Rows::kOut, B, T);
  if (out_act.bf16) backend_.convert(out_act, out, rows * size_t(s.q_width()));
}

void AllToAllAttention::attend_backward(int slot, float* dqkv, const float* dout, ConstAct, ConstAct out_act,
                                        const float*, const DeviceBatch& batch, int B, int T) {
  TraceSpan span("all-to-all attention backward", "compute");
  const AttentionShape& s = settings().shape;
  const int P = cp_.size();
  ContextScratch& k = *scratch_;
  const size_t rows = size_t(B) * size_t(T);
  to_heads(widened(backend_, out_act, rows * size_t(s.q_width()), k.wide_out), k.out.data(), Rows::kOut, B,
           T);
  to_heads(dout, k.dout.data(), Rows::kOut, B, T);
  backend_.attention_backward(k.dqkv.data(), k.dout.data(), qkv_[size_t(slot)].data(), k.out.data(),
                              lse_[size_t(slot)].data(), doc_starts(batch, B, T), B, P * T, group_shape());
  to_chunks(k.dqkv.data(), dqkv, Rows::kQkv, B, T);
}

}  // namespace forge::trainer
