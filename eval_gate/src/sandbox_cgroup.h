// A sandbox's own control group (run_sandboxed): memory, tasks and CPU bounded for the sandbox as a whole,
// every process in it counted (bwrap's too), so that sandboxes running at once can exhaust neither the node
// nor one another's allowance (RLIMIT_NPROC, which counts a uid's tasks host-wide, could do neither).
//
// Where: under the calling process's own cgroup, so that a job's sandboxes stay inside the job's limits and
// accounting; where that is not writable, under a `forge-sandbox` directory at the hierarchy's root that a
// site delegated (made writable for the users who may run sandboxes). cgroup v2 where the unified hierarchy
// has the memory, pids and cpu controllers (its own cgroup delegating them, or root, which makes
// /forge-sandbox and enables them); else v1's memory, pids and cpu hierarchies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::gate {

struct CgroupLimits {
  uint64_t memory_bytes = 0;  // memory.max (v1: memory.limit_in_bytes), swap included where accounted
  uint64_t tasks = 0;         // pids.max: processes and threads
  double cpus = 1;            // cpu.max (v1: the CFS quota): this many CPUs' time per 100 ms period
};

class SandboxCgroup {
 public:
  // Makes the group and sets its limits. Throws forge::Error(kComm: 69) naming the directory and the
  // reason when it cannot: a sandbox never runs without its group.
  explicit SandboxCgroup(const CgroupLimits& limits);
  // Kills whatever is left in the group and removes it.
  ~SandboxCgroup();
  SandboxCgroup(const SandboxCgroup&) = delete;
  SandboxCgroup& operator=(const SandboxCgroup&) = delete;

  // Open (close-on-exec) descriptors of the group's cgroup.procs files, one per hierarchy: a process joins
  // by writing "0" to each, as the sandbox's first process does before it execs bwrap.
  const std::vector<int>& join_fds() const { return join_; }
  // What the limits did: a process killed for memory; a fork or clone refused for tasks.
  bool memory_limit_hit() const;
  bool task_limit_hit() const;
  const std::string& path() const { return dirs_.front(); }  // the first hierarchy's, for messages

 private:
  int version_ = 0;
  std::vector<std::string> dirs_;  // v1: memory, pids, cpu; v2: one
  std::vector<int> join_;
  void remove();
};

}  // namespace forge::gate
