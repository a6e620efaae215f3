#include "forge/trainer/cuda/context.h"

#include "forge/common/error.h"

#include <cublasLt.h>

namespace forge::trainer::cuda {

namespace {

int g_rank = -1;

struct Context {
  int device = 0, sms = 0, max_smem = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(64) << 20;  // cuBLASLt's recommendation for Hopper is >= 32 MiB

  Context() {
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
      fail(ExitCode::kComm, "CUDA device {} rank {}: cublasLtCreate failed", device, g_rank);
    check_cuda(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc (cuBLASLt workspace)");
  }
};

// Created on first use on the device current at that time, and kept for the process: CUDA tears contexts
// down at exit, and destroying handles after that would fail.
Context& ctx() {
  static Context* c = new Context();
  return *c;
}

}  // namespace

void set_error_rank(int rank) {
  g_rank = rank;
}
int error_rank() {
  return g_rank;
}

void cuda_fail(const char* call, cudaError_t err) {
  int device = -1;
  cudaGetDevice(&device);
  // The failure record's class (launcher/src/failure_record.h): out of device memory is a configuration
  // error (64, not requeued: it asks for a smaller plan); any other CUDA error makes the device, and so its
  // node, the suspect (69).
  const bool oom = err == cudaErrorMemoryAllocation;
  throw Error(oom ? ExitCode::kUsage : ExitCode::kComm,
              fmt::format("CUDA device {} rank {}: {} failed: {} ({})", device, g_rank, call,
                          cudaGetErrorString(err), cudaGetErrorName(err)),
              oom ? Fault::kOomDevice : Fault::kGpu);
}

void usage_fail(const std::string& message) {
  throw Error(ExitCode::kUsage, message);
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) cuda_fail(kernel, err);
}

cudaStream_t stream() {
  return ctx().stream;
}
int sm_count() {
  return ctx().sms;
}
size_t max_shared_memory() {
  return size_t(ctx().max_smem);
}
void* cublaslt_handle() {
  return ctx().lt;
}
void* gemm_workspace(size_t* bytes) {
  *bytes = ctx().workspace_bytes;
  return ctx().workspace;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    const std::string call =
        fmt::format("cudaMalloc of {:.1f} MiB ({:.1f} of {:.1f} GiB free)", double(bytes) / (1 << 20),
                    double(free) / (1 << 30), double(total) / (1 << 30));
    cuda_fail(call.c_str(), err);
  }
  check_cuda(err, "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::zero() {
  if (bytes_ > 0) check_cuda(cudaMemsetAsync(ptr_, 0, bytes_, stream()), "cudaMemsetAsync");
}

void to_device(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
             "cudaMemcpyAsync (to device)");
  synchronize();
}

void to_host(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (to host)");
  synchronize();
}

void synchronize() {
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

size_t device_memory_used() {
  size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return total - free_bytes;
}

}  // namespace forge::trainer::cuda
