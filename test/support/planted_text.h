// Text with planted near duplicates, shared by the near-dedup test and benchmark (bench/near_dedup.cpp).
#pragma once

#include "forge/dataio/text.h"

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace forge::test {

// A pseudo-English document of `n` words drawn from a 3000-word vocabulary: two documents share almost
// no 5-gram, so the only similar pairs are the planted ones.
inline std::string random_text(std::mt19937& rng, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    for (uint32_t x = rng() % 3000 + 1; x > 0; x /= 26) out.push_back(static_cast<char>('a' + x % 26));
    out += (i % 12 == 11) ? ".\n" : " ";
  }
  return out;
}

// The edit: a letter appended to each word with probability `rate`.
inline std::string append_letters(const std::string& text, double rate, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::string out;
  data::for_each_word(text, [&](std::string_view w) {
    out += w;
    if (u(rng) < rate) out.push_back(static_cast<char>('a' + rng() % 26));
    out += ' ';
  });
  return out;
}

}  // namespace forge::test
