#include "forge/trainer/device_runtime.h"

#include <dlfcn.h>

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

}  // namespace forge::trainer
