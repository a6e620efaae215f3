// The ranks of `srun forge-data prepare` or `mpirun forge-data prepare`: forge::data::Ranks over the MPI
// communicator the trainer uses (forge/comm/comm.h), so the data tool and the trainer share one MPI layer.
#pragma once

#include "forge/dataio/ranks.h"

#include <memory>

namespace forge::data {

class LauncherRanks : public Ranks {
 public:
  // Stops every rank with `exit_code`: a rank that fails alone would leave the others waiting in their
  // next exchange.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// The ranks when an MPI launcher (srun --mpi=pmix, mpirun) started this process, else nullptr: a plain
// `forge-data prepare` never initialises MPI.
std::unique_ptr<LauncherRanks> launcher_ranks();

}  // namespace forge::data
