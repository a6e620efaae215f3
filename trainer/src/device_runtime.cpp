#include "forge/trainer/device_runtime.h"

#include "forge/common/error.h"

#include <dlfcn.h>

#include <filesystem>

#include <cstdlib>

namespace forge::trainer {

namespace {

struct Loaded {
  DeviceRuntime* runtime = nullptr;
  std::string failure;
};

// Once per process; the plugin stays loaded for the process's life.
Loaded load() {
  const char* env = std::getenv("FORGE_CUDA_PLUGIN");
  const std::string path = env != nullptr && *env != '\0' ? env : FORGE_CUDA_PLUGIN_PATH;
  if (path.empty())
    return {nullptr,
            "this forge-train was built without the CUDA backend (no CUDA toolkit and NCCL at build time)"};
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return {nullptr, "cannot load the CUDA plugin " + path + ": " + dlerror()};
  auto entry = reinterpret_cast<DeviceRuntime* (*)()>(dlsym(lib, "forge_cuda_runtime"));
  if (entry == nullptr) return {nullptr, path + " has no forge_cuda_runtime entry point"};
  return {entry(), {}};
}

}  // namespace

DeviceRuntime* cuda_runtime(std::string* why) {
  static const Loaded loaded = load();
  if (loaded.runtime == nullptr && why != nullptr) *why = loaded.failure;
  return loaded.runtime;
}

Backend& open_backend(Device device, int rank, std::unique_ptr<Backend>& owned, std::string* description) {
  std::string why = "no NVIDIA driver on this node (/dev/nvidiactl)";
  DeviceRuntime* cuda = nullptr;
  int gpus = 0;
  // auto opens the plugin only where a driver is: loading it costs a process a third of a second.
  if (device == Device::kCuda || (device == Device::kAuto && std::filesystem::exists("/dev/nvidiactl"))) {
    cuda = cuda_runtime(&why);
    if (cuda != nullptr) gpus = cuda->visible_devices(&why);
  }
  if (gpus == 0) {
    if (device == Device::kCuda) fail(ExitCode::kUsage, "--device cuda: no GPU can be used: {}", why);
    if (description != nullptr) *description = "cpu";
    return cpu_backend();
  }
  const std::string bound = cuda->bind(rank, true);
  if (description != nullptr) *description = bound;
  owned = cuda->backend();
  return *owned;
}

}  // namespace forge::trainer
