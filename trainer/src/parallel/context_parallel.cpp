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
size_t capacity_bytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}
}  // namespace

size_t ContextScratch::bytes() const {
  size_t n = capacity_bytes(delta) + capacity_bytes(segments) + capacity_bytes(doc_start);
  for (const auto* v : {&kv[0], &kv[1], &acc[0], &acc[1], &send, &recv, &out, &dout, &dqkv})
    n += capacity_bytes(*v);
  return n;
}

void ContextScratch::reserve(ContextComm kind, int rows, const AttentionShape& s, int cp) {
  const size_t n = size_t(rows), kv = n * 2 * size_t(s.kv_width()), qkv = n * size_t(s.qkv_width());
  if (kind == ContextComm::kRing) {
    for (auto* v : {&this->kv[0], &this->kv[1], &acc[0], &acc[1]}) v->reserve(kv);
    delta.reserve(n * size_t(s.heads));
  } else {
    for (auto* v : {&send, &recv, &dqkv}) v->reserve(qkv);
    for (auto* v : {&out, &dout}) v->reserve(n * size_t(s.q_width()));
    doc_start.reserve(n * size_t(cp));
  }
  segments.reserve(n * size_t(cp));
}

bool gather_segments(comm::Comm& cp, ContextScratch& scratch, const DeviceBatch& batch, int B, int T) {
  if (batch.host == nullptr || batch.host->segments.empty()) return false;
  scratch.segments.resize(size_t(cp.size()) * size_t(B) * size_t(T));
  cp.all_gather(batch.host->segments.data(), scratch.segments.data(), size_t(B) * size_t(T),
                comm::CommType::kI32)
      ->wait();
  return true;
}

// ---- ring ----

RingAttention::RingAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch, Backend& backend,
                             const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
                             std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots,
                             int rows, float* dqkv, float* datt)
    : Attention(backend, settings, std::move(qkv), std::move(proj), weights, slots, rows, dqkv, datt),
      cp_(cp),
      scratch_(std::move(scratch)) {}

void RingAttention::pack(const float* qkv, int rows, float* to) const {
  const AttentionShape& s = settings().shape;
  const int W = s.qkv_width(), KV = 2 * s.kv_width();
  for (int r = 0; r < rows; ++r)
    std::memcpy(to + int64_t(r) * KV, qkv + int64_t(r) * W + s.q_width(), sizeof(float) * size_t(KV));
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
  const float* qkv = qkv_act.f32();
  float* out = out_act.f32();
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, QW = s.q_width(), rows = B * T;
  const size_t count = size_t(rows) * 2 * size_t(s.kv_width());
  ContextScratch& k = *scratch_;
  const bool docs = gather_segments(cp_, k, batch, B, T);
  for (auto& buffer : k.kv) buffer.resize(count);
  pack(qkv, rows, k.kv[0].data());
  std::fill(out, out + int64_t(rows) * QW, 0.0f);
  std::fill(lse, lse + int64_t(rows) * s.heads, kNoKey);
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    comm::RequestPtr received, sent;
    if (step + 1 < P) {  // the next step's keys arrive while this one computes
      received = cp_.recv(k.kv[(step + 1) % 2].data(), count, comm::CommType::kF32, (r + P - 1) % P, kKvTag);
      sent = cp_.send(kv, count, comm::CommType::kF32, (r + 1) % P, kKvTag);
    }
    for (const auto& [qc, kc] : pairs(src, n))
      backend_.attention_chunk_forward(chunks(qkv, kv, src, qc, kc, docs, B, T),
                                       {out + int64_t(qc) * n * QW, int64_t(T) * QW, QW}, lse + qc * n);
    if (received) {
      received->wait();
      sent->wait();
    }
  }
}

void RingAttention::attend_backward(int, float* dqkv, const float* dout, ConstAct qkv_act, ConstAct out_act,
                                    const float* lse, const DeviceBatch& batch, int B, int T) {
  TraceSpan span("ring attention backward", "compute");
  const AttentionShape& s = settings().shape;
  const float* qkv = qkv_act.f32();
  const float* out = out_act.f32();
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, W = s.qkv_width(), QW = s.q_width(), hd = s.head_dim;
  const int rows = B * T, KV = 2 * s.kv_width();
  const size_t count = size_t(rows) * size_t(KV);
  ContextScratch& k = *scratch_;
  const bool docs = gather_segments(cp_, k, batch, B, T);
  // delta = rowsum(dout * out) per head and row, in the lse layout [B, heads, T].
  k.delta.resize(size_t(rows) * size_t(s.heads));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < T; ++t) {
        const int64_t row = (int64_t(b) * T + t) * QW + h * hd;
        float d = 0;
        for (int c = 0; c < hd; ++c) d += out[row + c] * dout[row + c];
        k.delta[(size_t(b) * size_t(s.heads) + size_t(h)) * size_t(T) + size_t(t)] = d;
      }
  for (auto* buffer : {&k.kv[0], &k.kv[1], &k.acc[0], &k.acc[1]}) buffer->resize(count);
  pack(qkv, rows, k.kv[0].data());
  std::fill(dqkv, dqkv + int64_t(rows) * W, 0.0f);
  const int left = (r + P - 1) % P, right = (r + 1) % P;
  // The accumulator of rank src's key/value gradients arrives from the left (the ranks before this one
  // have added theirs), this rank adds its share into it, and it goes on to the right: two buffers, one
  // being sent while the other receives and is added to.
  comm::RequestPtr grad_in, grad_out;
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    float* acc = k.acc[step % 2].data();
    comm::RequestPtr received, sent;
    if (step + 1 < P) {
      received = cp_.recv(k.kv[(step + 1) % 2].data(), count, comm::CommType::kF32, left, kKvTag);
      sent = cp_.send(kv, count, comm::CommType::kF32, right, kKvTag);
    }
    if (grad_in)
      grad_in->wait();
    else
      std::fill(acc, acc + count, 0.0f);
    for (const auto& [qc, kc] : pairs(src, n)) {
      const ChunkRows dk{acc + int64_t(kc) * n * KV, int64_t(T) * KV, KV};
      backend_.attention_chunk_backward(
          chunks(qkv, kv, src, qc, kc, docs, B, T),
          {const_cast<float*>(dout) + int64_t(qc) * n * QW, int64_t(T) * QW, QW}, lse + qc * n,
          k.delta.data() + qc * n, {dqkv + int64_t(qc) * n * W, int64_t(T) * W, W}, dk,
          {dk.base + s.kv_width(), dk.seq, KV});
    }
    if (grad_out) grad_out->wait();  // the other buffer is free to receive into
    grad_out = cp_.send(acc, count, comm::CommType::kF32, right, kGradTag);
    grad_in = cp_.recv(k.acc[(step + 1) % 2].data(), count, comm::CommType::kF32, left, kGradTag);
    if (received) {
      received->wait();
      sent->wait();
    }
  }
  // After cp steps this rank's own key/value gradients, summed over every rank's queries, are back.
  grad_in->wait();
  grad_out->wait();
  const float* own = k.acc[P % 2].data();
  for (int row = 0; row < rows; ++row)
    std::memcpy(dqkv + int64_t(row) * W + QW, own + int64_t(row) * KV, sizeof(float) * size_t(KV));
}

// ---- all-to-all ----

AllToAllAttention::AllToAllAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch,
                                     Backend& backend, const AttentionSettings& settings,
                                     std::unique_ptr<Linear> qkv, std::unique_ptr<Linear> proj,
                                     const AttentionWeights& weights, int slots, int rows, float* dqkv,
                                     float* datt)
    : Attention(backend, settings, std::move(qkv), std::move(proj), weights, slots, rows, dqkv, datt),
      cp_(cp),
      scratch_(std::move(scratch)),
      qkv_(size_t(slots)),
      lse_(size_t(slots)) {
  const AttentionShape& s = settings.shape;
  if (s.heads % cp.size() != 0 || s.kv_heads % cp.size() != 0)
    throw std::invalid_argument("AllToAllAttention: the rank's heads do not divide by cp (spec validation)");
  for (int i = 0; i < slots; ++i) {
    qkv_[size_t(i)].resize(size_t(rows) * size_t(s.qkv_width()));
    lse_[size_t(i)].resize(size_t(rows) * size_t(s.heads));
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
  const int part = width / P;
  const size_t block = size_t(B) * size_t(T) * size_t(part);
  ContextScratch& k = *scratch_;
  k.send.resize(block * size_t(P));
  k.recv.resize(block * size_t(P));
  float* to = k.send.data();
  for (int g = 0; g < P; ++g)
    for (int row = 0; row < B * T; ++row)
      for (const auto& [at, w] : columns(kind, g)) {
        std::memcpy(to, local + int64_t(row) * width + at, sizeof(float) * size_t(w));
        to += w;
      }
  const std::vector<size_t> counts(size_t(P), block);
  cp_.all_to_all_v(k.send.data(), counts.data(), k.recv.data(), counts.data(), comm::CommType::kF32)->wait();
  // Rank i's block holds its chunks' rows of this rank's heads: into their places in the sequences.
  for (int i = 0; i < P; ++i)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < 2; ++c)
        std::memcpy(whole + (int64_t(b) * P * T + context_chunk_first(P, i, c, n)) * part,
                    k.recv.data() + int64_t(i) * block + (int64_t(b) * T + c * n) * part,
                    sizeof(float) * size_t(n) * size_t(part));
}

void AllToAllAttention::to_chunks(const float* whole, float* local, Rows kind, int B, int T) {
  const AttentionShape& s = settings().shape;
  const int P = cp_.size(), n = T / 2, width = kind == Rows::kQkv ? s.qkv_width() : s.q_width();
  const int part = width / P;
  const size_t block = size_t(B) * size_t(T) * size_t(part);
  ContextScratch& k = *scratch_;
  k.send.resize(block * size_t(P));
  k.recv.resize(block * size_t(P));
  for (int i = 0; i < P; ++i)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < 2; ++c)
        std::memcpy(k.send.data() + int64_t(i) * block + (int64_t(b) * T + c * n) * part,
                    whole + (int64_t(b) * P * T + context_chunk_first(P, i, c, n)) * part,
                    sizeof(float) * size_t(n) * size_t(part));
  const std::vector<size_t> counts(size_t(P), block);
  cp_.all_to_all_v(k.send.data(), counts.data(), k.recv.data(), counts.data(), comm::CommType::kF32)->wait();
  const float* from = k.recv.data();
  for (int g = 0; g < P; ++g)
    for (int row = 0; row < B * T; ++row)
      for (const auto& [at, w] : columns(kind, g)) {
        std::memcpy(local + int64_t(row) * width + at, from, sizeof(float) * size_t(w));
        from += w;
      }
}

const int32_t* AllToAllAttention::doc_starts(const DeviceBatch& batch, int B, int T) {
  ContextScratch& k = *scratch_;
  if (!gather_segments(cp_, k, batch, B, T)) return nullptr;
  const int P = cp_.size(), n = T / 2, whole = P * T;
  k.doc_start.resize(size_t(B) * size_t(whole));
  std::vector<int32_t> ids(static_cast<size_t>(whole));
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < 2; ++c)
        std::memcpy(ids.data() + context_chunk_first(P, i, c, n),
                    k.segments.data() + (int64_t(i) * B + b) * T + c * n, sizeof(int32_t) * size_t(n));
    int32_t* starts = k.doc_start.data() + int64_t(b) * whole;
    for (int t = 0; t < whole; ++t)
      starts[t] = t == 0 || ids[size_t(t)] != ids[size_t(t) - 1] ? t : starts[t - 1];
  }
  return k.doc_start.data();
}

void AllToAllAttention::attend_forward(int slot, Act out_act, float*, ConstAct qkv_act,
                                       const DeviceBatch& batch, int B, int T) {
  TraceSpan span("all-to-all attention forward", "compute");
  const int P = cp_.size();
  float* qkv = qkv_[size_t(slot)].data();
  float* lse = lse_[size_t(slot)].data();
  to_heads(qkv_act.f32(), qkv, Rows::kQkv, B, T);
  ContextScratch& k = *scratch_;
  k.out.resize(size_t(B) * size_t(T) * size_t(settings().shape.q_width()));
  backend_.attention_forward(k.out.data(), lse, qkv, doc_starts(batch, B, T), B, P * T, group_shape());
  to_chunks(k.out.data(), out_act.f32(), Rows::kOut, B, T);
}

void AllToAllAttention::attend_backward(int slot, float* dqkv, const float* dout, ConstAct, ConstAct out_act,
                                        const float*, const DeviceBatch& batch, int B, int T) {
  TraceSpan span("all-to-all attention backward", "compute");
  const AttentionShape& s = settings().shape;
  const int P = cp_.size();
  ContextScratch& k = *scratch_;
  const size_t rows = size_t(B) * size_t(T);
  k.out.resize(rows * size_t(s.q_width()));
  k.dout.resize(rows * size_t(s.q_width()));
  k.dqkv.resize(rows * size_t(s.qkv_width()));
  to_heads(out_act.f32(), k.out.data(), Rows::kOut, B, T);
  to_heads(dout, k.dout.data(), Rows::kOut, B, T);
  backend_.attention_backward(k.dqkv.data(), k.dout.data(), qkv_[size_t(slot)].data(), k.out.data(),
                              lse_[size_t(slot)].data(), doc_starts(batch, B, T), B, P * T, group_shape());
  to_chunks(k.dqkv.data(), dqkv, Rows::kQkv, B, T);
}

}  // namespace forge::trainer
