// Learning, shown: a tiny GPT trained on the bytes of the repository's LICENSE (a real English text)
// drives its loss far below the text's unigram entropy, which is the best a model ignoring context can do.
#include "support/paths.h"
#include "support/training.h"

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>

using namespace forge::trainer;

TEST_CASE("a tiny GPT learns LICENSE far below its unigram entropy", "[trainer][learning]") {
  std::ifstream in(forge::test::source_path("LICENSE"), std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(text.size() > 5000);
  std::array<double, 256> counts{};
  for (unsigned char c : text) counts[c] += 1;
  double entropy = 0;  // nats per byte
  for (double c : counts)
    if (c > 0) entropy -= c / double(text.size()) * std::log(c / double(text.size()));

  TrainSpec s;
  s.model = gpt2_spec(2, 96, 4, 256, 64);
  s.batch = 8;
  s.steps = 400;
  s.seed = 1;
  s.threads = 1;
  s.optim.lr = 3e-3;
  s.optim.min_lr = 3e-4;
  s.optim.warmup_steps = 10;
  s.optim.weight_decay = 0.0;
  forge::test::OneProcess trainer(s);
  std::mt19937 rng(5);
  std::vector<int32_t> rows(size_t(s.batch) * size_t(s.model.seq_len + 1));
  const size_t cols = size_t(s.model.seq_len) + 1;
  double first = 0, last = 0;
  for (int64_t step = 0; step < s.steps; ++step) {
    for (int b = 0; b < s.batch; ++b) {
      const size_t start = rng() % (text.size() - cols);
      for (size_t i = 0; i < cols; ++i)
        rows[size_t(b) * cols + i] = static_cast<unsigned char>(text[start + i]);
    }
    const forge::MicroBatch batch = forge::test::window_batch(rows, s.batch, s.model.seq_len);
    const double loss = trainer->step({&batch, 1}).loss;
    if (step == 0) first = loss;
    if (step >= s.steps - 20) last += loss / 20;
  }
  INFO("unigram entropy " << entropy << " nats, first loss " << first << ", mean of last 20 " << last);
  CHECK(first > std::log(256.0) - 0.3);  // starts near uniform over bytes
  CHECK(last < 0.65 * entropy);          // measured: 0.59 x entropy (1.80 nats)
}
