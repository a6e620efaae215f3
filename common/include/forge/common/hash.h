// Content hashes: xxh3 (fast; shard and checkpoint checksums, dedup keys) and SHA-256 (dataset and
// tokenizer identities that other tools may verify independently).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace forge {

uint64_t xxh3_64(const void* data, size_t size, uint64_t seed = 0);
std::string xxh3_64_hex(std::string_view data);
struct Hash128 {
  uint64_t high = 0, low = 0;
  bool operator==(const Hash128&) const = default;
};
Hash128 xxh3_128(std::string_view data);
// 32 hex digits, high half first (XXH128_canonical order).
std::string xxh3_128_hex(std::string_view data);

// Incremental xxh3-64 for data that arrives in pieces (files, tensors).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string sha256_hex(std::string_view data);

// Incremental SHA-256 (OpenSSL). hex() finishes the digest: call it once.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void update(const void* data, size_t size);
  std::string hex();

 private:
  ::evp_md_ctx_st* ctx_;
};

// Whole-file digests, read in large blocks. Throw forge::Error(kIo) naming the file if it can't be read.
std::string xxh3_file_hex(const std::string& path);
std::string sha256_file_hex(const std::string& path);

std::string to_hex64(uint64_t value);

// splitmix64: a stateless 64-bit mixer. Counter-based generators built on it draw element i of anything
// without the draws before it, so data order and initialization are pure functions of (seed, index).
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace forge
