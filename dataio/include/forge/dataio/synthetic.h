// A deterministic generated token stream with learnable structure, for smoke tests and benchmarks
// (`data.dataset = synthetic`). Each sample is a pure function of (vocab, seed, index), so any rank can
// produce any sample without coordination.
//
// Structure: a seeded sparse Markov chain. Every token has four successors chosen by hash, taken with
// probabilities 0.60 / 0.20 / 0.08 / 0.04; the remaining 0.08 is a uniformly random token, so every token
// of the vocabulary occurs. The next-token entropy is about 1.7 nats, far below log(vocab) for any
// realistic vocabulary, so a model that learns the transitions shows a falling loss.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace forge::data {

class SyntheticStream {
 public:
  // vocab >= 2 (forge::Error kUsage otherwise).
  SyntheticStream(uint32_t vocab, uint64_t seed);

  // Fills `out` with sample `index`: out.size() consecutive tokens of the chain, each in [0, vocab).
  void sample(uint64_t index, std::span<int32_t> out) const;

  uint32_t vocab() const { return vocab_; }
  uint64_t seed() const { return seed_; }

  static constexpr int kSuccessors = 4;

 private:
  uint32_t vocab_;
  uint64_t seed_;
  std::vector<int32_t> successors_;  // [vocab][kSuccessors]
};

}  // namespace forge::data
