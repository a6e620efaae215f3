// The real machine behind Probes: statvfs, /proc, /dev/kmsg, and child processes with a deadline.
#include "forge/health/probes.h"

#include "forge/common/text.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace forge::health {
namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return s.str();
}

// NUL-separated /proc/PID/{cmdline,environ}.
std::vector<std::string> nul_split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = std::min(s.find('\0', pos), s.size());
    out.emplace_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

class SystemProbes final : public Probes {
 public:
  std::optional<DiskSpace> disk_space(const std::string& path, std::string& error) override {
    struct statvfs v {};
    if (::statvfs(path.c_str(), &v) != 0) {
      error = errno_text(errno);
      return std::nullopt;
    }
    DiskSpace d;
    d.free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    d.total_bytes = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
    d.free_inodes = v.f_favail;
    d.total_inodes = v.f_files;
    return d;
  }

  std::optional<std::string> read_file(const std::string& path) override { return slurp(path); }

  bool is_directory(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }

  bool have_program(const std::string& program) override {
    if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
    const char* path = std::getenv("PATH");
    for (const auto& dir : split_list(path ? path : "/usr/bin:/bin", ':'))
      if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    return false;
  }

  CommandOutput run(const std::vector<std::string>& argv, const std::string& input,
                    double timeout_s) override;

  int64_t now_s() override { return static_cast<int64_t>(::time(nullptr)); }

  double uptime_s() override {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }

  std::string getenv(const std::string& name) override {
    const char* v = std::getenv(name.c_str());
    return v ? v : "";
  }

  std::vector<std::string> kernel_log() override {
    std::vector<std::string> out;
    const int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return out;
    char buf[8192];
    // One record per read; EAGAIN at the end; EPIPE when the ring overwrote the record being read.
    for (int i = 0; i < 200000; ++i) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        std::string rec(buf, static_cast<size_t>(n));
        if (rec.find("NVRM") != std::string::npos) out.push_back(rec.substr(0, rec.find('\n')));
        continue;
      }
      if (n < 0 && (errno == EPIPE || errno == EINTR)) continue;
      break;
    }
    ::close(fd);
    return out;
  }

  std::vector<ProcessInfo> processes() override {
    std::vector<ProcessInfo> out;
    DIR* d = ::opendir("/proc");
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
      const auto pid = parse_int(e->d_name);
      if (!pid || *pid <= 0) continue;
      const std::string base = std::string("/proc/") + e->d_name;
      ProcessInfo p;
      p.pid = static_cast<int>(*pid);
      const auto stat = slurp(base + "/stat");
      if (!stat) continue;  // gone
      // "pid (comm) S ppid ...": comm may hold spaces and parentheses; cut after the last ')'.
      const size_t close = stat->rfind(')');
      if (close != std::string::npos) {
        std::istringstream rest(stat->substr(close + 1));
        std::string state;
        rest >> state >> p.ppid;
        if (state == "Z") continue;  // a zombie holds nothing but its pid
      }
      if (const auto comm = slurp(base + "/comm")) p.comm = trim(*comm);
      if (const auto cmdline = slurp(base + "/cmdline")) p.argv = nul_split(*cmdline);
      char link[256];
      const ssize_t n = ::readlink((base + "/ns/mnt").c_str(), link, sizeof link - 1);
      if (n > 0) p.mnt_ns.assign(link, static_cast<size_t>(n));
      if (const auto env = slurp(base + "/environ"))
        for (const auto& kv : nul_split(*env))
          if (kv.rfind("SLURM_JOB_ID=", 0) == 0) p.slurm_job_id = kv.substr(13);
      out.push_back(std::move(p));
    }
    ::closedir(d);
    return out;
  }

  int self_pid() override { return static_cast<int>(::getpid()); }

  bool kill_process(int pid) override { return ::kill(pid, SIGKILL) == 0 || errno == ESRCH; }

  std::string write_read_test(const std::string& dir) override {
    const std::string path = dir + "/.forge-health-test." + std::to_string(::getpid());
    std::string data(1 << 20, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return "create " + path + ": " + errno_text(errno);
    std::string error;
    size_t done = 0;
    while (done < data.size() && error.empty()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno != EINTR) error = "write " + path + ": " + errno_text(errno);
      if (n > 0) done += static_cast<size_t>(n);
    }
    if (error.empty() && ::fsync(fd) != 0) error = "fsync " + path + ": " + errno_text(errno);
    ::close(fd);
    if (error.empty()) {
      const auto back = slurp(path);
      if (!back)
        error = "read back " + path + ": " + errno_text(errno);
      else if (*back != data)
        error = "read back " + path + ": content differs from what was written";
    }
    ::unlink(path.c_str());
    return error;
  }
};

CommandOutput SystemProbes::run(const std::vector<std::string>& argv, const std::string& input,
                                double timeout_s) {
  CommandOutput result;
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
    result.not_found = true;
    result.err = "pipe: " + errno_text(errno);
    return result;
  }
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    result.not_found = true;
    result.err = "pipe: " + errno_text(errno);
    return result;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  // Its own process group, so a timeout kills what it started too (munge, nvidia-smi helpers).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& s : copy) args.push_back(s.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    result.not_found = true;
    result.err = argv[0] + ": " + errno_text(rc);
    return result;
  }
  // The inputs here are a munge credential (a few hundred bytes): far below the pipe's buffer, so one
  // write cannot block on a child that does not read.
  const std::string to_write = input.substr(0, 32768);
  signal(SIGPIPE, SIG_IGN);
  if (!to_write.empty() && ::write(in_pipe[1], to_write.data(), to_write.size()) < 0) {
    // The child exited without reading; its status says why.
  }
  ::close(in_pipe[1]);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        if (sinks[i]->size() < (1u << 20)) sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace

std::unique_ptr<Probes> system_probes() {
  return std::make_unique<SystemProbes>();
}

}  // namespace forge::health
