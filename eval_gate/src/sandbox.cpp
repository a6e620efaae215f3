#include "forge/eval_gate/sandbox.h"

#include "forge/common/error.h"
#include "sandbox_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>
#include <utility>

namespace forge::gate {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kBwrap = "/usr/bin/bwrap";
constexpr uid_t kNobody = 65534;  // nobody/nogroup on Debian
constexpr int kInfoFd = 3;        // bwrap --info-fd: where bwrap writes the host pid of the sandbox's init
constexpr int kReportFd = 4;      // the child's report when it fails before exec (close-on-exec)
// Tasks of bwrap's own in the sandbox's cgroup: its monitor and the sandbox's init (pid 1).
constexpr int kBwrapTasks = 2;

// Through syscall(): glibc 2.36's <sys/pidfd.h> lacks C++ linkage.
int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int pidfd_kill(int pidfd) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0));
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read, write;
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail(ExitCode::kIo, "sandbox: pipe2 failed: {}", errno_text(errno));
  return {Fd(fds[0]), Fd(fds[1])};
}

// The parent pid of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold anything).
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 4 >= stat.size()) return -1;
  return static_cast<pid_t>(std::strtol(stat.c_str() + paren + 4, nullptr, 10));
}

// Removes the tree at `path` whatever the sandboxed program did to it: modes taken away (the owner or root
// gives them back) and any depth. It walks down and back up through openat() and "..", holding one
// directory open at a time, so neither the open-file limit nor PATH_MAX bounds the depth (which they do for
// std::filesystem::remove_all). Only call it once nothing in the sandbox runs any more.
bool remove_tree(const std::string& path) {
  ::chmod(path.c_str(), 0700);  // to open it (its owner, or root, may)
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  size_t depth = 0;
  for (long steps = 0; steps < 100'000'000; ++steps) {
    ::fchmod(fd, 0700);
    const int listing = ::dup(fd);
    DIR* dir = listing >= 0 ? ::fdopendir(listing) : nullptr;
    if (!dir) {
      if (listing >= 0) ::close(listing);
      break;
    }
    ::rewinddir(dir);
    int child = -1;
    bool stuck = false;
    while (const dirent* e = ::readdir(dir)) {
      const char* name = e->d_name;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      if (::unlinkat(fd, name, 0) == 0) continue;
      if (errno != EISDIR) {
        stuck = true;
        break;
      }
      if (::unlinkat(fd, name, AT_REMOVEDIR) == 0) continue;
      // Not empty (or not ours to list): descend into it.
      ::fchmodat(fd, name, 0700, 0);
      child = ::openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child < 0) stuck = true;
      break;
    }
    ::closedir(dir);
    if (stuck) break;
    if (child >= 0) {
      ::close(fd);
      fd = child;
      ++depth;
      continue;
    }
    if (depth == 0) {
      ::close(fd);
      return ::rmdir(path.c_str()) == 0;
    }
    // This directory is empty now: back to its parent, whose next listing removes it.
    const int up = ::openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ::close(fd);
    if (up < 0) return false;
    fd = up;
    --depth;
  }
  ::close(fd);
  return false;
}

// The scratch directory; removed when the run is over (declared before the child so it outlives it).
class Scratch {
 public:
  explicit Scratch(const std::string& parent) {
    std::string tmpl = (fs::absolute(parent) / "forge-sbx-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      fail(ExitCode::kIo, "sandbox: cannot create a scratch directory in {}: {}", parent, errno_text(errno));
    path_ = tmpl;
  }
  ~Scratch() {
    if (!remove_tree(path_)) spdlog::warn("sandbox: could not remove the scratch directory {}", path_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void check_file_name(const std::string& name) {
  const fs::path p(name);
  bool ok = !name.empty() && p.is_relative() && name.back() != '/';
  for (const auto& part : p) ok = ok && !part.empty() && part != "." && part != "..";
  if (!ok) fail(ExitCode::kUsage, "sandbox: file name '{}' is not a plain relative path", name);
}

void write_file(const fs::path& path, const std::string& content) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) fail(ExitCode::kIo, "sandbox: cannot write {}: {}", path.string(), errno_text(errno));
  for (size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(ExitCode::kIo, "sandbox: cannot write {}: {}", path.string(), errno_text(errno));
    done += static_cast<size_t>(n);
  }
}

// What the child needs, all made before it starts (spawn_child): until exec it may only make system calls
// (no allocation, nothing that touches the memory it shares with its parent).
struct ChildPlan {
  std::vector<char*> argv, envp;
  int stdin_fd = -1, output_fd = -1, info_fd = -1, report_fd = -1;
  std::vector<std::pair<int, rlimit>> limits;
  std::vector<int> cgroup_fds;  // the sandbox's cgroup.procs files, to join
  bool drop_to_nobody = false;
  const char* scratch = nullptr;
};

enum ChildStage : int { kStageFds = 1, kStageCgroup, kStageLimits, kStageUser, kStageReach, kStageExec };

// Tells the parent where the child failed, and why (errno).
[[noreturn]] __attribute__((no_sanitize("address"))) void child_failed(int report, ChildStage stage) {
  const int message[2] = {stage, errno};
  [[maybe_unused]] const ssize_t n = ::write(report, message, sizeof message);
  ::_exit(127);
}

// Not instrumented by AddressSanitizer (nor is child_failed): it runs on spawn_child's stack, which ASan does
// not know, under the sandbox's address-space limit, and ASan's bookkeeping before a call that never returns
// would size and map for a stack it cannot see.
[[noreturn]] __attribute__((no_sanitize("address"))) void run_child(const ChildPlan& plan) {
  int report = plan.report_fd;
  // Into the sandbox's cgroup first, while still the caller's uid (who made it): bwrap and everything it
  // starts are born there.
  for (const int fd : plan.cgroup_fds)
    if (::write(fd, "0", 1) != 1) child_failed(report, kStageCgroup);
  // Lift the four descriptors above 0..4 first, so that placing them cannot overwrite one another.
  int fds[4] = {plan.stdin_fd, plan.output_fd, plan.info_fd, plan.report_fd};
  for (int& fd : fds)
    if ((fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 10)) < 0) child_failed(report, kStageFds);
  report = fds[3];
  if (::dup2(fds[0], 0) < 0 || ::dup2(fds[1], 1) < 0 || ::dup2(fds[1], 2) < 0 ||
      ::dup2(fds[2], kInfoFd) < 0 || ::dup3(fds[3], kReportFd, O_CLOEXEC) < 0)
    child_failed(report, kStageFds);
  report = kReportFd;
  // Nothing else of the gate's (sockets, checkpoints, other sandboxes' pipes) may reach the sandbox.
  if (::close_range(kReportFd + 1, ~0U, 0) != 0) child_failed(report, kStageFds);

  // A clean slate of signals: ignored ones would stay ignored across exec.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);

  // bwrap's monitor leads its own process group, so that a timeout can kill it and its init at once.
  if (::setpgid(0, 0) != 0 || ::chdir("/") != 0) child_failed(report, kStageFds);
  for (const auto& [resource, limit] : plan.limits)
    if (::setrlimit(resource, &limit) != 0) child_failed(report, kStageLimits);
  // The raw system calls: glibc's wrappers would have every thread of the parent, whose memory this child
  // shares (spawn_child), change its credentials too.
  if (plan.drop_to_nobody &&
      (::syscall(SYS_setgroups, 0, nullptr) != 0 || ::syscall(SYS_setgid, kNobody) != 0 ||
       ::syscall(SYS_setuid, kNobody) != 0 || ::getuid() != kNobody))
    child_failed(report, kStageUser);
  // bwrap opens the scratch by its path, as the sandbox's uid.
  if (::access(plan.scratch, X_OK) != 0) child_failed(report, kStageReach);
  ::execve(kBwrap, plan.argv.data(), plan.envp.data());
  child_failed(report, kStageExec);
}

// Starts run_child(plan) as posix_spawn starts its children: on a stack of its own, in the parent's memory
// until it execs (CLONE_VM | CLONE_VFORK; the calling thread waits until then), rather than by fork, which
// copies the page tables of the caller's whole address space: a trainer's or a gate's gigabytes, tens of
// milliseconds a gigabyte here, for every reward. run_child makes system calls only, none that changes what
// the parent shares with it.
__attribute__((no_sanitize("address"))) int child_entry(void* plan) {
  run_child(*static_cast<const ChildPlan*>(plan));
}

pid_t spawn_child(const ChildPlan& plan) {
  constexpr size_t kStackBytes = 64 * 1024;
  const std::unique_ptr<char[]> stack(new char[kStackBytes]);
  return ::clone(child_entry, stack.get() + kStackBytes, CLONE_VM | CLONE_VFORK | SIGCHLD,
                 const_cast<ChildPlan*>(&plan));
}

// Kills and reaps the child unless it was reaped already (an exception between its start and the wait).
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid <= 0) return;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
};

// What the program sees of the host, read-only: the system directories its interpreter needs (/usr, the
// merged-/usr links or directories beside it, the loader's cache) and, for an interpreter installed
// outside /usr (a virtual environment: /opt/venv/bin/python), its installation. Nothing else: no homes,
// run directories, datasets or other users' files, whatever their modes.
std::vector<std::string> system_binds(const std::string& program) {
  std::vector<std::string> args = {"--ro-bind", "/usr", "/usr"};
  for (const char* dir : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    if (fs::is_symlink(dir, ec)) {
      args.insert(args.end(), {"--symlink", fs::read_symlink(dir, ec).string(), dir});
    } else if (fs::is_directory(dir, ec)) {
      args.insert(args.end(), {"--ro-bind", dir, dir});
    }
  }
  for (const char* file : {"/etc/ld.so.cache", "/etc/alternatives"})
    args.insert(args.end(), {"--ro-bind-try", file, file});
  const fs::path prefix = fs::path(program).parent_path().parent_path();
  if (!prefix.empty() && prefix != "/" && prefix != "/usr" && prefix.string().rfind("/usr/", 0) != 0)
    args.insert(args.end(), {"--ro-bind", prefix.string(), prefix.string()});
  return args;
}

}  // namespace

std::string SandboxResult::describe() const {
  std::string line;
  switch (status) {
    case SandboxStatus::kExited:
      line = fmt::format("exit {}", exit_code);
      break;
    case SandboxStatus::kSignaled: {
      const char* abbrev = ::sigabbrev_np(signal);
      line = abbrev ? fmt::format("killed by signal {} (SIG{})", signal, abbrev)
                    : fmt::format("killed by signal {}", signal);
      break;
    }
    case SandboxStatus::kCpuLimit:
      line = "CPU time limit exceeded";
      break;
    case SandboxStatus::kTimedOut:
      line = fmt::format("timed out after {:.1f} s", wall_seconds);
      break;
    case SandboxStatus::kMemoryLimit:
      line = "killed by the memory limit";
      break;
  }
  if (task_limit_hit) line += ", task limit reached";
  if (output_truncated) line += ", output truncated";
  return line;
}

SandboxResult run_sandboxed(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& files,
                            const std::string& scratch_parent, const SandboxLimits& limits) {
  if (argv.empty() || argv[0].empty() || argv[0][0] != '/')
    fail(ExitCode::kUsage, "sandbox: the program must be given by its absolute path");
  if (::access(kBwrap, X_OK) != 0)
    fail(ExitCode::kUsage, "sandbox: {} not found: install bubblewrap (scripts/install-deps.sh)", kBwrap);
  for (const auto& [name, content] : files) check_file_name(name);

  // Root hands the program to nobody, who owns nothing on the host.
  const bool drop = ::geteuid() == 0;
  const uid_t sandbox_uid = drop ? kNobody : ::getuid();

  const SandboxCgroup cgroup(
      {limits.memory_bytes, static_cast<uint64_t>(std::max(limits.processes, 1)) + kBwrapTasks, limits.cpus});
  Scratch scratch(scratch_parent);
  for (const auto& [name, content] : files) write_file(fs::path(scratch.path()) / name, content);
  if (drop) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(scratch.path(), ec); !ec && it != fs::end(it);
         it.increment(ec))
      if (::lchown(it->path().c_str(), kNobody, kNobody) != 0)
        fail(ExitCode::kIo, "sandbox: cannot chown {}: {}", it->path().string(), errno_text(errno));
    if (ec || ::chown(scratch.path().c_str(), kNobody, kNobody) != 0)
      fail(ExitCode::kIo, "sandbox: cannot hand {} to uid {}", scratch.path(), kNobody);
  }

  // The per-process limits (the cgroup bounds their sum). RLIMIT_AS, RLIMIT_CPU and RLIMIT_FSIZE bind each
  // process on its own; bwrap's own processes are small and have address spaces of their own, so
  // memory_bytes needs no room for them. Without root the hard limits in force cannot be raised.
  const int cpu = std::max(1, static_cast<int>(std::ceil(limits.cpu_seconds)));
  const std::pair<int, rlim_t> wanted[] = {
      {RLIMIT_CPU, static_cast<rlim_t>(cpu)},
      {RLIMIT_AS, limits.memory_bytes},
      {RLIMIT_FSIZE, limits.file_bytes},
      {RLIMIT_CORE, 0},
  };
  ChildPlan plan;
  plan.cgroup_fds = cgroup.join_fds();
  for (const auto& [resource, value] : wanted) {
    rlimit current{};
    ::getrlimit(resource, &current);
    // CPU: SIGXCPU at the soft limit (reported as kCpuLimit), SIGKILL a second later if it is caught.
    rlim_t hard = resource == RLIMIT_CPU ? value + 1 : value;
    if (!drop) hard = std::min(hard, current.rlim_max);
    plan.limits.push_back({resource, rlimit{std::min(value, hard), hard}});
  }

  std::vector<std::string> args = {
      kBwrap,
      // Fresh namespaces: no network (not even the host's loopback), own pids, ipc, uts, cgroup; inside, no
      // further user namespaces.
      "--unshare-all", "--unshare-user", "--disable-userns",
      // Killing bwrap kills the sandbox (its init is pid 1 of the pid namespace); no terminal to hijack.
      "--die-with-parent", "--new-session", "--info-fd", std::to_string(kInfoFd)};
  const std::vector<std::string> binds = system_binds(argv[0]);
  args.insert(args.end(), binds.begin(), binds.end());
  // /dev minimal and read-only but for a small private /dev/shm (Python's multiprocessing wants it; tmpfs
  // memory escapes RLIMIT_AS, hence the size); the scratch is /tmp and the cwd.
  args.insert(args.end(), {"--dev", "/dev", "--remount-ro", "/dev", "--size",
                           std::to_string(std::max<uint64_t>(limits.file_bytes, 4096)), "--tmpfs", "/dev/shm",
                           "--proc", "/proc", "--bind", scratch.path(), "/tmp", "--chdir", "/tmp",
                           // The root bwrap made for the mounts above: read-only from here on.
                           "--remount-ro", "/", "--"});
  args.insert(args.end(), argv.begin(), argv.end());
  // The environment bwrap hands on unchanged: nothing of the gate's.
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8",
                                  "PYTHONDONTWRITEBYTECODE=1"};
  for (auto& a : args) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  for (auto& e : env) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);

  Pipe output = make_pipe(), info = make_pipe(), report = make_pipe();
  Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull) fail(ExitCode::kIo, "sandbox: cannot open /dev/null: {}", errno_text(errno));
  // The program's writes block when the pipe is full; only our end polls.
  ::fcntl(output.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(info.read.get(), F_SETFL, O_NONBLOCK);
  plan.stdin_fd = devnull.get();
  plan.output_fd = output.write.get();
  plan.info_fd = info.write.get();
  plan.report_fd = report.write.get();
  plan.drop_to_nobody = drop;
  plan.scratch = scratch.path().c_str();

  const auto start = Clock::now();
  ChildGuard child;
  child.pid = spawn_child(plan);
  if (child.pid < 0) fail(ExitCode::kIo, "sandbox: cannot start a process: {}", errno_text(errno));
  output.write.reset();
  info.write.reset();
  report.write.reset();
  devnull.reset();

  // The child either reaches exec (the close-on-exec report pipe reads EOF) or says where it failed.
  int message[2] = {0, 0};
  ssize_t got;
  while ((got = ::read(report.read.get(), message, sizeof message)) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof message)) {
    const int err = message[1];
    switch (message[0]) {
      case kStageReach:
        fail(ExitCode::kUsage,
             "sandbox: uid {} cannot reach the scratch directory {}: {} (make {} searchable)", sandbox_uid,
             scratch.path(), errno_text(err), scratch_parent);
      case kStageExec:
        fail(ExitCode::kUsage, "sandbox: cannot run {}: {}: install bubblewrap (scripts/install-deps.sh)",
             kBwrap, errno_text(err));
      case kStageUser:
        fail(ExitCode::kIo, "sandbox: cannot switch to uid {}: {}", kNobody, errno_text(err));
      case kStageLimits:
        fail(ExitCode::kIo, "sandbox: cannot set the resource limits: {}", errno_text(err));
      case kStageCgroup:
        fail(ExitCode::kComm, "sandbox: cannot join its cgroup {}: {}", cgroup.path(), errno_text(err));
      default:
        fail(ExitCode::kIo, "sandbox: cannot set up the child's descriptors: {}", errno_text(err));
    }
  }
  report.read.reset();

  Fd monitor(pidfd_open(child.pid));  // bwrap: our child, not yet reaped, so the pid is its own
  if (!monitor) fail(ExitCode::kIo, "sandbox: pidfd_open failed: {}", errno_text(errno));
  Fd init;  // the sandbox's pid 1: when it has gone, so has everything in its pid namespace
  std::string info_text;
  SandboxResult result;
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(std::max(limits.wall_seconds, 0.0)));
  bool output_open = true, info_open = true, exited = false, timed_out = false;
  std::string chunk(64 << 10, '\0');
  while (output_open || !exited) {
    const auto now = Clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    pollfd fds[3];
    int n = 0, out_at = -1, info_at = -1, monitor_at = -1;
    if (output_open) fds[out_at = n++] = {output.read.get(), POLLIN, 0};
    if (info_open) fds[info_at = n++] = {info.read.get(), POLLIN, 0};
    if (!exited) fds[monitor_at = n++] = {monitor.get(), POLLIN, 0};
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    if (::poll(fds, n, static_cast<int>(std::min<int64_t>(wait_ms, 1000))) < 0) {
      if (errno == EINTR) continue;
      fail(ExitCode::kIo, "sandbox: poll failed: {}", errno_text(errno));
    }
    if (out_at >= 0 && fds[out_at].revents) {
      const ssize_t r = ::read(output.read.get(), chunk.data(), chunk.size());
      if (r > 0) {
        const size_t keep = std::min(static_cast<size_t>(r), limits.output_bytes - result.output.size());
        result.output.append(chunk.data(), keep);
        if (keep < static_cast<size_t>(r)) result.output_truncated = true;
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        output_open = false;
      }
    }
    if (info_at >= 0 && fds[info_at].revents) {
      const ssize_t r = ::read(info.read.get(), chunk.data(), chunk.size());
      if (r > 0) info_text.append(chunk.data(), static_cast<size_t>(r));
      if (r == 0 || info_text.find('}') != std::string::npos ||
          (r < 0 && errno != EAGAIN && errno != EINTR)) {
        info_open = false;
        info.read.reset();
        const auto key = info_text.find("\"child-pid\":");
        const pid_t pid = key == std::string::npos
                              ? -1
                              : static_cast<pid_t>(std::strtol(info_text.c_str() + key + 12, nullptr, 10));
        // The pid is the sandbox's init if, with the pidfd open, its parent is still our bwrap.
        if (pid > 0) {
          init = Fd(pidfd_open(pid));
          if (init && parent_of(pid) != child.pid) init.reset();
        }
      }
    }
    if (monitor_at >= 0 && fds[monitor_at].revents) exited = true;
  }

  if (timed_out) {
    if (init) pidfd_kill(init.get());
    ::kill(-child.pid, SIGKILL);
  }
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  child.pid = -1;
  // bwrap's monitor exits as soon as the init reports the program's exit, without waiting for or reaping
  // the init, which then kills what is left in the pid namespace: wait for the init's end. (Its zombie is
  // reaped by the host's init, or the nearest subreaper.)
  if (init) {
    pollfd fd = {init.get(), POLLIN, 0};
    int r;
    while ((r = ::poll(&fd, 1, 10'000)) < 0 && errno == EINTR) {
    }
    if (r == 0) spdlog::warn("sandbox: the sandbox's init (pidfd) did not end within 10 s of bwrap");
  }

  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (timed_out) {
    result.status = SandboxStatus::kTimedOut;
    result.signal = SIGKILL;
  } else if (WIFSIGNALED(status)) {
    result.status = SandboxStatus::kSignaled;
    result.signal = WTERMSIG(status);
  } else if (const int code = WEXITSTATUS(status); code > 128 && code - 128 < NSIG) {
    result.signal = code - 128;
    result.status = result.signal == SIGXCPU ? SandboxStatus::kCpuLimit : SandboxStatus::kSignaled;
  } else {
    result.status = SandboxStatus::kExited;
    result.exit_code = code;
  }
  // The memory limit kills with SIGKILL, as other causes may: the cgroup's count tells it apart.
  if (result.status == SandboxStatus::kSignaled && result.signal == SIGKILL && cgroup.memory_limit_hit())
    result.status = SandboxStatus::kMemoryLimit;
  result.task_limit_hit = cgroup.task_limit_hit();
  return result;
}

}  // namespace forge::gate
