// The attention slot under context parallelism (context_parallel.h): ring attention over the cp group.
//
// Forward, on cp ranks: each holds its two chunks' q, k, v. Step s = 0 .. cp − 1 attends this rank's
// query chunks over the key/value chunks of rank r − s, merging into the running output by log-sum-exp
// (Backend::attention_chunk_forward); meanwhile that key/value message goes on to rank r + 1 and the next
// one arrives from r − 1. A chunk pair wholly in the future is not computed.
// Backward: the key/value chunks go round again; each step adds this rank's share of their gradient to an
// accumulator that travels with them, and after cp steps it is back at its owner. The document ids of every
// rank's rows are all-gathered once per call (one int per position).
#pragma once

#include "forge/trainer/attention.h"
#include "forge/trainer/comm.h"

#include <memory>
#include <vector>

namespace forge::trainer {

// Host buffers shared by a model's layers: one layer's ring runs at a time.
struct RingScratch {
  std::vector<float> kv[2], part, acc_out, acc_in, delta;
  std::vector<int32_t> segments;
};

class RingAttention final : public Attention {
 public:
  RingAttention(Comm& cp, std::shared_ptr<RingScratch> scratch, Backend& backend,
                const AttentionSettings& settings, std::unique_ptr<Linear> qkv, std::unique_ptr<Linear> proj,
                const AttentionWeights& weights, int slots, int rows, float* dqkv, float* datt);

 protected:
  void attend_forward(Act out, float* lse, ConstAct qkv, const DeviceBatch& batch, int B, int T) override;
  void attend_backward(float* dqkv, const float* dout, ConstAct qkv, ConstAct out, const float* lse,
                       const DeviceBatch& batch, int B, int T) override;

 private:
  // Every rank's document ids into scratch (empty: one document per row); and rank `src`'s.
  bool gather_segments(const DeviceBatch& batch, int B, int T);
  const int32_t* segments_of(int src, int B, int T) const;
  // This rank's k and v rows, packed [B*T, 2 kv_width], into `to`.
  void pack(const float* qkv, int rows, float* to) const;
  // The chunk pairs of a ring step whose keys some query may see: (query chunk, key chunk).
  std::vector<std::pair<int, int>> pairs(int src, int n) const;
  AttentionChunks chunks(const float* qkv, const float* kv, int src, int qc, int kc, bool docs, int B,
                         int T) const;

  Comm& cp_;
  std::shared_ptr<RingScratch> scratch_;
};

}  // namespace forge::trainer
