#include "sandbox_cgroup.h"

#include "forge/common/error.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <thread>

namespace forge::gate {
namespace {

constexpr std::array<const char*, 3> kControllers = {"memory", "pids", "cpu"};
constexpr const char* kDelegated = "forge-sandbox";  // a site's delegated directory at a hierarchy's root
constexpr int kPeriodUs = 100'000;

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Writes `value` to a cgroup file; errno's text on failure, "" on success.
std::string write_value(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno_text(errno);
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  return n == static_cast<ssize_t>(value.size()) ? "" : errno_text(n < 0 ? err : EIO);
}

// "key value" lines (memory.events, pids.events, memory.oom_control): the value of `key`, 0 if absent.
uint64_t event_count(const std::string& path, const std::string& key) {
  std::istringstream in(read_text(path));
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

std::vector<std::string> split(const std::string& s, char by) {
  std::vector<std::string> parts;
  std::istringstream in(s);
  for (std::string part; std::getline(in, part, by);) parts.push_back(part);
  return parts;
}

// The hierarchies this process sees: each controller's v1 mount and its path within it, and the v2 mount.
struct Hierarchy {
  std::string mount, own;  // mount point; this process's cgroup under it (mount-relative, "" at the root)
};
struct Hierarchies {
  std::map<std::string, Hierarchy> v1;  // by controller
  Hierarchy v2;                         // mount empty if none
  std::vector<std::string> v2_controllers;
};

// /proc/self/mountinfo: "id parent dev root mountpoint opts [optional...] - fstype source superopts";
// /proc/self/cgroup: "id:controllers:path" (v2: "0::path"). A mount whose root is a subtree (a container's
// view) holds the process's path less that root.
Hierarchies find_hierarchies() {
  std::map<std::string, std::string> own_v1;
  std::string own_v2;
  std::istringstream cgroups(read_text("/proc/self/cgroup"));
  for (std::string line; std::getline(cgroups, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) own_v2 = path;
    for (const std::string& c : split(controllers, ',')) own_v1[c] = path;
  }
  auto relative = [](const std::string& own, const std::string& root) {
    const std::string path = root != "/" && own.rfind(root, 0) == 0 ? own.substr(root.size()) : own;
    return path == "/" ? std::string() : path;
  };
  Hierarchies h;
  std::istringstream mounts(read_text("/proc/self/mountinfo"));
  for (std::string line; std::getline(mounts, line);) {
    const std::vector<std::string> f = split(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string& root = f[3];
    const std::string& point = f[4];
    const std::string& fstype = dash[1];
    if (fstype == "cgroup2") {
      h.v2 = {point, relative(own_v2, root)};
    } else if (fstype == "cgroup") {
      for (const std::string& option : split(dash[3], ','))
        if (own_v1.count(option)) h.v1[option] = {point, relative(own_v1[option], root)};
    }
  }
  if (!h.v2.mount.empty()) h.v2_controllers = split(read_text(h.v2.mount + "/cgroup.controllers"), ' ');
  for (std::string& c : h.v2_controllers) c.erase(std::remove(c.begin(), c.end(), '\n'), c.end());
  return h;
}

bool has_all(const std::vector<std::string>& have) {
  return std::all_of(kControllers.begin(), kControllers.end(),
                     [&](const char* c) { return std::find(have.begin(), have.end(), c) != have.end(); });
}

// A name no other sandbox of this host uses at the same time.
std::string group_name() {
  static std::atomic<uint64_t> counter{0};
  return "forge-sbx-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// Makes `name` under the process's own cgroup of `h`, else under the hierarchy's delegated directory: its
// path, or throws naming both tries.
std::string make_group(const Hierarchy& h, const std::string& name, const char* what) {
  const std::string own = h.mount + h.own, delegated = h.mount + "/" + kDelegated;
  if (::mkdir((own + "/" + name).c_str(), 0755) == 0) return own + "/" + name;
  const std::string own_error = errno_text(errno);
  if (::mkdir((delegated + "/" + name).c_str(), 0755) == 0) return delegated + "/" + name;
  fail(ExitCode::kComm,
       "sandbox: cannot make its {} cgroup in {} ({}) nor in {} ({}); a sandbox does not run without its "
       "limits: run the gate as root, or have the site delegate {} to its users (docs/ADMISSION.md, Code "
       "sandboxes)",
       what, own, own_error, delegated, errno_text(errno), delegated);
}

}  // namespace

SandboxCgroup::SandboxCgroup(const CgroupLimits& limits) {
  const Hierarchies h = find_hierarchies();
  const std::string name = group_name();
  const uint64_t quota = std::max<uint64_t>(1000, std::llround(limits.cpus * kPeriodUs));
  // The settings, file by file, in order (v1's memsw limit may not be below the memory one).
  std::vector<std::pair<std::string, std::string>> settings;
  if (has_all(h.v2_controllers)) {
    version_ = 2;
    std::string parent = h.v2.mount + h.v2.own;
    const std::vector<std::string> delegating = split(read_text(parent + "/cgroup.subtree_control"), ' ');
    if (!has_all(delegating)) {
      // Its own cgroup holds processes (the gate), so it cannot hand controllers to children (cgroup v2's
      // no-internal-process rule). Root makes a group of its own at the hierarchy's root instead.
      if (::geteuid() != 0)
        fail(ExitCode::kComm,
             "sandbox: its cgroup {} does not delegate the memory, pids and cpu controllers to children; a "
             "sandbox does not run without its limits: run the gate as root or in a delegated cgroup "
             "(docs/ADMISSION.md, Code sandboxes)",
             parent);
      parent = h.v2.mount + "/" + kDelegated;
      ::mkdir(parent.c_str(), 0755);
      for (const std::string& dir : {h.v2.mount, parent})
        if (const std::string e = write_value(dir + "/cgroup.subtree_control", "+memory +pids +cpu");
            !e.empty())
          fail(ExitCode::kComm, "sandbox: cannot enable the memory, pids and cpu controllers in {}: {}", dir,
               e);
    }
    const std::string dir = parent + "/" + name;
    if (::mkdir(dir.c_str(), 0755) != 0)
      fail(ExitCode::kComm, "sandbox: cannot make its cgroup {}: {}", dir, errno_text(errno));
    dirs_ = {dir};
    settings = {{dir + "/memory.max", std::to_string(limits.memory_bytes)},
                {dir + "/memory.swap.max", "0"},
                {dir + "/pids.max", std::to_string(limits.tasks)},
                {dir + "/cpu.max", std::to_string(quota) + " " + std::to_string(kPeriodUs)}};
  } else if (std::all_of(kControllers.begin(), kControllers.end(),
                         [&](const char* c) { return h.v1.count(c); })) {
    version_ = 1;
    for (const char* c : kControllers) {
      try {
        dirs_.push_back(make_group(h.v1.at(c), name, c));
      } catch (...) {
        remove();
        throw;
      }
    }
    const std::string &memory = dirs_[0], &pids = dirs_[1], &cpu = dirs_[2];
    settings = {{memory + "/memory.limit_in_bytes", std::to_string(limits.memory_bytes)},
                {memory + "/memory.memsw.limit_in_bytes", std::to_string(limits.memory_bytes)},
                {pids + "/pids.max", std::to_string(limits.tasks)},
                {cpu + "/cpu.cfs_period_us", std::to_string(kPeriodUs)},
                {cpu + "/cpu.cfs_quota_us", std::to_string(quota)}};
  } else {
    fail(ExitCode::kComm,
         "sandbox: this host mounts no cgroup hierarchy with the memory, pids and cpu controllers "
         "(/proc/self/mountinfo); a sandbox does not run without its limits");
  }
  for (const auto& [file, value] : settings) {
    // Swap accounting is a kernel option: without it there is no swap to limit.
    if ((file.ends_with("memsw.limit_in_bytes") || file.ends_with("swap.max")) && !exists(file)) continue;
    if (const std::string e = write_value(file, value); !e.empty()) {
      remove();
      fail(ExitCode::kComm, "sandbox: cannot set {} to {}: {}", file, value, e);
    }
  }
  for (const std::string& dir : dirs_) {
    const int fd = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      remove();
      fail(ExitCode::kComm, "sandbox: cannot open {}/cgroup.procs: {}", dir, errno_text(err));
    }
    join_.push_back(fd);
  }
}

SandboxCgroup::~SandboxCgroup() {
  remove();
}

bool SandboxCgroup::memory_limit_hit() const {
  return version_ == 2 ? event_count(dirs_[0] + "/memory.events", "oom_kill") > 0
                       : event_count(dirs_[0] + "/memory.oom_control", "oom_kill") > 0;
}

bool SandboxCgroup::task_limit_hit() const {
  return event_count(dirs_[version_ == 2 ? 0 : 1] + "/pids.events", "max") > 0;
}

// Kills what is left (the program's orphans, when bwrap's init was killed first), then removes the group,
// waiting up to a second for the killed processes to leave it.
void SandboxCgroup::remove() {
  for (const int fd : join_) ::close(fd);
  join_.clear();
  if (version_ == 2 && !dirs_.empty()) write_value(dirs_[0] + "/cgroup.kill", "1");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (const std::string& dir : dirs_) {
    while (::rmdir(dir.c_str()) != 0) {
      if (errno != EBUSY || std::chrono::steady_clock::now() > deadline) {
        spdlog::warn("sandbox: cannot remove its cgroup {}: {}", dir, errno_text(errno));
        break;
      }
      std::istringstream procs(read_text(dir + "/cgroup.procs"));
      for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  dirs_.clear();
}

}  // namespace forge::gate
