#include "forge/common/huge_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>

namespace forge {

namespace {

constexpr std::align_val_t kSmallAlign{64};  // a cache line: the trainer aligns tensors to it

size_t page_bytes() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

}  // namespace

void* allocate_zeroed(size_t bytes, bool* huge) {
  if (huge != nullptr) *huge = false;
  if (bytes < kHugePageBytes) {
    void* p = ::operator new(bytes == 0 ? 1 : bytes, kSmallAlign);
    std::memset(p, 0, bytes);
    return p;
  }
  if (bytes > SIZE_MAX - 2 * kHugePageBytes) throw std::bad_alloc();
  // Over-map by a huge page so that a 2 MiB-aligned start lies inside, then unmap the slack on both
  // sides. The length stays a multiple of the base page, not of 2 MiB: a tail shorter than a huge page
  // gets base pages instead of a mostly unused huge one.
  const size_t len = round_up(bytes, page_bytes());
  const size_t mapped = len + kHugePageBytes;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = round_up(base, kHugePageBytes);
  if (start > base) munmap(raw, start - base);
  const size_t tail = mapped - (start - base) - len;
  if (tail > 0) munmap(reinterpret_cast<void*>(start + len), tail);
  void* p = reinterpret_cast<void*>(start);
  // Fails with EINVAL where the kernel has no transparent huge pages: normal pages, same contents.
  const bool advised = madvise(p, len, MADV_HUGEPAGE) == 0;
  if (huge != nullptr) *huge = advised;
  return p;  // anonymous pages read as zero until written
}

void release_zeroed(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes)
    ::operator delete(p, kSmallAlign);
  else
    munmap(p, round_up(bytes, page_bytes()));
}

}  // namespace forge
