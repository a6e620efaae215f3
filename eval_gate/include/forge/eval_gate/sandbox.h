// Running an untrusted candidate program (a model's generated code under a task's tests) so that it can
// neither harm nor reach the host: bubblewrap (/usr/bin/bwrap) gives it fresh namespaces (no network, its
// own pids), a read-only view of the system directories only (/usr and the merged-/usr links, the loader's
// cache, the interpreter's installation; no homes, run directories or datasets) and one writable scratch
// directory; setrlimit bounds what each of its
// processes may use, and a wall-clock timeout bounds the whole run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::gate {

struct SandboxLimits {
  double cpu_seconds = 10;             // RLIMIT_CPU of each process (SIGXCPU, a second later SIGKILL)
  double wall_seconds = 20;            // then the whole sandbox is killed
  uint64_t memory_bytes = 1ull << 30;  // RLIMIT_AS of each process (so a fork bomb may map processes x this)
  // Tasks (processes and threads) the program may add, by RLIMIT_NPROC. The kernel counts a uid's tasks
  // host-wide, so the limit is set to this plus what the uid runs at the start; sandboxes running at the
  // same time share uid 65534 and can still eat into one another's allowance.
  int processes = 64;
  uint64_t file_bytes = 16ull << 20;  // RLIMIT_FSIZE: the largest file it may write; also /dev/shm's size
  size_t output_bytes = 64 << 10;     // stdout+stderr kept; the rest is read and dropped
};

enum class SandboxStatus {
  kExited,    // the program ended on its own: exit_code
  kSignaled,  // killed by `signal` (its own doing, or RLIMIT_AS's, ...)
  kCpuLimit,  // killed by RLIMIT_CPU
  kTimedOut,  // still running after wall_seconds: the sandbox was killed
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

  bool passed() const { return status == SandboxStatus::kExited && exit_code == 0; }
  // One short printable line: "exit 1", "killed by signal 9 (SIGKILL)", "timed out after 20.0 s", ...
  // (No CPU time: bwrap's monitor exits without reaping the sandbox, so wait4's rusage cannot see it.)
  std::string describe() const;
};

// Runs argv (argv[0] an absolute path) in a fresh scratch directory, created under `scratch_parent` and
// removed afterwards, in which `files` (relative name -> content; names may hold subdirectories) are
// written first. The program sees the scratch directory as its working directory and as /tmp, and nothing
// else writable; no network; the environment is PATH, HOME=/tmp, LANG and PYTHONDONTWRITEBYTECODE only.
// Run as root, the program runs as uid/gid 65534 (nobody), since the kernel does not apply RLIMIT_NPROC to
// root: `scratch_parent` must then be searchable by that uid. Safe to call from several threads at once.
// Throws forge::Error: kUsage when bwrap is missing, argv or a file name is unfit, or the scratch is out of
// uid 65534's reach; kIo when the scratch cannot be made or written.
SandboxResult run_sandboxed(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& files,
                            const std::string& scratch_parent, const SandboxLimits& limits = {});

}  // namespace forge::gate
