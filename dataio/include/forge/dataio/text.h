// Text primitives shared by the stages: word splitting and hashing used by near dedup, the quality
// filters and decontamination, so the three agree on what a "word" is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

constexpr bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0x80;
}

// Words are maximal runs of ASCII letters/digits or non-ASCII bytes (so UTF-8 letters stay inside words),
// compared case-insensitively (ASCII). Punctuation and whitespace separate words.
template <typename F>
void for_each_word(std::string_view text, F&& f) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    while (i < n && !is_word_byte(static_cast<unsigned char>(text[i]))) ++i;
    const size_t b = i;
    while (i < n && is_word_byte(static_cast<unsigned char>(text[i]))) ++i;
    if (i > b) f(text.substr(b, i - b));
  }
}

// xxh3-64 of the ASCII-lower-cased word.
uint64_t word_hash(std::string_view word);

// Hashes of every word, in order.
std::vector<uint64_t> word_hashes(std::string_view text);

// Hash of the n words starting at `w` (order-sensitive).
uint64_t ngram_hash(const uint64_t* w, int n);

}  // namespace forge::data
