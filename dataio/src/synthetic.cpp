#include "forge/dataio/synthetic.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

namespace forge::data {
namespace {

// Cumulative successor probabilities in 1/2^16 units: 0.60, 0.20, 0.08, 0.04, then 0.08 uniform noise.
constexpr uint32_t kCumulative[SyntheticStream::kSuccessors] = {39322, 52429, 57672, 60293};

}  // namespace

SyntheticStream::SyntheticStream(uint32_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {
  if (vocab < 2) fail(ExitCode::kUsage, "synthetic stream: vocab must be at least 2, got {}", vocab);
  successors_.resize(static_cast<size_t>(vocab) * kSuccessors);
  const uint64_t table_key = splitmix64(seed ^ 0x5eed5eed5eed5eedULL);
  for (uint32_t t = 0; t < vocab; ++t) {
    for (int k = 0; k < kSuccessors; ++k) {
      const uint64_t h = splitmix64(table_key + static_cast<uint64_t>(t) * kSuccessors + k);
      successors_[static_cast<size_t>(t) * kSuccessors + k] = static_cast<int32_t>(h % vocab);
    }
  }
}

void SyntheticStream::sample(uint64_t index, std::span<int32_t> out) const {
  if (out.empty()) return;
  const uint64_t sample_key = splitmix64(splitmix64(seed_) ^ splitmix64(index + 0x1234567ULL));
  auto token = static_cast<int32_t>(sample_key % vocab_);
  out[0] = token;
  for (size_t j = 1; j < out.size(); ++j) {
    const uint64_t r = splitmix64(sample_key + j);
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
