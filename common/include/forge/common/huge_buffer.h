// Large zero-initialised arrays backed by transparent huge pages.
//
// First touch of freshly allocated memory costs one page fault per 4 KiB page; on a virtual machine
// every fault is a hypervisor exit, which made zeroing the trainer's ~0.6 GB of weights, gradients,
// optimizer moments and activations the bulk of its start-up. A buffer of at least kHugePageBytes is
// mapped 2 MiB-aligned with madvise(MADV_HUGEPAGE), so one fault maps 2 MiB (and the TLB covers 512 times
// more memory), and it relies on the kernel's zero-filled pages instead of writing zeros itself. Where
// transparent huge pages are unavailable the advice fails and the buffer silently uses normal pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

namespace forge {

inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// `bytes` zeroed bytes, aligned to 64 bytes (2 MiB and advised for huge pages from kHugePageBytes up);
// throws std::bad_alloc. `huge` (may be null) is set to whether the huge-page advice was accepted.
// Release with release_zeroed(p, bytes) with the same size.
void* allocate_zeroed(size_t bytes, bool* huge = nullptr);
void release_zeroed(void* p, size_t bytes) noexcept;

// A fixed-size array of `size` value-initialised (zero) elements in such memory. Move-only; a contiguous
// range, so it converts to std::span.
template <class T>
class HugeBuffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "HugeBuffer holds plain data whose all-zero bytes are its zero value");

 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t size) {
    if (size == 0) return;
    if (size > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    data_ = static_cast<T*>(allocate_zeroed(size * sizeof(T), &huge_));
    size_ = size;
  }
  ~HugeBuffer() { release_zeroed(data_, size_ * sizeof(T)); }
  HugeBuffer(HugeBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        huge_(std::exchange(o.huge_, false)) {}
  HugeBuffer& operator=(HugeBuffer&& o) noexcept {
    if (this != &o) {
      release_zeroed(data_, size_ * sizeof(T));
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      huge_ = std::exchange(o.huge_, false);
    }
    return *this;
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  // Whether the kernel accepted the huge-page advice for this buffer (false for small buffers and where
  // transparent huge pages are off; the contents are the same either way).
  bool huge_pages_advised() const { return huge_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  bool huge_ = false;
};

}  // namespace forge
