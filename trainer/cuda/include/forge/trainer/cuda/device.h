// Which GPU a rank uses. The environment is read into DeviceEnv and mapped by choose_device, pure host logic
// tested without a GPU; bind_device applies the choice through the CUDA runtime.
//
// Mapping: the node-local rank (SLURM_LOCALID, else OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID, else
// 0) indexes the devices the process sees (CUDA_VISIBLE_DEVICES already applied by the runtime). A task
// bound to one GPU by Slurm (--gpus-per-task, --gpu-bind: it sees one device while its step holds more,
// SLURM_STEP_GPUS) uses that device whatever its local rank.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace forge::trainer::cuda {

struct DeviceEnv {
  int local_rank = -1;          // -1: not set by the launcher
  std::string local_rank_from;  // the variable it came from
  int local_size = -1;  // ranks on this node (SLURM_NTASKS_PER_NODE / OMPI_COMM_WORLD_LOCAL_SIZE); -1 unknown
  bool has_visible = false;            // CUDA_VISIBLE_DEVICES is set
  std::vector<std::string> visible;    // its entries (indices, UUIDs or MIG ids)
  std::vector<std::string> step_gpus;  // SLURM_STEP_GPUS entries
};

// Reads the variables above through `get` (getenv by default). A malformed number is a usage error (exit 64)
// naming the variable.
DeviceEnv read_device_env(const std::function<const char*(const char*)>& get = nullptr);

struct DeviceChoice {
  int ordinal = 0;       // CUDA device ordinal for cudaSetDevice
  std::string physical;  // the GPU as the node names it (its CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS entry)
};

// The device of world rank `rank` when the process sees `visible_count` CUDA devices. No device, or more
// ranks on the node than GPUs, is a usage error (exit 64): one line naming the rank, the local rank and
// where it came from, the GPUs seen, and what to change. `share`: ranks beyond the devices wrap around
// (local rank modulo the devices), for communicators that allow ranks to share a GPU (host-staged MPI;
// NCCL refuses two ranks on one device).
DeviceChoice choose_device(const DeviceEnv& env, int visible_count, int rank, bool share = false);

struct BoundDevice {
  int ordinal = 0;
  std::string physical;
  std::string name;  // e.g. "NVIDIA H200"
};

// Chooses and makes current the device of `rank`, creating its context now so that a GPU taken by another
// process (exclusive-process compute mode) fails here, in one line (exit 69), not at the first kernel.
BoundDevice bind_device(int rank, const DeviceEnv& env, bool share = false);

// CUDA devices the process sees; 0 with the reason in `why` when there is none or no usable driver.
int visible_device_count(std::string* why = nullptr);

}  // namespace forge::trainer::cuda
