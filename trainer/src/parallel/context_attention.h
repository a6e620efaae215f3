// The attention slot under context parallelism (context_parallel.h): each rank holds two chunks of every
// sequence, and attention needs the whole sequence's keys. Two ways (parallel.cp_comm):
//
// ring (RingAttention). Step s = 0 .. cp − 1 attends this rank's query chunks over the key/value chunks of
// rank r − s, merging into the running output by log-sum-exp (Backend::attention_chunk_forward); meanwhile
// that key/value message goes on to rank r + 1 and the next one arrives from r − 1. A chunk pair wholly in
// the future is not computed. Backward sends the key/value chunks round again; each step adds this rank's
// share of their gradient to an accumulator that travels with them and is back at its owner after cp
// steps. The document ids of every rank's rows are all-gathered once per call (one int per position).
//
// a2a (AllToAllAttention, DeepSpeed-Ulysses). An all-to-all turns this rank's two chunks of every head into
// the whole sequences of 1/cp of the heads; the plain kernels attend over them (for those heads, the
// numbers of cp = 1); a second all-to-all turns the output back. Backward the same way round. Needs the
// rank's query and key/value heads to divide by cp; moves 4 all-to-alls of activations a layer, where the
// ring moves the key/value heads 3·cp − 2 times.
#pragma once

#include "forge/comm/comm.h"
#include "forge/trainer/attention.h"
#include "forge/trainer/spec.h"

#include <memory>
#include <vector>

namespace forge::trainer {

// Buffers shared by a model's layers (one layer's exchange runs at a time), in the backend's memory so that
// the exchanges and the chunk ops run where the activations are (a GPU's, a CPU's); the document ids are
// gathered on the host and copied there. The ring and the all-to-all work in FP32: in BF16 mode a layer's q,
// k, v and output are widened into wide_qkv and wide_out (BF16 values, exact) and the output rounded back
// once.
struct ContextScratch {
  Buffer<float> kv[2], acc[2], delta;         // ring
  Buffer<float> send, recv, out, dout, dqkv;  // all-to-all
  Buffer<float> wide_qkv, wide_out;           // BF16 mode
  Buffer<int32_t> segments, doc_start;        // the host's below, copied
  std::vector<int32_t> host_segments, host_doc_start;
  size_t bytes() const;
  // Sized for one layer of `rows` rows and `shape`'s heads on cp ranks (the largest asked for), before the
  // first step, so the plan table shows them.
  void reserve(Backend& backend, ContextComm kind, int rows, const AttentionShape& shape, int cp, bool bf16);
};

class RingAttention final : public Attention {
 public:
  RingAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch, Backend& backend,
                const AttentionSettings& settings, std::unique_ptr<Linear> qkv, std::unique_ptr<Linear> proj,
                const AttentionWeights& weights, int slots, int rows, float* dqkv, float* datt);

 protected:
  void attend_forward(int slot, Act out, float* lse, ConstAct qkv, const DeviceBatch& batch, int B,
                      int T) override;
  void attend_backward(int slot, float* dqkv, const float* dout, ConstAct qkv, ConstAct out, const float* lse,
                       const DeviceBatch& batch, int B, int T) override;

 private:
  // This rank's k and v rows, packed [B*T, 2 kv_width], into `to`.
  void pack(const float* qkv, int rows, float* to);
  // The chunk pairs of a ring step whose keys some query may see: (query chunk, key chunk).
  std::vector<std::pair<int, int>> pairs(int src, int n) const;
  AttentionChunks chunks(const float* qkv, const float* kv, int src, int qc, int kc, bool docs, int B,
                         int T) const;

  comm::Comm& cp_;
  std::shared_ptr<ContextScratch> scratch_;
};

class AllToAllAttention final : public Attention {
 public:
  AllToAllAttention(comm::Comm& cp, std::shared_ptr<ContextScratch> scratch, Backend& backend,
                    const AttentionSettings& settings, std::unique_ptr<Linear> qkv,
                    std::unique_ptr<Linear> proj, const AttentionWeights& weights, int slots, int rows,
                    float* dqkv, float* datt);

 protected:
  void attend_forward(int slot, Act out, float* lse, ConstAct qkv, const DeviceBatch& batch, int B,
                      int T) override;
  void attend_backward(int slot, float* dqkv, const float* dout, ConstAct qkv, ConstAct out, const float* lse,
                       const DeviceBatch& batch, int B, int T) override;

 public:
  size_t activation_bytes() const override;  // the base's and the whole-sequence heads kept per slot

 private:
  enum class Rows { kQkv, kOut };  // which columns a head group has: q | k | v heads, or output heads
  // This rank's chunks of every head [B*T, width] <-> whole sequences of head group `rank`
  // [B, cp*T, width / cp], through one all-to-all each.
  void to_heads(const float* local, float* whole, Rows kind, int B, int T);
  void to_chunks(const float* whole, float* local, Rows kind, int B, int T);
  // (offset, width) of head group g's columns in a row of `kind`.
  std::vector<std::pair<int, int>> columns(Rows kind, int g) const;
  // The whole sequences' document starts (null: one document per row).
  const int32_t* doc_starts(const DeviceBatch& batch, int B, int T);
  AttentionShape group_shape() const;

  comm::Comm& cp_;
  std::shared_ptr<ContextScratch> scratch_;
  std::vector<Buffer<float>> qkv_, lse_;  // per slot: the head group's whole-sequence q, k, v and lse
};

}  // namespace forge::trainer
