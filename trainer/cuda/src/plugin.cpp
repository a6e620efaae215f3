// libforge_cuda_plugin.so: the DeviceRuntime (forge/trainer/device_runtime.h) that forge-train opens when
// a run asks for a GPU. Built from this build's CUDA backend; the trainer's own symbols come from the
// executable that loads it.
#include "forge/trainer/cuda/backend.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/device.h"
#include "forge/trainer/cuda/nccl_comm.h"
#include "forge/trainer/device_runtime.h"

#include <fmt/format.h>

#include <string_view>

namespace forge::trainer::cuda {

namespace {

// Dense BF16 tensor-core peaks, TFLOP/s, by a fragment of the device name (run.peak_gflops overrides).
struct Peak {
  std::string_view name;
  double tflops;
};
constexpr Peak kPeaks[] = {{"H200", 989}, {"H100", 989}, {"GH200", 989}, {"H800", 989},
                           {"A100", 312}, {"A800", 312}, {"L40S", 362},  {"L4", 121}};

class CudaRuntime final : public DeviceRuntime {
 public:
  int visible_devices(std::string* why) override { return visible_device_count(why); }
  std::string bind(int rank, bool share) override {
    device_ = bind_device(rank, read_device_env(), share);
    return fmt::format("cuda:{} {} (GPU {})", device_.ordinal, device_.name, device_.physical);
  }
  std::unique_ptr<Backend> backend() override { return make_cuda_backend(device_.ordinal); }
  std::unique_ptr<comm::Comm> nccl(comm::Comm& world) override {
    return make_nccl_comm(
        world.rank(), world.size(), "world",
        [&world](void* data, size_t bytes) { world.broadcast(data, bytes, comm::CommType::kU8, 0)->wait(); },
        stream());
  }
  double peak_bf16_gflops() override {
    for (const Peak& p : kPeaks)
      if (device_.name.find(p.name) != std::string::npos) return p.tflops * 1e3;
    return 0;
  }

 private:
  BoundDevice device_;
};

}  // namespace

}  // namespace forge::trainer::cuda

extern "C" __attribute__((visibility("default"))) forge::trainer::DeviceRuntime* forge_cuda_runtime() {
  static forge::trainer::cuda::CudaRuntime runtime;
  return &runtime;
}
