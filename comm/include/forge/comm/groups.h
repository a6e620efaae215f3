// Process groups of a layout, built in one place (Megatron's parallel_state). The rank order is the
// Layout's (forge/common/layout.h): tensor parallel fastest, then context, then data parallel, pipeline
// outermost, so consecutive ranks (one node's) form a TP group and a TP group never spans nodes:
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
#pragma once

#include "forge/comm/comm.h"
#include "forge/common/layout.h"

#include <memory>
#include <string>
#include <vector>

namespace forge::comm {

struct ProcessGroups {
  Layout layout;
  int rank = 0, tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0, ep_rank = 0;
  std::unique_ptr<Comm> world, tp, dp, pp;
  // Context parallelism: `cp`, the ranks sharing out each sequence (ring attention); `dp_cp`, the dp x cp
  // ranks holding the same weights, over which dense gradients are reduced and ZeRO-1 shards (dp at cp 1).
  std::unique_ptr<Comm> cp, dp_cp;
  // Expert parallelism (layout.ep, carved out of dp): `ep`, the ep consecutive dp ranks that share out the
  // experts of MoE blocks (tokens move between them by all-to-all); `expert_dp`, the dp / ep x cp ranks
  // that hold the same experts, over which expert gradients are reduced. At ep = 1: one rank, and dp_cp.
  std::unique_ptr<Comm> ep, expert_dp;
  // The first and the last pipeline stage at the same (tp, cp, dp) position, which both hold the tied
  // token embedding; null on other stages and when pp is 1.
  std::unique_ptr<Comm> embed;

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == layout.pp - 1; }
};

// Splits `world` into the layout's groups (collective over `world`). Throws forge::Error(kUsage) when
// the world size is not the layout's.
ProcessGroups make_groups(std::unique_ptr<Comm> world, const Layout& layout);

// Every rank's `node` name (forge::node_name()), in rank order (collective over `group`; names are cut to
// 63 bytes).
std::vector<std::string> gather_node_names(Comm& group, const std::string& node);

// Hybrid sharding (parallel.zero_group = node): `group`'s ranks on one node (`shard`, in group order) and
// the ranks at the same place of the shard on every node (`replica`, in node order). Nodes are told apart by
// `node` (forge::node_name(): Slurm's name, several per host on the dev cluster) and numbered in the order
// of their first rank in `group`. Collective over `group`. Throws forge::Error(kUsage) naming `key` when
// the nodes hold different numbers of the group's ranks (no even split).
struct NodeSplit {
  std::unique_ptr<Comm> shard, replica;
  int nodes = 1;
};
NodeSplit split_by_node(Comm& group, const std::string& node, const std::string& key);

// MPI: initializes MPI once per process (MPI_THREAD_FUNNELED; finalized at exit) and returns
// MPI_COMM_WORLD as a Comm whose errors are thrown as forge::Error(kComm) naming the rank and the call.
std::unique_ptr<Comm> mpi_world();
// This process's host name as MPI reports it.
std::string mpi_host_name();

// A communicator of one rank, without MPI: the one-process trainer (layout 1,1,1) and tools. Its
// collectives are copies of host memory.
std::unique_ptr<Comm> self_comm(const std::string& name = "world");

}  // namespace forge::comm
