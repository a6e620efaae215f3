// A sandboxed program's cost from the process that runs it, as a function of that process's memory: a
// trainer scoring code rewards, or a gate running a code suite, holds gigabytes while it starts sandboxes.
// For 0, 1 and 2 GiB touched in this process: the mean wall time of a sandboxed `python3 -I -c 'print(1)'`
// (run_sandboxed: bubblewrap, the gate's limits) and of the same program started bare from the same
// process (posix_spawn), and their ratio; then what the sandbox's own cgroup costs of that (made with its
// limits and removed, no process in it). Usage: bench_sandbox [RUNS]   (default 20 each)
#include "forge/eval_gate/sandbox.h"
#include "sandbox_cgroup.h"  // eval_gate/src: private to the gate

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

extern char** environ;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double bare_ms(int runs) {
  const char* argv[] = {"/usr/bin/python3", "-I", "-c", "print(1)", nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) {
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, const_cast<char**>(argv), environ) != 0) std::exit(1);
    int status;
    waitpid(pid, &status, 0);
  }
  posix_spawn_file_actions_destroy(&actions);
  return seconds_since(t0) / runs * 1e3;
}

double sandboxed_ms(int runs) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) {
    const auto r = forge::gate::run_sandboxed({"/usr/bin/python3", "-I", "-c", "print(1)"}, {}, "/tmp", {});
    if (r.output != "1\n") {
      fmt::print(stderr, "bench_sandbox: the sandboxed program printed '{}' ({})\n", r.output, r.describe());
      std::exit(1);
    }
  }
  return seconds_since(t0) / runs * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<std::vector<char>> held;
  for (int gib = 0; gib <= 2; ++gib) {
    if (gib > 0) {
      held.emplace_back(size_t{1} << 30);
      std::memset(held.back().data(), 1, held.back().size());  // touched: mapped, with page tables
    }
    const double bare = bare_ms(runs), sandboxed = sandboxed_ms(runs);
    fmt::print("{} GiB held: sandboxed {:.1f} ms, bare {:.1f} ms a run: sandbox / bare {:.2f}\n", gib,
               sandboxed, bare, sandboxed / bare);
  }
  const forge::gate::SandboxLimits limits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i)
    forge::gate::SandboxCgroup({limits.memory_bytes, uint64_t(limits.processes), limits.cpus});
  fmt::print("the sandbox's cgroup alone (made with its limits, removed): {:.2f} ms a run\n",
             seconds_since(t0) / runs * 1e3);
}
