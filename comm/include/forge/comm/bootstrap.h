// Start-up of one rank of a forge program (forge-train, forge-gate): MPI (under `srun --mpi=pmix` or
// `mpirun`, or one process without a launcher) and where this rank sits (global and local rank, node,
// the GPU it would drive).
#pragma once

#include "forge/comm/comm.h"
#include "forge/common/layout.h"

#include <memory>
#include <string>

namespace forge::comm {

struct Bootstrap {
  std::unique_ptr<Comm> world;
  int rank = 0, size = 1;
  int local_rank = 0;  // forge/common/local_rank.h
  std::string node;
  int gpu = -1;  // the device this rank would drive on a GPU node (local rank), -1 without GPUs
  std::string describe() const;
};

// Initializes MPI and finds this rank's place.
Bootstrap bootstrap();

// The job's declared layout (FORGE_LAYOUT, which the SPANK plugin sets from --train-layout) and the
// number of ranks started must be the spec's `layout`: forge::Error(kUsage) (exit 64, on every rank,
// before any large allocation) naming what disagrees.
void check_layout(const Bootstrap& boot, const Layout& layout);
// The FORGE_LAYOUT half of that, for an elastic job: its ranks may be fewer than the layout's.
void check_layout_of_job(const Layout& layout);

// Pure part of the above, for tests: the problem with a FORGE_LAYOUT value against the spec's layout
// (empty when it agrees or is unset).
std::string layout_mismatch(const char* forge_layout, const Layout& spec);

}  // namespace forge::comm
