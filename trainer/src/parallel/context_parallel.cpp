// Context parallelism: the batch's split over the cp ranks and ring attention (ring_attention.h).
#include "forge/trainer/context_parallel.h"

#include "ring_attention.h"

#include "forge/trainer/loss.h"
#include "forge/trainer/trace.h"

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
  out.sample_ids = full.sample_ids;
  out.epochs = full.epochs;
  out.domains = full.domains;
  return out;
}

namespace {
constexpr int kKvTag = 40, kGradTag = 41;
constexpr float kNoKey = -std::numeric_limits<float>::infinity();
}  // namespace

RingAttention::RingAttention(Comm& cp, std::shared_ptr<RingScratch> scratch, Backend& backend,
                             const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
                             std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots,
                             int rows, float* dqkv, float* datt)
    : Attention(backend, settings, std::move(qkv), std::move(proj), weights, slots, rows, dqkv, datt),
      cp_(cp),
      scratch_(std::move(scratch)) {}

bool RingAttention::gather_segments(const DeviceBatch& batch, int B, int T) {
  if (batch.host == nullptr || batch.host->segments.empty()) return false;
  std::vector<int32_t>& all = scratch_->segments;
  all.resize(size_t(cp_.size()) * size_t(B) * size_t(T));
  cp_.all_gather(batch.host->segments.data(), all.data(), size_t(B) * size_t(T), CommType::kI32)->wait();
  return true;
}

const int32_t* RingAttention::segments_of(int src, int B, int T) const {
  return scratch_->segments.data() + size_t(src) * size_t(B) * size_t(T);
}

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
    c.q_seg = segments_of(cp_.rank(), B, T) + qc * n;
    c.k_seg = segments_of(src, B, T) + kc * n;
    c.seg_seq = T;
  }
  c.stats_seq = T;
  return c;
}

void RingAttention::attend_forward(Act out_act, float* lse, ConstAct qkv_act, const DeviceBatch& batch, int B,
                                   int T) {
  TraceSpan span("ring attention forward", "compute");
  const AttentionShape& s = settings().shape;
  const float* qkv = qkv_act.f32();
  float* out = out_act.f32();
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, QW = s.q_width(), rows = B * T;
  const size_t count = size_t(rows) * 2 * size_t(s.kv_width());
  RingScratch& k = *scratch_;
  const bool docs = gather_segments(batch, B, T);
  for (auto& buffer : k.kv) buffer.resize(count);
  pack(qkv, rows, k.kv[0].data());
  std::fill(out, out + int64_t(rows) * QW, 0.0f);
  std::fill(lse, lse + int64_t(rows) * s.heads, kNoKey);
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    RequestPtr received, sent;
    if (step + 1 < P) {  // the next step's keys arrive while this one computes
      received = cp_.recv(k.kv[(step + 1) % 2].data(), count, CommType::kF32, (r + P - 1) % P, kKvTag);
      sent = cp_.send(kv, count, CommType::kF32, (r + 1) % P, kKvTag);
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

void RingAttention::attend_backward(float* dqkv, const float* dout, ConstAct qkv_act, ConstAct out_act,
                                    const float* lse, const DeviceBatch& batch, int B, int T) {
  TraceSpan span("ring attention backward", "compute");
  const AttentionShape& s = settings().shape;
  const float* qkv = qkv_act.f32();
  const float* out = out_act.f32();
  const int P = cp_.size(), r = cp_.rank(), n = T / 2, W = s.qkv_width(), QW = s.q_width(), hd = s.head_dim;
  const int rows = B * T, KV = 2 * s.kv_width();
  const size_t count = size_t(rows) * size_t(KV);
  RingScratch& k = *scratch_;
  const bool docs = gather_segments(batch, B, T);
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
  for (auto& buffer : k.kv) buffer.resize(count);
  for (auto* buffer : {&k.part, &k.acc_out, &k.acc_in}) buffer->resize(count);
  pack(qkv, rows, k.kv[0].data());
  std::fill(dqkv, dqkv + int64_t(rows) * W, 0.0f);
  const int left = (r + P - 1) % P, right = (r + 1) % P;
  RequestPtr grad_in, grad_out;
  for (int step = 0; step < P; ++step) {
    const int src = (r - step + P) % P;
    const float* kv = k.kv[step % 2].data();
    RequestPtr received, sent;
    if (step + 1 < P) {
      received = cp_.recv(k.kv[(step + 1) % 2].data(), count, CommType::kF32, left, kKvTag);
      sent = cp_.send(kv, count, CommType::kF32, right, kKvTag);
    }
    // This rank's share of rank src's key/value gradients, then the share of the ranks before it.
    std::fill(k.part.begin(), k.part.end(), 0.0f);
    for (const auto& [qc, kc] : pairs(src, n)) {
      const ChunkRows dk{k.part.data() + int64_t(kc) * n * KV, int64_t(T) * KV, KV};
      backend_.attention_chunk_backward(
          chunks(qkv, kv, src, qc, kc, docs, B, T),
          {const_cast<float*>(dout) + int64_t(qc) * n * QW, int64_t(T) * QW, QW}, lse + qc * n,
          k.delta.data() + qc * n, {dqkv + int64_t(qc) * n * W, int64_t(T) * W, W}, dk,
          {dk.base + s.kv_width(), dk.seq, KV});
    }
    if (grad_in) grad_in->wait();
    if (grad_out) grad_out->wait();
    for (size_t i = 0; i < count; ++i) k.acc_out[i] = step > 0 ? k.acc_in[i] + k.part[i] : k.part[i];
    grad_out = cp_.send(k.acc_out.data(), count, CommType::kF32, right, kGradTag);
    grad_in = cp_.recv(k.acc_in.data(), count, CommType::kF32, left, kGradTag);
    if (received) {
      received->wait();
      sent->wait();
    }
  }
  // After cp steps this rank's own key/value gradients, summed over every rank's queries, are back.
  grad_in->wait();
  grad_out->wait();
  for (int row = 0; row < rows; ++row)
    std::memcpy(dqkv + int64_t(row) * W + QW, k.acc_in.data() + int64_t(row) * KV,
                sizeof(float) * size_t(KV));
}

}  // namespace forge::trainer
