#include "forge/trainer/device_runtime.h"

#include <dlfcn.h>

#include <cstdlib>

namespace forge::trainer {

DeviceRuntime* cuda_runtime(std::string* why) {
  static DeviceRuntime* runtime = nullptr;
  static std::string failure;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const char* env = std::getenv("FORGE_CUDA_PLUGIN");
    const std::string path = env != nullptr && *env != '\0' ? env : FORGE_CUDA_PLUGIN_PATH;
    if (path.empty()) {
      failure =
          "this forge-train was built without the CUDA backend (no CUDA toolkit and NCCL at build time)";
    } else if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); lib == nullptr) {
      failure = "cannot load the CUDA plugin " + path + ": " + dlerror();
    } else if (auto entry = reinterpret_cast<DeviceRuntime* (*)()>(dlsym(lib, "forge_cuda_runtime"));
               entry == nullptr) {
      failure = path + " has no forge_cuda_runtime entry point";
    } else {
      runtime = entry();  // the plugin stays loaded for the process's life
    }
  }
  if (runtime == nullptr && why != nullptr) *why = failure;
  return runtime;
}

}  // namespace forge::trainer
