#include "forge/common/hash.h"

#include "forge/common/error.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace forge {

uint64_t xxh3_64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

std::string to_hex64(uint64_t value) {
  return fmt::format("{:016x}", value);
}

std::string xxh3_64_hex(std::string_view data) {
  return to_hex64(xxh3_64(data.data(), data.size()));
}

Hash128 xxh3_128(std::string_view data) {
  const XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return {h.high64, h.low64};
}

std::string xxh3_128_hex(std::string_view data) {
  const Hash128 h = xxh3_128(data);
  return to_hex64(h.high) + to_hex64(h.low);
}

struct Xxh3Stream::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(state_->s);
}
Xxh3Stream::~Xxh3Stream() = default;
void Xxh3Stream::update(const void* data, size_t size) {
  XXH3_64bits_update(state_->s, data, size);
}
uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(state_->s);
}
std::string Xxh3Stream::hex() const {
  return to_hex64(digest());
}

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
}
Sha256Stream::~Sha256Stream() {
  EVP_MD_CTX_free(ctx_);
}
void Sha256Stream::update(const void* data, size_t size) {
  EVP_DigestUpdate(ctx_, data, size);
}
std::string Sha256Stream::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_, out, &n);
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += fmt::format("{:02x}", out[i]);
  return s;
}

namespace {

template <typename Hasher>
void hash_file(const std::string& path, Hasher& h) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ExitCode::kIo, "cannot read '{}': {}", path, std::strerror(errno));
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) fail(ExitCode::kIo, "read error in '{}'", path);
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256Stream h;
  h.update(data.data(), data.size());
  return h.hex();
}

std::string xxh3_file_hex(const std::string& path) {
  Xxh3Stream h;
  hash_file(path, h);
  return h.hex();
}

std::string sha256_file_hex(const std::string& path) {
  Sha256Stream h;
  hash_file(path, h);
  return h.hex();
}

}  // namespace forge
