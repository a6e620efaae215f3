#include "sample_order.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace forge::data {

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(splitmix64(key)) {
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t Permutation::operator()(uint64_t x) const {
  if (n_ <= 1) return 0;
  do {
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(key_ ^ (right * 0x100000001b3ULL + round)) & half_mask_;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

SampleOrder::SampleOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights,
                         uint64_t seed)
    : windows_(windows), seed_(seed) {
  const size_t d = windows.size();
  first_id_.resize(d);
  for (size_t i = 0; i < d; ++i) {
    first_id_[i] = total_windows_;
    total_windows_ += windows[i];
  }
  epoch_ = total_windows_;
  // Largest-remainder apportionment of the epoch's positions to domains by weight.
  const double wsum = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (!(wsum > 0)) fail(ExitCode::kUsage, "reader: the domain weights of the selection sum to zero");
  std::vector<uint64_t> share(d);
  std::vector<std::pair<double, size_t>> remainders;
  uint64_t given = 0;
  for (size_t i = 0; i < d; ++i) {
    const double exact = weights[i] / wsum * static_cast<double>(epoch_);
    share[i] = static_cast<uint64_t>(std::floor(exact));
    given += share[i];
    remainders.emplace_back(exact - std::floor(exact), i);
  }
  std::sort(remainders.begin(), remainders.end(),
            [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (size_t k = 0; given < epoch_ && k < remainders.size(); ++k) {
    if (weights[remainders[k].second] <= 0) continue;
    ++share[remainders[k].second];
    ++given;
  }
  slot_start_.assign(d + 1, 0);
  for (size_t i = 0; i < d; ++i) slot_start_[i + 1] = slot_start_[i] + share[i];
}

uint64_t SampleOrder::sample_at(uint64_t position) const {
  const uint64_t epoch = position / epoch_;
  const uint64_t slot =
      Permutation(epoch_, seed_ * 0x9e3779b97f4a7c15ULL ^ splitmix64(epoch))(position % epoch_);
  const size_t d = static_cast<size_t>(std::upper_bound(slot_start_.begin(), slot_start_.end(), slot) -
                                       slot_start_.begin() - 1);
  const uint64_t k = slot - slot_start_[d];
  const uint64_t pass = k / windows_[d];
  const uint64_t key =
      splitmix64(splitmix64(seed_ ^ 0xd0d0d0d0ULL) + epoch) ^ splitmix64((uint64_t(d) << 40) + pass + 1);
  return first_id_[d] + Permutation(windows_[d], key)(k % windows_[d]);
}

}  // namespace forge::data
