// Device memory whose granules are handed back and taken again behind addresses that stay put: CUDA's
// virtual memory management (an address range reserved once, physical granules mapped and unmapped
// under it). The CUDA backend's large allocations are made of it, so that what ZeRO-2/3 release
// (Backend::release) leaves the device and comes back on acquire, while every pointer the model and the
// communicators hold stays valid.
//
// A granule is unmapped only once the work queued on the stream before its release is done: a release
// records an event and the unmapping waits for it (checked at every later release and acquire, at the end
// of a step, and before a mapping that finds the device full). An acquire before then takes the granule back
// as it is (zeroed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace forge::trainer::cuda {

class MappedMemory {
 public:
  // The granule (bytes) when the driver and the current device have virtual memory management; 0 and
  // `why` otherwise (the backend then allocates with cudaMalloc and release only zeroes).
  static size_t granule(std::string* why = nullptr);

  // `bytes` rounded up to granules, every one mapped and zeroed on the stream.
  explicit MappedMemory(size_t bytes);
  ~MappedMemory();
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  void* data() const { return reinterpret_cast<void*>(base_); }
  size_t bytes() const { return bytes_; }
  // Byte ranges from data(). release unmaps the granules wholly inside (once the stream's work queued so
  // far is done) and zeroes the rest on the stream; acquire maps every unmapped granule the range
  // touches, zeroed. Either may be called on any range, any number of times.
  void release(size_t offset, size_t bytes);
  void acquire(size_t offset, size_t bytes);
  // Unmaps the granules of every MappedMemory whose releases the device is done with; with `wait`, after
  // waiting for the stream (all of them).
  static void unmap_released(bool wait);
  // Bytes of the range whose granules hold memory now (an unmapping still waiting for the device counts).
  size_t mapped_bytes(size_t offset, size_t bytes) const;

 private:
  enum class State : uint8_t { kMapped, kRetiring, kUnmapped };
  void map(size_t first, size_t last);    // granules [first, last), unmapped now
  void unmap(size_t first, size_t last);  // granules [first, last) still retiring

  uintptr_t base_ = 0;
  size_t bytes_ = 0, granule_ = 0;
  std::vector<State> state_;  // per granule
};

}  // namespace forge::trainer::cuda
