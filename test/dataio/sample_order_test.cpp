// The reader's sample orders, tested directly on window counts (no dataset): bijection per epoch, domain
// shares under blending, and the block order's locality.
#include "sample_order.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

using forge::data::BlockOrder;
using forge::data::GlobalOrder;
using forge::data::OrderMemo;
using forge::data::SampleOrder;

namespace {

struct Case {
  std::vector<uint64_t> windows;
  uint64_t w, g;
};

// Sizes around the edges: E < W, E < G*W, partial blocks, E not a multiple of G*W, empty domains, W = 1,
// G = 1, and sizes that are exact multiples.
const std::vector<Case> kCases = {
    {{1}, 32, 16},          {{5}, 32, 16},           {{3, 4}, 2, 16},         {{100}, 7, 3},
    {{37, 0, 64, 5}, 8, 4}, {{1000, 3}, 16, 16},     {{250, 250}, 1, 4},      {{97, 31, 12}, 5, 1},
    {{128, 64}, 16, 4},     {{1, 1, 1, 1, 1}, 4, 2}, {{513, 200, 77}, 32, 3}, {{4096}, 64, 16},
};

std::vector<double> natural(const std::vector<uint64_t>& windows) {
  return {windows.begin(), windows.end()};
}

// Domain of a sample id, and its window within the domain.
std::pair<size_t, uint64_t> locate(const std::vector<uint64_t>& windows, uint64_t id) {
  size_t d = 0;
  while (id >= windows[d]) id -= windows[d++];
  return {d, id};
}

// Regions that positions [from, from + n) read: the sample ids sorted and cut where two neighbours are
// more than `gap` apart (gap 1: runs of consecutive ids).
size_t regions(const SampleOrder& o, uint64_t from, uint64_t n, uint64_t gap) {
  std::vector<uint64_t> ids;
  for (uint64_t p = from; p < from + n; ++p) ids.push_back(o.sample_at(p));
  std::sort(ids.begin(), ids.end());
  size_t count = 1;
  for (size_t i = 1; i < ids.size(); ++i) count += ids[i] - ids[i - 1] > gap;
  return count;
}

}  // namespace

TEST_CASE("block order visits every sample exactly once per epoch, for many sizes") {
  for (const Case& c : kCases) {
    INFO("windows " << c.windows.size() << " first " << c.windows[0] << " W " << c.w << " G " << c.g);
    const BlockOrder order(c.windows, natural(c.windows), 42, c.w, c.g);
    const uint64_t e = order.epoch_length();
    REQUIRE(e == order.windows());
    std::vector<std::vector<uint64_t>> epochs;
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<uint64_t> ids;
      for (uint64_t p = 0; p < e; ++p) ids.push_back(order.sample_at(epoch * e + p));
      std::vector<uint64_t> sorted = ids;
      std::sort(sorted.begin(), sorted.end());
      for (uint64_t i = 0; i < e; ++i) REQUIRE(sorted[i] == i);
      epochs.push_back(ids);
    }
    if (e >= 8) CHECK(epochs[0] != epochs[1]);
    // A pure function of its inputs; another seed, another order.
    const BlockOrder same(c.windows, natural(c.windows), 42, c.w, c.g),
        other(c.windows, natural(c.windows), 43, c.w, c.g);
    std::vector<uint64_t> again, reseeded;
    for (uint64_t p = 0; p < e; ++p) {
      again.push_back(same.sample_at(p));
      reseeded.push_back(other.sample_at(p));
    }
    CHECK(again == epochs[0]);
    if (e >= 8) CHECK(reseeded != epochs[0]);
  }
}

TEST_CASE("block order gives each domain the same share as the global order under blending") {
  const std::vector<uint64_t> windows = {300, 41, 0, 90};
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{
           {1, 1, 0, 1}, {0.7, 0.3, 0, 0}, {0, 1, 0, 0}, {5, 1, 0, 0.01}, {1, 10, 0, 1}}) {
    for (const auto& [w, g] :
         std::vector<std::pair<uint64_t, uint64_t>>{{8, 4}, {1, 16}, {64, 2}, {500, 3}}) {
      const BlockOrder block(windows, weights, 7, w, g);
      const GlobalOrder global(windows, weights, 7);
      const uint64_t e = block.epoch_length();
      REQUIRE(e == global.epoch_length());
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        std::map<size_t, uint64_t> block_share, global_share;
        std::map<uint64_t, uint64_t> count;  // per sample
        for (uint64_t p = epoch * e; p < (epoch + 1) * e; ++p) {
          const uint64_t id = block.sample_at(p);
          ++block_share[locate(windows, id).first];
          ++global_share[locate(windows, global.sample_at(p)).first];
          ++count[id];
        }
        REQUIRE(block_share == global_share);
        // Within a domain the draws are spread evenly: an upsampled domain repeats every sample
        // floor or ceil(c_d / n_d) times, a downsampled one never repeats.
        for (const auto& [d, c] : block_share) {
          const uint64_t n = windows[d], lo = c / n, hi = (c + n - 1) / n;
          uint64_t first = 0;
          for (size_t k = 0; k < d; ++k) first += windows[k];
          uint64_t distinct = 0;
          for (uint64_t id = first; id < first + n; ++id) {
            const uint64_t seen = count.count(id) ? count[id] : 0;
            if (seen) ++distinct;
            REQUIRE((seen == lo || seen == hi));
          }
          CHECK(distinct == std::min(c, n));
        }
      }
    }
  }
}

TEST_CASE("block order reads a group of G*W positions from about G regions of W windows") {
  SECTION("sizes that divide the epoch: each group is G whole blocks") {
    const std::vector<uint64_t> windows = {64 * 40, 64 * 24};
    const uint64_t w = 64, g = 4;
    const BlockOrder order(windows, natural(windows), 5, w, g);
    const uint64_t e = order.epoch_length();
    for (uint64_t from = 0; from < 2 * e; from += g * w) {
      std::set<uint64_t> ids;
      for (uint64_t p = from; p < from + g * w; ++p) ids.insert(order.sample_at(p));
      REQUIRE(ids.size() == g * w);
      // G runs of W consecutive windows; a block wrapping around its domain's end is two runs.
      REQUIRE(regions(order, from, g * w, 1) <= g + windows.size());
    }
  }
  SECTION("any sizes: a sliding span of G*W positions reads from at most 2G regions plus a few") {
    // A span covers parts of two groups, and perhaps the domains' tails; each block is a region (two
    // where it wraps around its domain's end), and so is each domain's tail.
    const std::vector<uint64_t> windows = {2000 + 37, 1000 + 13, 5};
    const uint64_t w = 32, g = 4, bound = 2 * g + 2 * windows.size();
    const BlockOrder block(windows, natural(windows), 9, w, g);
    const GlobalOrder global(windows, natural(windows), 9);
    const uint64_t e = block.epoch_length();
    for (uint64_t from = 0; from + g * w <= 3 * e; from += 7)
      REQUIRE(regions(block, from, g * w, w) <= bound);
    // The bound is a real property: the global order reads from all over the dataset.
    CHECK(regions(global, 0, g * w, w) > bound);
  }
}

TEST_CASE("block order fills ranges as sample_at does, and its prefetch stream covers the same groups") {
  for (const Case& c : kCases) {
    INFO("windows " << c.windows.size() << " first " << c.windows[0] << " W " << c.w << " G " << c.g);
    std::vector<double> weights = natural(c.windows);
    weights[0] *= 3;  // upsampled: units that straddle passes and blocks take the slow path
    for (const auto& w : {natural(c.windows), weights}) {
      const BlockOrder order(c.windows, w, 3, c.w, c.g);
      const uint64_t e = order.epoch_length(), total = 3 * e;
      // Uneven ranges, one memo across them, as the reader's consecutive batches use it.
      OrderMemo memo, ahead_memo;
      std::vector<uint64_t> ids, ahead;
      for (uint64_t first = 0, n = 1; first < total; first += n, n = n % 7 + 1) {
        const uint64_t count = std::min(n, total - first);
        std::vector<uint64_t> part(count), part_ahead(count);
        order.fill(first, count, part.data(), memo);
        order.prefetch_fill(first, count, part_ahead.data(), ahead_memo);
        for (uint64_t i = 0; i < count; ++i) REQUIRE(part[i] == order.sample_at(first + i));
        ids.insert(ids.end(), part.begin(), part.end());
        ahead.insert(ahead.end(), part_ahead.begin(), part_ahead.end());
      }
      // Each epoch holds the same windows in both streams.
      const uint64_t span = order.prefetch_distance();
      REQUIRE(span == c.w * c.g);
      for (uint64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<uint64_t> a(ids.begin() + epoch * e, ids.begin() + (epoch + 1) * e);
        std::vector<uint64_t> b(ahead.begin() + epoch * e, ahead.begin() + (epoch + 1) * e);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        REQUIRE(a == b);
      }
    }
  }
  // In memory order, a group whose blocks are whole is G runs of consecutive windows.
  const std::vector<uint64_t> windows = {64 * 40};
  const BlockOrder order(windows, natural(windows), 5, 64, 4);
  OrderMemo memo;
  std::vector<uint64_t> ahead(256);
  order.prefetch_fill(512, 256, ahead.data(), memo);
  size_t breaks = 0;
  for (size_t i = 1; i < ahead.size(); ++i) breaks += ahead[i] != ahead[i - 1] + 1;
  CHECK(breaks <= 4 + 1);  // between blocks, and where a block wraps around the domain's end
}

TEST_CASE("block order refuses empty blocks or groups") {
  CHECK_THROWS_AS(BlockOrder({10}, {1.0}, 1, 0, 4), forge::Error);
  CHECK_THROWS_AS(BlockOrder({10}, {1.0}, 1, 4, 0), forge::Error);
}
