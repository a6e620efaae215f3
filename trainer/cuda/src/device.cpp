#include "forge/trainer/cuda/device.h"
#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"

#include <cuda_runtime.h>

#include <string>

namespace forge::trainer::cuda {

int visible_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return count;
  cudaGetLastError();
  if (why != nullptr) *why = err == cudaSuccess ? "no CUDA device" : cudaGetErrorString(err);
  return 0;
}

BoundDevice bind_device(int rank, const DeviceEnv& env, bool share) {
  set_error_rank(rank);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    count = 0;
  else
    check_cuda(err, "cudaGetDeviceCount");
  const DeviceChoice choice = choose_device(env, count, rank, share);
  check_cuda(cudaSetDevice(choice.ordinal), "cudaSetDevice");
  // cudaFree(nullptr) creates the context: the first call that fails on a GPU another process holds.
  const cudaError_t ctx = cudaFree(nullptr);
  if (ctx == cudaErrorDevicesUnavailable)
    fail(ExitCode::kComm,
         "rank {}: GPU {} (CUDA device {}) is already in use by another process (exclusive-process compute "
         "mode); "
         "check nvidia-smi for a leftover process or start fewer ranks per node",
         rank, choice.physical, choice.ordinal);
  check_cuda(ctx, "cudaFree (context creation)");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, choice.ordinal), "cudaGetDeviceProperties");
  return {choice.ordinal, choice.physical, prop.name};
}

}  // namespace forge::trainer::cuda
