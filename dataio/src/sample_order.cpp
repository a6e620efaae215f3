#include "sample_order.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace forge::data {
namespace {

// Keys of the block order's permutations: each one a distinct hash of (seed, what, indexes).
uint64_t key_of(uint64_t seed, uint64_t what, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t k = splitmix64(seed ^ (what * 0x9e3779b97f4a7c15ULL));
  for (uint64_t x : {a, b, c}) k = splitmix64(k ^ (x + 0x632be59bd9b4e019ULL));
  return k;
}

enum : uint64_t { kUnits = 1, kGroup, kTail, kTailAt, kPass, kRotate };

}  // namespace

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
  draws_.assign(d, 0);
  std::vector<std::pair<double, size_t>> remainders;
  uint64_t given = 0;
  for (size_t i = 0; i < d; ++i) {
    const double exact = weights[i] / wsum * static_cast<double>(epoch_);
    draws_[i] = static_cast<uint64_t>(std::floor(exact));
    given += draws_[i];
    remainders.emplace_back(exact - std::floor(exact), i);
  }
  std::sort(remainders.begin(), remainders.end(),
            [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (size_t k = 0; given < epoch_ && k < remainders.size(); ++k) {
    if (weights[remainders[k].second] <= 0) continue;
    ++draws_[remainders[k].second];
    ++given;
  }
}

GlobalOrder::GlobalOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights,
                         uint64_t seed)
    : SampleOrder(windows, weights, seed) {
  slot_start_.assign(windows.size() + 1, 0);
  for (size_t i = 0; i < windows.size(); ++i) slot_start_[i + 1] = slot_start_[i] + draws_[i];
}

// The keys are those of the first reader release: checkpoints taken with it resume into the same order.
void SampleOrder::fill(uint64_t first, size_t count, uint64_t* out, OrderMemo&) const {
  for (size_t i = 0; i < count; ++i) out[i] = sample_at(first + i);
}

uint64_t GlobalOrder::sample_at(uint64_t position) const {
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

BlockOrder::BlockOrder(const std::vector<uint64_t>& windows, const std::vector<double>& weights,
                       uint64_t seed, uint64_t block_windows, uint64_t group_blocks)
    : SampleOrder(windows, weights, seed), w_(block_windows), g_(group_blocks) {
  if (w_ == 0 || g_ == 0) fail(ExitCode::kUsage, "reader: block order needs blocks and groups of at least 1");
  unit_start_.assign(windows.size() + 1, 0);
  tail_start_.assign(windows.size() + 1, 0);
  for (size_t i = 0; i < windows.size(); ++i) {
    unit_start_[i + 1] = unit_start_[i] + draws_[i] / w_;
    tail_start_[i + 1] = tail_start_[i] + draws_[i] % w_;
  }
  units_ = unit_start_.back();
  tail_ = tail_start_.back();
  groups_ = (units_ + g_ - 1) / g_;
}

uint64_t BlockOrder::sample_at(uint64_t position) const {
  OrderMemo memo;
  uint64_t id;
  fill(position, 1, &id, memo, true);
  return id;
}

void BlockOrder::fill(uint64_t first, size_t count, uint64_t* out, OrderMemo& memo, bool shuffled) const {
  const uint64_t group_size = w_ * g_;
  // Per epoch: where the tails' group sits (before group tail_group, or after the last, possibly short,
  // group). Per group: its permutation, and its units as they are needed: a unit inside one pass of its
  // domain and on a full block is W consecutive windows (modulo the domain's rotation), so its windows
  // are one addition away; any other unit maps each draw on its own.
  if (memo.unit.size() != g_) {
    memo = OrderMemo{};
    memo.unit.resize(g_);
  }
  for (size_t i = 0; i < count; ++i) {
    const uint64_t position = first + i, q = position % epoch_;
    if (position / epoch_ != memo.epoch) {
      memo.epoch = position / epoch_;
      const uint64_t tail_group = splitmix64(key_of(seed_, kTailAt, memo.epoch)) % (groups_ + 1);
      memo.tail_at = std::min(tail_group * group_size, units_ * w_);
      memo.units = Permutation(units_, key_of(seed_, kUnits, memo.epoch));
      memo.group = UINT64_MAX;
    }
    const uint64_t epoch = memo.epoch, tail_at = memo.tail_at;
    if (q >= tail_at && q - tail_at < tail_) {
      const uint64_t s =
          shuffled ? Permutation(tail_, key_of(seed_, kTail, epoch))(q - tail_at) : q - tail_at;
      const size_t d = static_cast<size_t>(std::upper_bound(tail_start_.begin(), tail_start_.end(), s) -
                                           tail_start_.begin() - 1);
      out[i] = first_id_[d] + window_of_draw(d, epoch, draws_[d] / w_ * w_ + (s - tail_start_[d]));
      continue;
    }
    const uint64_t f = q < tail_at ? q : q - tail_;
    const uint64_t group = f / group_size;
    if (group != memo.group) {
      memo.group = group;
      const uint64_t units_here = std::min(g_, units_ - group * g_);
      memo.in_group = Permutation(units_here * w_, key_of(seed_, kGroup, epoch, group));
      for (auto& u : memo.unit) u.known = false;
    }
    const uint64_t s = shuffled ? memo.in_group(f % group_size) : f % group_size;
    OrderMemo::Unit& u = memo.unit[s / w_];
    if (!u.known) {
      const uint64_t id = memo.units(group * g_ + s / w_);
      u.d = static_cast<size_t>(std::upper_bound(unit_start_.begin(), unit_start_.end(), id) -
                                unit_start_.begin() - 1);
      u.first_draw = (id - unit_start_[u.d]) * w_;
      const uint64_t x = u.first_draw % windows_[u.d];
      u.contiguous = x % w_ == 0 && x / w_ < windows_[u.d] / w_;
      if (u.contiguous) u.base = window_of_draw(u.d, epoch, u.first_draw);
      u.known = true;
    }
    const uint64_t n = windows_[u.d], off = s % w_;
    const uint64_t window = u.contiguous ? (u.base + off < n ? u.base + off : u.base + off - n)
                                         : window_of_draw(u.d, epoch, u.first_draw + off);
    out[i] = first_id_[u.d] + window;
  }
}

uint64_t BlockOrder::window_of_draw(size_t d, uint64_t epoch, uint64_t k) const {
  const uint64_t n = windows_[d], pass = k / n, x = k % n;
  // A pass reads the domain's full blocks in a keyed order, then its short block. The block grid is
  // rotated by a keyed offset each pass, so which windows share a block (and which fall in the short
  // block that a downsampled domain may never reach) changes every epoch, while a domain read in one pass
  // keeps its units aligned with whole blocks.
  const uint64_t key = key_of(seed_, kPass, epoch, d, pass);
  const uint64_t full = n / w_, slot = x / w_;
  const uint64_t block = slot < full ? Permutation(full, key)(slot) : full;
  const uint64_t rotated = block * w_ + x % w_ + key_of(seed_, kRotate, epoch, d, pass) % n;
  return rotated < n ? rotated : rotated - n;
}

}  // namespace forge::data
