#include "forge/dataio/synthetic.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <vector>

using forge::data::SyntheticStream;

TEST_CASE("synthetic samples are a pure function of (vocab, seed, index)") {
  const SyntheticStream a(512, 7), b(512, 7), other_seed(512, 8);
  std::vector<int32_t> x(257), y(257), z(257);
  for (uint64_t index : {0ULL, 1ULL, 99ULL, 1ULL << 40}) {
    a.sample(index, x);
    b.sample(index, y);
    other_seed.sample(index, z);
    CHECK(x == y);
    CHECK(x != z);
  }
  a.sample(3, x);
  a.sample(4, y);
  CHECK(x != y);
  // A shorter request is a prefix of a longer one: the sample does not depend on the buffer size.
  std::vector<int32_t> shorter(64);
  a.sample(3, shorter);
  CHECK(std::equal(shorter.begin(), shorter.end(), x.begin()));
}

TEST_CASE("synthetic tokens stay in [0, vocab)") {
  for (uint32_t vocab : {2u, 3u, 300u, 65536u, 100000u}) {
    const SyntheticStream s(vocab, 42);
    std::vector<int32_t> out(1000);
    for (uint64_t i = 0; i < 20; ++i) {
      s.sample(i, out);
      for (int32_t t : out) {
        REQUIRE(t >= 0);
        REQUIRE(static_cast<uint32_t>(t) < vocab);
      }
    }
  }
}

TEST_CASE("synthetic stream has learnable structure: bigram entropy far below log(vocab)") {
  const uint32_t vocab = 256;
  const SyntheticStream s(vocab, 1);
  std::map<std::pair<int32_t, int32_t>, double> pairs;
  std::map<int32_t, double> firsts;
  std::vector<int32_t> out(512);
  double n = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    s.sample(i, out);
    for (size_t j = 1; j < out.size(); ++j) {
      pairs[{out[j - 1], out[j]}] += 1;
      firsts[out[j - 1]] += 1;
      n += 1;
    }
  }
  double conditional = 0;  // H(next | previous), empirical
  for (const auto& [pair, count] : pairs) conditional -= count / n * std::log(count / firsts[pair.first]);
  CHECK(conditional < 0.5 * std::log(double(vocab)));
  CHECK(firsts.size() == vocab);  // the noise term reaches every token
}

TEST_CASE("synthetic stream rejects a vocabulary below 2") {
  CHECK_THROWS_AS(SyntheticStream(1, 0), forge::Error);
}
