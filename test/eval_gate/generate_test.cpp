// Sampling and batched KV-cached generation: greedy generation is the argmax of the full forward at every
// step; a sample does not depend on what is generated beside it; stop tokens and limits end it.
#include "forge/eval_gate/generate.h"
#include "support/training.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>

using namespace forge::gate;
using forge::trainer::GPT;
using forge::trainer::ModelSpec;

namespace {

// Greedy continuation of `prompt` by recomputing the whole prefix with the ordinary forward each step.
std::vector<int32_t> greedy_by_recompute(GPT& full, std::vector<int32_t> seq, int new_tokens) {
  const int T = full.config().seq_len, V = full.config().vocab;
  std::vector<int32_t> out;
  std::vector<float> logits(size_t(T) * size_t(V));
  for (int i = 0; i < new_tokens; ++i) {
    std::vector<int32_t> window(size_t(T) + 1, 0);
    std::copy(seq.begin(), seq.end(), window.begin());
    full.forward_logits(forge::test::window_batch(window, 1, T), logits);
    const float* row = logits.data() + (seq.size() - 1) * size_t(V);
    const int32_t next = int32_t(std::max_element(row, row + V) - row);
    out.push_back(next);
    seq.push_back(next);
  }
  return out;
}

}  // namespace

TEST_CASE("pick_token: greedy, top-k, top-p and temperature", "[gate][generate]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  Sampling greedy;
  CHECK(pick_token(logits, greedy, 0.99) == 1);  // the first of the two largest
  Sampling s;
  s.temperature = 1;
  s.top_k = 1;
  for (double u : {0.0, 0.5, 0.999}) CHECK(pick_token(logits, s, u) == 1);
  s.top_k = 0;
  s.top_p = 1e-6f;  // the nucleus is the single most likely token
  for (double u : {0.0, 0.5, 0.999}) CHECK(pick_token(logits, s, u) == 1);
  // Top-k 3 keeps {1, 3, 2}: the draw walks them by probability, then id.
  s.top_p = 1;
  s.top_k = 3;
  const double e3 = std::exp(3.0), e2 = std::exp(2.0), z = 2 * e3 + e2;
  CHECK(pick_token(logits, s, 0.0) == 1);
  CHECK(pick_token(logits, s, (e3 + 1e-9) / z) == 3);
  CHECK(pick_token(logits, s, (2 * e3 + 1e-9) / z) == 2);
  CHECK(pick_token(logits, s, 0.999999) == 2);
  // Softmax of all five: 0.397, 0.397, 0.146, 0.054, 0.007. Top-p 0.75 keeps the two tokens of 3.0 only;
  // 0.8 also the third.
  s.top_k = 0;
  s.top_p = 0.75f;
  for (double u = 0; u < 1; u += 0.01)
    CHECK((pick_token(logits, s, u) == 1 || pick_token(logits, s, u) == 3));
  s.top_p = 0.8f;
  CHECK(pick_token(logits, s, 0.99) == 2);

  // At temperature 1 the draws follow the softmax: frequencies of 200000 draws within 0.005.
  s = Sampling{};
  s.temperature = 1;
  std::map<int32_t, int> counts;
  const int n = 200000;
  for (int i = 0; i < n; ++i) counts[pick_token(logits, s, sample_draw(1, 42, i))]++;
  double z_all = 0;
  for (float x : logits) z_all += std::exp(double(x));
  for (int32_t t = 0; t < 5; ++t)
    CHECK(std::abs(double(counts[t]) / n - std::exp(double(logits[size_t(t)])) / z_all) < 0.005);
  // A high temperature flattens, a low one sharpens.
  s.temperature = 0.1f;
  int top = 0;
  for (int i = 0; i < 1000; ++i) top += (pick_token(logits, s, sample_draw(2, 1, i)) % 2 == 1) ? 1 : 0;
  CHECK(top == 1000);
}

TEST_CASE("sample_draw is a pure function of seed, key and step in [0, 1)", "[gate][generate]") {
  CHECK(sample_draw(1, 2, 3) == sample_draw(1, 2, 3));
  CHECK(sample_draw(1, 2, 3) != sample_draw(2, 2, 3));
  CHECK(sample_draw(1, 2, 3) != sample_draw(1, 3, 3));
  CHECK(sample_draw(1, 2, 3) != sample_draw(1, 2, 4));
  double lo = 1, hi = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = sample_draw(7, 0, i);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  CHECK(lo >= 0);
  CHECK(lo < 0.001);
  CHECK(hi < 1);
  CHECK(hi > 0.999);
}

TEST_CASE("greedy generation with the KV cache is the full forward's argmax at every step",
          "[gate][generate]") {
  const ModelSpec cfg = forge::trainer::gpt2_spec(2, 32, 4, 64, 40, 40);
  GPT full(cfg, {.batch = 1});
  forge::test::randomize_weights(full, 3, 0.4f);
  ModelSpec gen_cfg = cfg;
  GPT gen(gen_cfg, {.batch = 3});  // three sequences of max_positions in flight
  std::copy(full.weights().begin(), full.weights().end(), gen.weights().begin());
  gen.weights_changed();
  Generator generator(gen, 3);

  std::vector<Request> requests;
  std::mt19937 rng(9);
  for (int i = 0; i < 5; ++i) {  // more requests than slots: slots are reused
    Request r;
    r.prompt.resize(size_t(1 + i * 3));
    for (auto& t : r.prompt) t = int32_t(rng() % 64);
    r.key = uint64_t(i);
    requests.push_back(r);
  }
  Sampling s;
  s.max_new_tokens = 12;
  const auto out = generator.run(requests, s);
  REQUIRE(out.size() == requests.size());
  for (size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i].tokens == greedy_by_recompute(full, requests[i].prompt, 12));
    CHECK_FALSE(out[i].stopped);
  }
  CHECK(generator.stats().new_tokens == 60);
  CHECK(generator.stats().sequences == 5);
  CHECK(generator.stats().tokens_per_second() > 0);
}

TEST_CASE("a sample is the same alone or in a batch; stops and limits end it", "[gate][generate]") {
  const ModelSpec cfg = forge::trainer::gpt2_spec(2, 32, 4, 64, 24, 24);
  GPT alone(cfg, {.batch = 1}), batched(cfg, {.batch = 4});
  forge::test::randomize_weights(alone, 5, 0.4f);
  std::copy(alone.weights().begin(), alone.weights().end(), batched.weights().begin());
  batched.weights_changed();
  Generator one(alone, 1), four(batched, 4);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) requests.push_back({{int32_t(i), int32_t(2 * i + 1), 7}, uint64_t(100 + i)});
  Sampling s;
  s.temperature = 1.0f;
  s.top_k = 20;
  s.top_p = 0.9f;
  s.max_new_tokens = 30;  // more than the positions left: the model's last position ends the sample
  s.seed = 17;
  const auto a = one.run(requests, s);
  // The same requests in another order, four at a time: each sample is keyed, not placed.
  std::vector<Request> reversed(requests.rbegin(), requests.rend());
  const auto b = four.run(reversed, s);
  for (size_t i = 0; i < requests.size(); ++i) {
    CHECK(a[i].tokens == b[requests.size() - 1 - i].tokens);
    // Fed at positions 3..23, one token each, plus the one the last position predicts.
    CHECK(a[i].tokens.size() == size_t(24 - 3 + 1));
  }
  // Another seed changes the samples.
  s.seed = 18;
  const auto c = one.run(requests, s);
  int differ = 0;
  for (size_t i = 0; i < requests.size(); ++i) differ += a[i].tokens != c[i].tokens ? 1 : 0;
  CHECK(differ > 0);

  // A stop token ends a sample before it; max_new_tokens bounds it.
  s.seed = 17;
  s.max_new_tokens = 5;
  const auto limited = one.run(requests, s);
  for (size_t i = 0; i < requests.size(); ++i) {
    CHECK(limited[i].tokens == std::vector<int32_t>(a[i].tokens.begin(), a[i].tokens.begin() + 5));
  }
  s.max_new_tokens = 30;
  s.stop_tokens = {a[0].tokens[3]};
  const auto stopped = one.run(std::span(requests.data(), 1), s);
  CHECK(stopped[0].stopped);
  CHECK(stopped[0].tokens.size() <= 3);
  CHECK(std::vector<int32_t>(a[0].tokens.begin(),
                             a[0].tokens.begin() + ptrdiff_t(stopped[0].tokens.size())) == stopped[0].tokens);

  // A prompt longer than the model's positions keeps its last 23 tokens: the one position left is fed
  // the first new token, which predicts a second.
  Request longer{std::vector<int32_t>(40, 3), 1};
  const auto cut = one.run(std::span(&longer, 1), Sampling{});
  CHECK(cut[0].prompt_truncated);
  CHECK(cut[0].tokens.size() == 2);
}
