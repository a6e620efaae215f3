// Start-up of one forge-train rank: MPI (under `srun --mpi=pmix` or `mpirun`), where this rank sits
// (global and local rank, node, the GPU it would drive), and the cross-check of the job's declared
// layout (FORGE_LAYOUT from the SPANK plugin's --train-layout) against the spec's [parallel].
#pragma once

#include "forge/trainer/groups.h"
#include "forge/trainer/spec.h"

#include <memory>
#include <string>

namespace forge::launcher {

struct Bootstrap {
  std::unique_ptr<trainer::Comm> world;
  int rank = 0, size = 1;
  int local_rank = 0;  // SLURM_LOCALID under srun, OMPI_COMM_WORLD_LOCAL_RANK under mpirun
  std::string node;
  int gpu = -1;  // the device this rank would drive on a GPU node (local rank), -1 without GPUs
  std::string describe() const;
};

// Initializes MPI and finds this rank's place. Throws forge::Error(kUsage) (exit 64, on every rank,
// before any large allocation) when FORGE_LAYOUT disagrees with the spec or the number of ranks is not
// tp * pp * dp.
Bootstrap bootstrap(const trainer::TrainSpec& spec);

// Pure part of the above, for tests: the problem with a FORGE_LAYOUT value (nullopt-like empty string
// when it agrees or is unset).
std::string layout_mismatch(const char* forge_layout, const trainer::ParallelConfig& spec);

}  // namespace forge::launcher
