// The reader's sample orders: global stream position -> sample id, with no table (O(domains) memory).
//
// An epoch has E = sum of all windows positions. Domain d owns c_d of them ("draws"): its window count n_d,
// or with blending weights the largest-remainder share of w_d / sum(w) * E. Draw k of a domain is in pass
// k / n_d; each pass is a fresh keyed permutation of the domain's n_d windows, so a domain upsampled beyond
// one pass is reshuffled each time. The two orders differ in how positions map to draws and draws to windows:
//
// GlobalOrder: position q of epoch e maps through a keyed permutation of [0, E) to a slot; slots are
// apportioned to domains in ranges, and the slot's domain takes its k-th draw from a keyed permutation of
// its windows. Every position is an independent random window: the best shuffle, and random 4-8 KB reads.
//
// BlockOrder: a pass of a domain cuts its windows, rotated by a keyed offset, into blocks of W consecutive
// windows (the last one shorter) and reads the full blocks in a keyed order, then the short one. The draws
// of a domain are cut into units of W (the last c_d mod W draws form its tail), so in a domain's first pass
// a unit is exactly one block. Per epoch, a keyed permutation of all F units is cut into groups of G
// units; a group's G*W positions take its units' draws in a keyed random order within the group. The tails
// of all domains (fewer than D*W draws) form one more group, inserted at a keyed group boundary. Reads are
// then random only inside G regions of W windows at a time (2G for a domain upsampled past one pass, whose
// later units straddle two blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace forge::data {

// A keyed bijection of [0, n): a 4-round Feistel network over the smallest even bit width covering n,
// cycle-walking the values that fall outside (fewer than 4 steps on average).
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t x) const;

 private:
  uint64_t n_, key_;
  int half_bits_;
  uint64_t half_mask_;
};

// What BlockOrder::fill learnt about the current epoch and group, kept by its caller between calls (one
// per stream of positions, used by one thread at a time) so that consecutive batches share it.
struct OrderMemo {
  struct Unit {
    bool known = false, contiguous = false;
    size_t d = 0;
    uint64_t first_draw = 0, base = 0;  // base: the window of first_draw, when contiguous
  };
  uint64_t epoch = UINT64_MAX, group = UINT64_MAX, tail_at = 0;
  Permutation units{1, 0}, in_group{1, 0};
  std::vector<Unit> unit;
};

class SampleOrder {
 public:
  virtual ~SampleOrder() = default;
  virtual uint64_t sample_at(uint64_t position) const = 0;
  // The sample ids of positions [first, first + count): sample_at of each, computed faster where the order
  // can share work between neighbouring positions.
  virtual void fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo) const;
  // How far ahead (in positions) prefetch_fill's windows are worth reading into cache; 0 = no such stream.
  virtual uint64_t prefetch_distance() const { return 0; }
  // The same windows as fill, but each group's in the order they lie in memory: streaming them into cache
  // one group ahead lets the shuffled reads inside a group hit the cache.
  virtual void prefetch_fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo) const {
    fill(first, count, out, memo);
  }
  uint64_t epoch_length() const { return epoch_; }
  uint64_t windows() const { return total_windows_; }

 protected:
  SampleOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights, uint64_t seed);

  std::vector<uint64_t> windows_, first_id_, draws_;  // per domain: n_d, first sample id, c_d
  uint64_t epoch_ = 0, total_windows_ = 0, seed_ = 0;
};

class GlobalOrder final : public SampleOrder {
 public:
  GlobalOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights, uint64_t seed);
  uint64_t sample_at(uint64_t position) const override;

 private:
  std::vector<uint64_t> slot_start_;  // per domain, plus one extra entry
};

class BlockOrder final : public SampleOrder {
 public:
  // block_windows = W >= 1, group_blocks = G >= 1.
  BlockOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights, uint64_t seed,
             uint64_t block_windows, uint64_t group_blocks);
  uint64_t sample_at(uint64_t position) const override;
  void fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo) const override {
    fill(first, count, out, memo, true);
  }
  uint64_t prefetch_distance() const override { return w_ * g_; }
  void prefetch_fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo) const override {
    fill(first, count, out, memo, false);
  }

 private:
  void fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo, bool shuffled) const;
  // The window (within its domain) of draw k of domain d in epoch e.
  uint64_t window_of_draw(size_t d, uint64_t epoch, uint64_t k) const;

  uint64_t w_, g_;
  std::vector<uint64_t> unit_start_, tail_start_;  // per domain, plus one extra entry
  uint64_t units_ = 0, tail_ = 0, groups_ = 0;     // F, T = sum of tails, ceil(F / G)
};

}  // namespace forge::data
