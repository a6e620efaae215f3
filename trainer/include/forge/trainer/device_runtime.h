// The GPU runtime of forge-train, loaded on demand. forge-train links no CUDA library: the CUDA runtime,
// cuBLASLt and NCCL cost every process a third of a second and 200 MB just to load, and most ranks of a
// CPU job (and every rank on a node without a driver) never touch them. The CUDA build adds a plugin,
// libforge_cuda_plugin.so (trainer/cuda/src/plugin.cpp), that forge-train opens when run.device asks for a
// GPU (docs/GPU.md). The plugin resolves the trainer's own symbols from the executable, so the activity
// record the watchdog reads, the error rank and the logger are the process's one copy.
#pragma once

#include "forge/comm/comm.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/spec.h"

#include <memory>
#include <string>

namespace forge::trainer {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // CUDA devices this process sees; 0 when there is none or no driver (`why` says which).
  virtual int visible_devices(std::string* why) = 0;
  // Makes the device of world rank `rank` current (the node-local rank's; `share`: ranks beyond the
  // devices wrap around, for the host-staged MPI fallback) and describes it ("cuda:0 NVIDIA H200 (GPU
  // 3)"). Usage errors (64) for no or too few devices, exit 69 for a device that fails.
  virtual std::string bind(int rank, bool share) = 0;
  // The backend on the bound device.
  virtual std::unique_ptr<Backend> backend() = 0;
  // An NCCL communicator of the ranks of `world` (its unique id broadcast over `world`), its operations
  // ordered after the backend's queued work.
  virtual std::unique_ptr<comm::Comm> nccl(comm::Comm& world) = 0;
  // The bound device's dense BF16 peak in GFLOP/s from the table by device name (0: not in the table).
  virtual double peak_bf16_gflops() = 0;
};

// The plugin of this build: nullptr with the reason in `why` when the build has no CUDA backend or the
// plugin does not load. FORGE_CUDA_PLUGIN overrides its path.
DeviceRuntime* cuda_runtime(std::string* why);

// The backend a tool's rank computes on for a device choice like run.device (forge-gate --device): with
// cuda, or auto on a node with an NVIDIA driver and a GPU this process sees, the GPU of node-local rank
// `rank` (ranks beyond the GPUs share them), kept alive by `owned`; else the CPU backend. `description`
// says which ("cpu", "cuda:0 NVIDIA H200 ..."). Usage error (64): cuda where no GPU can be used.
Backend& open_backend(Device device, int rank, std::unique_ptr<Backend>& owned, std::string* description);

}  // namespace forge::trainer
