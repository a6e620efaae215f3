#include "forge/common/huge_buffer.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>

namespace {

bool aligned(const void* p, size_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

bool all_zero(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::all_of(b, b + bytes, [](unsigned char c) { return c == 0; });
}

// Whether the kernel has transparent huge pages and may use them for madvised memory.
bool thp_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(in, line) && line.find("[never]") == std::string::npos;
}

// The /proc/self/smaps entry of the mapping holding `p`: its VmFlags line, or "" when `p` is not mapped.
std::string vm_flags(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("HugeBuffer is zeroed and aligned at every size") {
  for (size_t n : {size_t(1), size_t(100), forge::kHugePageBytes / 4 - 1, forge::kHugePageBytes / 4,
                   forge::kHugePageBytes / 4 + 1, size_t(3) << 20}) {
    CAPTURE(n);
    forge::HugeBuffer<float> b(n);
    REQUIRE(b.size() == n);
    REQUIRE(b.data() != nullptr);
    CHECK(aligned(b.data(), 64));
    if (n * sizeof(float) >= forge::kHugePageBytes) CHECK(aligned(b.data(), forge::kHugePageBytes));
    CHECK(all_zero(b.data(), n * sizeof(float)));
    // Every element is usable, the last one included.
    std::fill(b.begin(), b.end(), 1.5f);
    CHECK(b[n - 1] == 1.5f);
  }
}

TEST_CASE("a released buffer's memory comes back zeroed") {
  for (size_t bytes : {size_t(4096), forge::kHugePageBytes + 4096}) {
    CAPTURE(bytes);
    for (int round = 0; round < 3; ++round) {
      void* p = forge::allocate_zeroed(bytes);
      REQUIRE(all_zero(p, bytes));
      std::fill_n(static_cast<unsigned char*>(p), bytes, 0xAB);
      forge::release_zeroed(p, bytes);
    }
  }
}

TEST_CASE("large buffers get the huge-page advice where the kernel has transparent huge pages") {
  forge::HugeBuffer<double> small(16);
  CHECK_FALSE(small.huge_pages_advised());
  forge::HugeBuffer<double> big(forge::kHugePageBytes);  // 16 MiB
  const std::string flags = vm_flags(big.data());
  REQUIRE_FALSE(flags.empty());
  if (thp_available()) {
    CHECK(big.huge_pages_advised());
    CHECK(flags.find(" hg") != std::string::npos);  // VM_HUGEPAGE, set by MADV_HUGEPAGE
  } else {
    WARN("transparent huge pages are off here: the advice is not checked");
  }
}

TEST_CASE("HugeBuffer moves its storage and releases what it replaces") {
  forge::HugeBuffer<int32_t> a(forge::kHugePageBytes);
  a[7] = 42;
  int32_t* const storage = a.data();
  const bool advised = a.huge_pages_advised();

  forge::HugeBuffer<int32_t> b(std::move(a));
  CHECK(b.data() == storage);
  CHECK(b.size() == forge::kHugePageBytes);
  CHECK(b[7] == 42);
  CHECK(b.huge_pages_advised() == advised);
  CHECK(a.data() == nullptr);
  CHECK(a.empty());
  CHECK(a.begin() == a.end());

  forge::HugeBuffer<int32_t> c(forge::kHugePageBytes);
  int32_t* const replaced = c.data();
  c = std::move(b);
  CHECK(c.data() == storage);
  CHECK(c[7] == 42);
  CHECK(b.empty());
  CHECK(vm_flags(replaced).empty());  // the replaced storage was unmapped

  c = forge::HugeBuffer<int32_t>();
  CHECK(c.empty());
  CHECK(vm_flags(storage).empty());
}

TEST_CASE("HugeBuffer converts to a span over its elements") {
  forge::HugeBuffer<float> b(1000);
  std::span<float> s = b;
  CHECK(s.data() == b.data());
  CHECK(s.size() == 1000);
  const forge::HugeBuffer<float>& cb = b;
  std::span<const float> cs = cb;
  CHECK(cs.size() == 1000);
  forge::HugeBuffer<float> empty;
  CHECK(std::span<float>(empty).empty());
}
