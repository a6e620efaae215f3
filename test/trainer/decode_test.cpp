// Incremental decoding with the key/value cache (GPT::decode) against full recomputation: at every step
// a token's logits are those the model's ordinary forward gives the whole prefix at its position.
#include "support/training.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

using namespace forge::trainer;
using forge::MicroBatch;

namespace {

std::vector<int32_t> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = int32_t(rng() % uint32_t(vocab));
  return v;
}

// The full forward's logits at position t of `prefix` (its first t + 1 tokens), the rest of the window
// filled with other tokens: what recomputing the prefix gives.
std::vector<float> recomputed(GPT& full, std::span<const int32_t> prefix, size_t t, uint32_t junk_seed) {
  const int T = full.config().seq_len, V = full.config().vocab;
  std::vector<int32_t> window = random_tokens(size_t(T) + 1, V, junk_seed);
  std::copy_n(prefix.begin(), t + 1, window.begin());
  std::vector<float> logits(size_t(T) * size_t(V));
  full.forward_logits(forge::test::window_batch(window, 1, T), logits);
  return {logits.begin() + ptrdiff_t(t) * V, logits.begin() + ptrdiff_t(t + 1) * V};
}

// Largest difference, absolute and relative to the largest logit.
std::pair<double, double> difference(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return {diff, diff / scale};
}

}  // namespace

TEST_CASE("decoding with the KV cache gives the full forward's logits at every step", "[trainer][decode]") {
  const ModelSpec cfg = gpt2_spec(3, 64, 4, 96, 32, 32);
  const int V = cfg.vocab, T = cfg.seq_len;
  GPT full(cfg, {.batch = 1});
  forge::test::randomize_weights(full, 5, 0.3f);
  GPT decoder(cfg, {.batch = 1});
  std::copy(full.weights().begin(), full.weights().end(), decoder.weights().begin());
  decoder.weights_changed();
  KvCache cache(decoder, 1, T);

  const std::vector<int32_t> seq = random_tokens(size_t(T), V, 7);
  const int prompt = 9;
  // The prompt in one call (logits of its last position), then one token a step.
  std::vector<DecodeRow> rows;
  for (int i = 0; i < prompt; ++i) rows.push_back({0, i, seq[size_t(i)]});
  std::vector<float> logits(static_cast<size_t>(V));
  const int last = prompt - 1;
  decoder.decode(cache, rows, std::span(&last, 1), logits);
  double worst = 0, worst_rel = 0, spread = 0;
  for (int t = prompt - 1; t < T; ++t) {
    if (t >= prompt) {
      const DecodeRow row{0, t, seq[size_t(t)]};
      const int only = 0;
      decoder.decode(cache, std::span(&row, 1), std::span(&only, 1), logits);
    }
    const std::vector<float> reference = recomputed(full, seq, size_t(t), 100 + uint32_t(t));
    const auto [abs_diff, rel_diff] = difference(logits, reference);
    worst = std::max(worst, abs_diff);
    worst_rel = std::max(worst_rel, rel_diff);
    const auto [lo, hi] = std::minmax_element(reference.begin(), reference.end());
    spread = std::max(spread, double(*hi - *lo));
  }
  INFO("largest difference " << worst << " (relative " << worst_rel << "), logits spread " << spread);
  CHECK(worst_rel <= 1e-5);
  CHECK(worst <= 1e-5);
  CHECK(spread > 1.0);  // the logits are far from uniform: the comparison means something
}

TEST_CASE("sequences decoded together, prefilled and stepped in one call, match each alone",
          "[trainer][decode]") {
  const ModelSpec cfg = gpt2_spec(2, 32, 4, 64, 24, 24);
  const int V = cfg.vocab, T = cfg.seq_len;
  GPT full(cfg, {.batch = 1});
  forge::test::randomize_weights(full, 11, 0.3f);
  GPT decoder(cfg, {.batch = 4});  // rows() = 4 x 24: room for three prompts at once
  std::copy(full.weights().begin(), full.weights().end(), decoder.weights().begin());
  decoder.weights_changed();
  KvCache cache(decoder, 3, T);

  const std::vector<std::vector<int32_t>> seqs = {random_tokens(20, V, 1), random_tokens(20, V, 2),
                                                  random_tokens(20, V, 3)};
  const int prompts[3] = {3, 7, 1};
  // Call 1: the three prompts, their rows interleaved.
  std::vector<DecodeRow> rows;
  for (int i = 0; i < 7; ++i)
    for (int s = 0; s < 3; ++s)
      if (i < prompts[s]) rows.push_back({s, i, seqs[size_t(s)][size_t(i)]});
  std::vector<int> wanted;
  for (int s = 0; s < 3; ++s)
    for (size_t r = 0; r < rows.size(); ++r)
      if (rows[r].sequence == s && rows[r].position == prompts[s] - 1) wanted.push_back(int(r));
  std::vector<float> logits(3 * size_t(V));
  decoder.decode(cache, rows, wanted, logits);
  int next[3] = {prompts[0], prompts[1], prompts[2]};
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    for (int s = 0; s < 3; ++s) {
      const auto reference = recomputed(full, seqs[size_t(s)], size_t(next[s] - 1), 7 * uint32_t(step + s));
      worst = std::max(worst, difference({logits.data() + size_t(s) * V, size_t(V)}, reference).second);
    }
    // Step: one token for each sequence, in reverse order (rows need not be sorted by sequence).
    rows.clear();
    wanted.clear();
    for (int s = 2; s >= 0; --s) rows.push_back({s, next[s], seqs[size_t(s)][size_t(next[s])]});
    wanted = {2, 1, 0};
    decoder.decode(cache, rows, wanted, logits);
    for (int& n : next) ++n;
  }
  CHECK(worst <= 1e-5);

  // A slot reused: sequence 1 starts again from position 0 with another prompt; the others are untouched.
  const std::vector<int32_t> fresh = random_tokens(10, V, 9);
  rows.clear();
  for (int i = 0; i < 4; ++i) rows.push_back({1, i, fresh[size_t(i)]});
  rows.push_back({0, next[0], seqs[0][size_t(next[0])]});
  wanted = {3, 4};
  std::vector<float> two(2 * size_t(V));
  decoder.decode(cache, rows, wanted, two);
  CHECK(difference({two.data(), size_t(V)}, recomputed(full, fresh, 3, 77)).second <= 1e-5);
  CHECK(difference({two.data() + V, size_t(V)}, recomputed(full, seqs[0], size_t(next[0]), 78)).second <=
        1e-5);
}

TEST_CASE("decode refuses rows outside the cache, the positions or the vocabulary", "[trainer][decode]") {
  const ModelSpec cfg = gpt2_spec(1, 16, 2, 32, 8, 8);
  GPT m(cfg, {.batch = 1});
  m.init(1);
  KvCache cache(m, 2, 8);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab));
  const int zero = 0;
  const auto run = [&](DecodeRow row) { m.decode(cache, std::span(&row, 1), std::span(&zero, 1), logits); };
  CHECK_NOTHROW(run({1, 0, 5}));
  CHECK_THROWS_AS(run({2, 0, 5}), std::invalid_argument);
  CHECK_THROWS_AS(run({0, 8, 5}), std::invalid_argument);
  CHECK_THROWS_AS(run({0, 0, 32}), std::invalid_argument);
  CHECK_THROWS_AS(KvCache(m, 1, 9), std::invalid_argument);
  GPT half(cfg, {.batch = 1, .slice = ModelSlice{0, 1, true, false}});
  CHECK_THROWS_AS(half.decode(cache, {}, {}, {}), std::invalid_argument);
}
