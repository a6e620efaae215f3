// Where a process sits on its node, as the launcher that started it says: the one place that reads
// SLURM_LOCALID and its Open MPI / MPICH equivalents (forge-train, forge-gate, GPU selection).
#pragma once

#include <functional>
#include <string>

namespace forge {

struct LocalRank {
  int rank = 0;      // 0 when no launcher variable is set
  int size = -1;     // ranks on this node; -1 unknown
  std::string from;  // the variable the rank came from; empty when none was set
};

// Reads SLURM_LOCALID, else OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID; the node's rank count from
// OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE or MPI_LOCALNRANKS. Through `get` (getenv by default,
// tests pass their own). A value that is not a non-negative integer is forge::Error(kUsage) naming it.
LocalRank local_rank(const std::function<const char*(const char*)>& get = nullptr);

// This host's name (gethostname; "localhost" when it fails).
std::string host_name();
// Slurm's name for this node (SLURMD_NODENAME: several per host on the dev cluster), else host_name(). The
// name to drain, exclude or report a node by.
std::string node_name();

}  // namespace forge
