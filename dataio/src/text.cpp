#include "forge/dataio/text.h"

#include "forge/common/hash.h"

#include <cstring>

namespace forge::data {

uint64_t word_hash(std::string_view word) {
  char buf[64];
  if (word.size() <= sizeof buf) {
    for (size_t i = 0; i < word.size(); ++i) {
      const char c = word[i];
      buf[i] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c | 0x20) : c;
    }
    return xxh3_64(buf, word.size());
  }
  std::string lower(word);
  for (char& c : lower)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c | 0x20);
  return xxh3_64(lower.data(), lower.size());
}

std::vector<uint64_t> word_hashes(std::string_view text) {
  std::vector<uint64_t> out;
  out.reserve(text.size() / 6);
  for_each_word(text, [&](std::string_view w) { out.push_back(word_hash(w)); });
  return out;
}

uint64_t ngram_hash(const uint64_t* w, int n) {
  return xxh3_64(w, static_cast<size_t>(n) * sizeof(uint64_t), 0x6e6772616dULL);
}

}  // namespace forge::data
