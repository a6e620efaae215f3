#include "forge/dataio/synthetic.h"

#include "forge/common/error.h"

namespace forge::data {
namespace {

// splitmix64: a counter-based generator, so token j of sample i needs no state from token j-1's draw.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Cumulative successor probabilities in 1/2^16 units: 0.60, 0.20, 0.08, 0.04, then 0.08 uniform noise.
constexpr uint32_t kCumulative[SyntheticStream::kSuccessors] = {39322, 52429, 57672, 60293};

}  // namespace

SyntheticStream::SyntheticStream(uint32_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {
  if (vocab < 2) fail(ExitCode::kUsage, "synthetic stream: vocab must be at least 2, got {}", vocab);
  successors_.resize(static_cast<size_t>(vocab) * kSuccessors);
  const uint64_t table_key = mix(seed ^ 0x5eed5eed5eed5eedULL);
  for (uint32_t t = 0; t < vocab; ++t) {
    for (int k = 0; k < kSuccessors; ++k) {
      const uint64_t h = mix(table_key + static_cast<uint64_t>(t) * kSuccessors + k);
      successors_[static_cast<size_t>(t) * kSuccessors + k] = static_cast<int32_t>(h % vocab);
    }
  }
}

void SyntheticStream::sample(uint64_t index, std::span<int32_t> out) const {
  if (out.empty()) return;
  const uint64_t sample_key = mix(mix(seed_) ^ mix(index + 0x1234567ULL));
  auto token = static_cast<int32_t>(sample_key % vocab_);
  out[0] = token;
  for (size_t j = 1; j < out.size(); ++j) {
    const uint64_t r = mix(sample_key + j);
    const auto u = static_cast<uint32_t>(r & 0xffff);
    int pick = kSuccessors;
    for (int k = 0; k < kSuccessors; ++k) {
      if (u < kCumulative[k]) {
        pick = k;
        break;
      }
    }
    token = pick < kSuccessors ? successors_[static_cast<size_t>(token) * kSuccessors + pick]
                               : static_cast<int32_t>((r >> 16) % vocab_);
    out[j] = token;
  }
}

}  // namespace forge::data
