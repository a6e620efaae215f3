// Packing values into the byte blocks that Ranks::exchange moves (same machine architecture on every rank:
// values are copied as they lie in memory).
#pragma once

#include "forge/common/error.h"

#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace forge::data {

class Packer {
 public:
  template <typename T>
  Packer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    buf_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Packer& put(std::string_view s) {
    put<uint64_t>(s.size());
    buf_.append(s);
    return *this;
  }
  std::string& bytes() { return buf_; }

 private:
  std::string buf_;
};

class Unpacker {
 public:
  explicit Unpacker(std::string_view bytes) : in_(bytes) {}
  bool done() const { return pos_ == in_.size(); }
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<uint64_t>();
    need(n);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }

 private:
  void need(size_t n) const {
    if (pos_ + n > in_.size())
      fail(ExitCode::kComm, "distributed prepare: a message from another rank is truncated");
  }
  std::string_view in_;
  size_t pos_ = 0;
};

// One Packer per destination rank, exchanged at once.
struct Outbox {
  explicit Outbox(int ranks) : to(static_cast<size_t>(ranks)) {}
  std::vector<Packer> to;
  std::vector<std::string> blocks() {
    std::vector<std::string> out;
    out.reserve(to.size());
    for (auto& p : to) out.push_back(std::move(p.bytes()));
    return out;
  }
};

}  // namespace forge::data
