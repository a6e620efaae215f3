// Process groups of a (tp, pp, dp) layout, built in one place. Rank order (ARCHITECTURE.md): tensor
// parallel fastest, then data parallel, then pipeline outermost, so consecutive ranks (one node's) form a
// TP group and a TP group never spans nodes:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
#pragma once

#include "forge/trainer/comm.h"

#include <memory>
#include <string>

namespace forge::trainer {

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int world() const { return tp * pp * dp; }
  std::string str() const;  // "tp2,pp2,dp2" (the --train-layout spelling)
};

struct ProcessGroups {
  Layout layout;
  int rank = 0, tp_rank = 0, dp_rank = 0, pp_rank = 0;
  std::unique_ptr<Comm> world, tp, dp, pp;
  // The first and the last pipeline stage at the same (tp, dp) position, which both hold the tied token
  // embedding; null on other stages and when pp is 1.
  std::unique_ptr<Comm> embed;

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == layout.pp - 1; }
  // World rank of the same (tp, dp) position on pipeline stage `stage`.
  int stage_rank(int stage) const { return tp_rank + layout.tp * (dp_rank + layout.dp * stage); }
};

// Splits `world` into the layout's groups (collective over `world`). Throws forge::Error(kUsage) when
// the world size is not tp * pp * dp.
ProcessGroups make_groups(std::unique_ptr<Comm> world, const Layout& layout);

// MPI: initializes MPI once per process (MPI_THREAD_FUNNELED; finalized at exit) and returns
// MPI_COMM_WORLD as a Comm whose errors are thrown as forge::Error(kComm) naming the rank and the call.
std::unique_ptr<Comm> mpi_world();
// This process's host name as MPI reports it.
std::string mpi_host_name();

}  // namespace forge::trainer
