// The per-process CUDA context of the backend: the device, the stream every op is queued on, the
// cuBLASLt handle and its workspace, and error reporting. Errors are one line naming the device, the rank
// and the failed call (forge::Error, exit 69: a device failure ends the rank like a communication failure).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace forge::trainer::cuda {

// The rank named in error messages (set by bind_device; -1 until then).
void set_error_rank(int rank);
int error_rank();

[[noreturn]] void cuda_fail(const char* call, cudaError_t err);
inline void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess) cuda_fail(call, err);
}
// A usage error (exit 64) from code that cannot use fmt (nvcc rejects its compile-time format checks).
[[noreturn]] void usage_fail(const std::string& message);
// Checks the launch of the kernel just queued.
void check_launch(const char* kernel);

cudaStream_t stream();
// The current device's multiprocessors and opt-in shared memory per block, read once per process.
int sm_count();
size_t max_shared_memory();
// Dynamic shared memory above 48 KiB must be opted into once per kernel.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* call) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), call);
}
// Whether `p` is a multiple of `bytes` (what a vector load of that width needs).
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
// cuBLASLt handle and workspace (opaque here; gemm.cpp owns them).
void* cublaslt_handle();
void* gemm_workspace(size_t* bytes);

// A device allocation owned like a std::vector.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void zero();  // on the stream

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host <-> device copies on the stream (synchronous for the host).
void to_device(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);
void synchronize();

// Device memory in use now (cudaMemGetInfo: total - free), bytes.
size_t device_memory_used();

}  // namespace forge::trainer::cuda
