// The reader's sample order: global stream position -> sample id, with no table (O(domains) memory).
//
// An epoch has E = sum of all windows positions. Domain d owns c_d of them: its window count n_d, or with
// blending weights the largest-remainder share of w_d / sum(w) * E. Position q of epoch e maps through a
// seeded permutation of [0, E) to a slot; the slot's domain draws its k-th sample from a seeded permutation
// of its n_d windows (pass k / n_d reshuffles a domain that is upsampled beyond one pass).
#pragma once

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

class SampleOrder {
 public:
  SampleOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights, uint64_t seed);
  uint64_t sample_at(uint64_t position) const;
  uint64_t epoch_length() const { return epoch_; }
  uint64_t windows() const { return total_windows_; }

 private:
  std::vector<uint64_t> windows_, first_id_, slot_start_;  // per domain; slot_start_ has one extra entry
  uint64_t epoch_ = 0, total_windows_ = 0, seed_ = 0;
};

}  // namespace forge::data
