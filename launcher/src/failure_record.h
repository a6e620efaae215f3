// Failure records: why a forge-train process ended, for the batch scripts to act on and for people to read
// (docs/ARCHITECTURE.md, "Failures"). Every non-zero exit leaves <run.dir>/failures/<job>-<restart>.json
// with the class, the suspect ranks and their hosts, and the evidence.
//
// The exit code says what the job should do next in general (requeue or not); the class says what broke,
// which decides whether a node is to blame: a GPU fault or a lost node drains it, an OOM or a bad spec asks
// the user to change something, a preemption or a communication failure requeues.
#pragma once

#include "forge/common/error.h"
#include "forge/common/json.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::launcher {

enum class FailureClass {
  kPreempted,  // 75: signal or time limit, checkpoint saved
  kConfig,     // 64: the spec, the layout or the memory plan
  kData,       // 65: a shard, a checkpoint or a checksum
  kNumeric,    // 71: non-finite beyond the guard
  kOomHost,    // host memory exhausted (an allocation failed, or the kernel's OOM killer)
  kOomDevice,  // device memory exhausted
  kGpu,        // a CUDA error or an Xid: the device is suspect
  kComm,       // 69: an MPI/NCCL error or a hang
  kNodeLost,   // a peer vanished: its node stopped answering
  kIo,         // 74: a checkpoint or the run directory could not be written
  kInternal,   // anything else: a bug, reported with its message
};

std::string_view failure_class_name(FailureClass c);
std::optional<FailureClass> parse_failure_class(std::string_view name);
// The class of an exit, from its code and, where the code cannot say it, the fault.
FailureClass failure_class(ExitCode code, Fault fault);

struct Suspect {
  int rank = -1;  // -1: the whole node
  std::string host;
};

struct FailureRecord {
  FailureClass cls = FailureClass::kInternal;
  int exit_code = 1;
  int64_t step = -1;  // the last step this process finished; -1: none
  std::vector<Suspect> suspects;
  std::vector<std::string> evidence;  // what was seen, one line each (error messages, srun's lines)
};

// The job, restart and attempt this process belongs to: SLURM_JOB_ID and SLURM_RESTART_COUNT, or "local"
// and 0 outside Slurm; FORGE_STEP_ATTEMPT counts the steps the batch script ran again in the same allocation
// (0: the first).
struct JobKey {
  std::string job = "local";
  int restart = 0;
  int attempt = 0;
  static JobKey from_environment();
};

std::string failure_record_path(const std::string& run_dir, const JobKey& key);

// Writes the record of `key` (the whole run's failure, whichever rank writes it). Unless `replace`, a
// record already there wins: the first rank to fail saw the cause, those that fail after it fail of it.
// Returns whether this call wrote it; a record that cannot be written costs a warning, never the exit.
bool write_failure_record(const std::string& run_dir, const JobKey& key, const FailureRecord& record,
                          const std::string& spec_hash, bool replace = false);

// The record of `key` in `run_dir` if there is one and it is that job's, of that run: a record copied from
// another run or left by another job is ignored (nullopt, with a warning naming why).
std::optional<Json> read_failure_record(const std::string& run_dir, const JobKey& key);

// Each rank's host, so that a record can name the host of a suspect peer (set once the ranks have met).
void set_rank_hosts(std::vector<std::string> hosts);
std::string rank_host(int rank);

// The last step this process finished (the training loop keeps it current), for the record.
void set_last_finished_step(int64_t step);
int64_t last_finished_step();

// What the batch scripts do after a failure of this class (scripts/sbatch/common.sh acts on it).
struct Reaction {
  bool requeue = false;
  bool drain_suspects = false;  // drain the suspects' nodes (forge-health) and requeue without them
  std::string advice;           // the one line for the user when the job stops for good
  bool restart = false;         // instead of a requeue: the step again in this allocation, on the same nodes
};
Reaction reaction(FailureClass c);

// `forge-train failure RUN_DIR --exit RC [--srun-log FILE] [--lost-node NODE ...] [--max-comm-retries N]
// [--job-signalled 0|1]`, run by the batch script after the step: completes this job's record from what only
// the script sees (srun's lines about killed tasks and node failures, nodes that no longer answer, whether
// the job itself got a stop signal), writes it, and prints the decision as key=value lines (class, restart,
// requeue, drain, deep_check, advice, record) for the script to act on.
int failure_command(int argc, char** argv);

}  // namespace forge::launcher
