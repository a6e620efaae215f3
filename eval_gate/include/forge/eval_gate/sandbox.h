// Running an untrusted candidate program (a model's generated code under a task's tests) so that it can
// neither harm nor reach the host: bubblewrap (/usr/bin/bwrap) gives it fresh namespaces (no network, its
// own pids), a read-only view of the system directories only (/usr and the merged-/usr links, the loader's
// cache, the interpreter's installation; no homes, run directories or datasets) and one writable scratch
// directory; a control group of its own bounds what the sandbox as a whole may use (memory, tasks, CPU),
// setrlimit what each of its processes may, and a wall-clock timeout the whole run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::gate {

struct SandboxLimits {
  double cpu_seconds = 10;   // RLIMIT_CPU of each process (SIGXCPU, a second later SIGKILL)
  double wall_seconds = 20;  // then the whole sandbox is killed
  // Memory: of the whole sandbox (its cgroup: resident memory, its tmpfs and page cache; past it the
  // kernel kills a process of the sandbox's), and the address space of each process (RLIMIT_AS: an
  // allocation that large fails inside the program, as MemoryError in Python).
  uint64_t memory_bytes = 1ull << 30;
  // Tasks (processes and threads) the program may add, counted in the sandbox's cgroup (pids.max): each
  // sandbox has its own allowance, whatever others run at the same time.
  int processes = 64;
  double cpus = 1;  // CPU time per wall-clock time of the whole sandbox (its cgroup's CFS quota)
  uint64_t file_bytes = 16ull << 20;  // RLIMIT_FSIZE: the largest file it may write; also /dev/shm's size
  size_t output_bytes = 64 << 10;     // stdout+stderr kept; the rest is read and dropped
};

enum class SandboxStatus {
  kExited,       // the program ended on its own: exit_code
  kSignaled,     // killed by `signal` (its own doing, or RLIMIT_AS's, ...)
  kCpuLimit,     // killed by RLIMIT_CPU
  kTimedOut,     // still running after wall_seconds: the sandbox was killed
  kMemoryLimit,  // a process was killed by the sandbox's memory limit (its cgroup's)
};

struct SandboxResult {
  SandboxStatus status = SandboxStatus::kExited;
  // bwrap reports a program killed by signal N as exit 128 + N, as a shell does, so an exit code above 128
  // reads as a signal.
  int exit_code = -1;
  int signal = 0;
  double wall_seconds = 0;
  std::string output;  // stdout and stderr interleaved, at most limits.output_bytes, raw bytes
  bool output_truncated = false;
  bool task_limit_hit = false;  // a fork or thread was refused at the sandbox's task limit

  bool passed() const { return status == SandboxStatus::kExited && exit_code == 0; }
  // One short printable line: "exit 1", "killed by signal 9 (SIGKILL)", "timed out after 20.0 s", ...
  // (No CPU time: bwrap's monitor exits without reaping the sandbox, so wait4's rusage cannot see it.)
  std::string describe() const;
};

// Runs argv (argv[0] an absolute path) in a fresh scratch directory, created under `scratch_parent` and
// removed afterwards, in which `files` (relative name -> content; names may hold subdirectories) are
// written first. The program sees the scratch directory as its working directory and as /tmp, and nothing
// else writable; no network; the environment is PATH, HOME=/tmp, LANG and PYTHONDONTWRITEBYTECODE only.
// Run as root, the program runs as uid/gid 65534 (nobody): `scratch_parent` must then be searchable by
// that uid. The cgroup (eval_gate/src/sandbox_cgroup.h) is made under the caller's own, or under a site's
// delegated forge-sandbox directory. Safe to call from several threads at once.
// Throws forge::Error: kUsage when bwrap is missing, argv or a file name is unfit, or the scratch is out of
// uid 65534's reach; kComm (69) when the sandbox cannot have its cgroup (it never runs without it); kIo
// when the scratch cannot be made or written.
SandboxResult run_sandboxed(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& files,
                            const std::string& scratch_parent, const SandboxLimits& limits = {});

}  // namespace forge::gate
