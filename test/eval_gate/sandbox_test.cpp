// The sandbox for candidate programs: hostile programs stay contained and fail, the host is left as it was,
// and honest ones pass. Candidates run under Debian's /usr/bin/python3.
#include "forge/eval_gate/sandbox.h"
#include "forge/common/error.h"
#include "forge/eval_gate/tasks.h"
#include "support/temp_dir.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <tuple>

using namespace forge::gate;
namespace fs = std::filesystem;

namespace {

const std::string kPython = "/usr/bin/python3";

// A string no other process on the host has in its command line.
std::string unique_marker() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return "forge-sbx-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(rd());
}

// Processes on the host whose command line holds `marker`.
int processes_with(const std::string& marker) {
  int found = 0;
  DIR* proc = ::opendir("/proc");
  REQUIRE(proc);
  while (const dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline");
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(marker) != std::string::npos) ++found;
  }
  ::closedir(proc);
  return found;
}

bool is_empty_dir(const fs::path& dir) {
  return fs::is_directory(dir) && fs::is_empty(dir);
}

// A scratch parent: the sandbox's uid (nobody, when the test runs as root) must be able to search it.
struct Parent {
  forge::test::TempDir dir;
  Parent() { fs::permissions(dir.path(), fs::perms(0711)); }
  std::string path() const { return dir.path().string(); }
};

// Runs `program` as prog.py under python3, with `marker` as its first argument.
SandboxResult run_python(const std::string& program, const std::string& parent,
                         const SandboxLimits& limits = {}, const std::string& marker = "-",
                         std::map<std::string, std::string> files = {}) {
  files["prog.py"] = program;
  return run_sandboxed({kPython, "prog.py", marker}, files, parent, limits);
}

// Forks sleeping children until a fork fails; prints how many it made and the errno.
const std::string kForkBomb = R"py(
import os, sys, time
n = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("fork failed after", n, e.errno)
    sys.exit(1)
print("forked", n)
)py";

// The forks kForkBomb made before one failed with EAGAIN; -1 if it did not say so.
int forks_before_refusal(const std::string& output) {
  int forked = -1, err = -1;
  const auto at = output.find("fork failed after ");
  if (at == std::string::npos ||
      std::sscanf(output.c_str() + at, "fork failed after %d %d", &forked, &err) != 2 || err != EAGAIN)
    return -1;
  return forked;
}

// The sandbox cgroups of process `pid` (this one's by default) still on the host: forge-sbx-<pid>-N in any
// hierarchy.
std::vector<std::string> sandbox_cgroups(pid_t pid = ::getpid()) {
  std::vector<std::string> found;
  const std::string prefix = "forge-sbx-" + std::to_string(pid) + "-";
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator("/sys/fs/cgroup",
                                                  fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::end(it); it.increment(ec)) {
    if (!it->is_directory(ec) || it->is_symlink(ec)) {
      continue;
    }
    if (it->path().filename().string().rfind(prefix, 0) == 0) found.push_back(it->path().string());
  }
  return found;
}

// Fast limits for the hostile programs.
SandboxLimits tight() {
  SandboxLimits limits;
  limits.cpu_seconds = 2;
  limits.wall_seconds = 4;
  return limits;
}

}  // namespace

TEST_CASE("sandbox: an honest program passes; its output, exit code and files") {
  Parent parent;
  SECTION("print") {
    const auto r = run_python("print('ok')\n", parent.path());
    CHECK(r.passed());
    CHECK(r.status == SandboxStatus::kExited);
    CHECK(r.exit_code == 0);
    CHECK(r.output == "ok\n");
    CHECK_FALSE(r.output_truncated);
    CHECK(r.describe() == "exit 0");
  }
  SECTION("exit codes propagate; stderr joins stdout") {
    const auto r = run_python(
        "import sys\nprint('out', flush=True)\nsys.stderr.write('err\\n')\nsys.exit(3)\n", parent.path());
    CHECK_FALSE(r.passed());
    CHECK(r.status == SandboxStatus::kExited);
    CHECK(r.exit_code == 3);
    CHECK(r.output == "out\nerr\n");
    CHECK(r.describe() == "exit 3");
  }
  SECTION("the given files, the scratch as cwd and /tmp, a clean environment") {
    const std::string program = R"py(
import os, sys
assert os.getcwd() == "/tmp", os.getcwd()
assert open("data/in.txt").read() == "hello", "input file"
with open("out.txt", "w") as f:
    f.write("scratch")
assert open("/tmp/out.txt").read() == "scratch", "scratch is /tmp"
assert os.getuid() != 0, "not root"
print(" ".join(sorted(os.environ)))
)py";
    const auto r = run_python(program, parent.path(), {}, "-", {{"data/in.txt", "hello"}});
    INFO(r.output);
    CHECK(r.passed());
    CHECK(r.output == "HOME LANG PATH PWD PYTHONDONTWRITEBYTECODE\n");  // PWD: bwrap's --chdir
  }
  CHECK(is_empty_dir(parent.path()));  // the scratch is gone
}

TEST_CASE("sandbox: no network, not even the host's loopback") {
  // A listener on the host's loopback, and proof that it takes connections.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);
  {
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const int accepted = ::accept(listener, nullptr, nullptr);
    CHECK(accepted >= 0);
    ::close(accepted);
    ::close(probe);
  }

  Parent parent;
  const std::string program = R"py(
import socket, sys
connected = False
for host, port in [("1.1.1.1", 80), ("127.0.0.1", int(sys.argv[2]))]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("connected", host)
        connected = True
    except OSError as e:
        print("blocked", host, e.errno)
sys.exit(0 if connected else 1)
)py";
  const auto r = run_sandboxed({kPython, "prog.py", "-", std::to_string(port)}, {{"prog.py", program}},
                               parent.path(), tight());
  INFO(r.output);
  CHECK_FALSE(r.passed());
  CHECK(r.output.find("blocked 1.1.1.1") != std::string::npos);
  CHECK(r.output.find("blocked 127.0.0.1") != std::string::npos);
  CHECK(r.output.find("connected") == std::string::npos);
  CHECK(::accept(listener, nullptr, nullptr) < 0);  // nothing reached the host's listener
  ::close(listener);
}

TEST_CASE("sandbox: a fork bomb hits the process limit and leaves no process behind") {
  Parent parent;
  const std::string marker = unique_marker();
  const auto r = run_python(kForkBomb, parent.path(), tight(), marker);
  INFO(r.output);
  CHECK_FALSE(r.passed());
  // Stopped at the sandbox's task limit (its cgroup's pids.max: EAGAIN): `processes` tasks of the program's,
  // the interpreter being one.
  CHECK(forks_before_refusal(r.output) == SandboxLimits{}.processes - 1);
  CHECK(r.task_limit_hit);
  CHECK(r.describe().find("task limit reached") != std::string::npos);
  CHECK(r.wall_seconds < 4);  // it did not wait for the sleeping children
  CHECK(processes_with(marker) == 0);
  CHECK(is_empty_dir(parent.path()));
  CHECK(sandbox_cgroups().empty());
}

TEST_CASE("sandbox: sandboxes running at once each have their own task allowance") {
  // Under RLIMIT_NPROC, which counts uid 65534's tasks host-wide, two fork bombs shared one allowance.
  Parent parent;
  std::vector<SandboxResult> results(2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = run_python(kForkBomb, parent.path(), tight()); });
  for (auto& t : threads) t.join();
  for (const SandboxResult& r : results) {
    INFO(r.output);
    CHECK(forks_before_refusal(r.output) == SandboxLimits{}.processes - 1);
  }
  CHECK(sandbox_cgroups().empty());
}

TEST_CASE("sandbox: the memory of the sandbox as a whole is bounded") {
  // Each process stays well under its address-space limit; together they pass the sandbox's memory.
  Parent parent;
  SandboxLimits limits = tight();
  limits.memory_bytes = 256ull << 20;
  const std::string program = R"py(
import os, time
r, w = os.pipe()
if os.fork() == 0:
    held = b"\1" * (100 << 20)
    os.write(w, b"x")
    time.sleep(30)
    os._exit(0)
os.read(r, 1)
held = []
for _ in range(40):
    held.append(b"\1" * (10 << 20))
print("allocated", len(held) * 10, "MiB beside the child's 100")
)py";
  const auto r = run_python(program, parent.path(), limits);
  INFO(r.output);
  CHECK(r.status == SandboxStatus::kMemoryLimit);
  CHECK(r.describe() == "killed by the memory limit");
  CHECK(r.output.find("allocated") == std::string::npos);
  CHECK(r.output.find("MemoryError") == std::string::npos);  // not RLIMIT_AS: each process is far below it
  CHECK(sandbox_cgroups().empty());
}

TEST_CASE("sandbox: the sandbox's CPU share is bounded") {
  // Two busy processes for a second of wall-clock time: unbounded they would take up to two CPU-seconds.
  Parent parent;
  SandboxLimits limits = tight();
  limits.cpus = 0.25;
  const std::string program = R"py(
import os, time
for _ in range(2):
    if os.fork() == 0:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        os._exit(0)
os.wait(); os.wait()
t = os.times()
print("cpu", t.children_user + t.children_system)
)py";
  const auto r = run_python(program, parent.path(), limits);
  INFO(r.output);
  REQUIRE(r.passed());
  double cpu = -1;
  REQUIRE(std::sscanf(r.output.c_str(), "cpu %lf", &cpu) == 1);
  // A quarter of a CPU over one second, give or take a CFS period (0.1 s) of either process.
  CHECK(cpu > 0.1);
  CHECK(cpu < 0.5);
}

namespace {

// Runs run_sandboxed as uid 65534 with the given groups (the first the primary), in a child process of
// root's: its exit code, the message of what it threw, and its pid.
std::tuple<int, std::string, pid_t> sandbox_as_nobody(const std::vector<gid_t>& groups,
                                                      const std::string& parent) {
  int report[2];
  REQUIRE(::pipe(report) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(report[0]);
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(groups.front()) != 0 ||
        ::setuid(65534) != 0)
      ::_exit(100);
    int code = 0;
    try {
      const SandboxResult r = run_sandboxed({kPython, "-c", "print('ran')"}, {}, parent, tight());
      code = r.output == "ran\n" ? 0 : 101;
    } catch (const forge::Error& e) {
      [[maybe_unused]] const ssize_t n = ::write(report[1], e.what(), std::strlen(e.what()));
      code = static_cast<int>(e.code());
    }
    ::_exit(code);
  }
  ::close(report[1]);
  std::string message(4096, '\0');
  const ssize_t n = ::read(report[0], message.data(), message.size());
  message.resize(n > 0 ? size_t(n) : 0);
  ::close(report[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), message, pid};
}

// A site's delegated directory for the memory hierarchy (scripts/devcluster/up makes one), if any.
const char* const kDelegatedMemory = "/sys/fs/cgroup/memory/forge-sandbox";

}  // namespace

TEST_CASE("sandbox: one that cannot have its cgroup does not run (69)") {
  // Needs a uid without write access to its cgroup: nobody, by root's setuid.
  if (::geteuid() != 0) return;
  struct stat st {};
  if (::stat(kDelegatedMemory, &st) == 0 && (st.st_mode & S_IWOTH)) {
    WARN(kDelegatedMemory << " is open to everyone: every uid may have a cgroup here; not checked");
    return;
  }
  Parent parent;
  fs::permissions(parent.path(), fs::perms(0777));
  const auto [code, message, pid] = sandbox_as_nobody({65534}, parent.path());
  INFO(message);
  CHECK(code == 69);
  CHECK(message.find("cannot make its memory cgroup in /sys/fs/cgroup/memory") != std::string::npos);
  CHECK(message.find("forge-sandbox") != std::string::npos);
  CHECK(is_empty_dir(parent.path()));  // no scratch either: nothing ran
  CHECK(sandbox_cgroups(pid).empty());
}

TEST_CASE("sandbox: a member of a site's delegated directory has its cgroup there") {
  struct stat st {};
  if (::geteuid() != 0 || ::stat(kDelegatedMemory, &st) != 0) {
    WARN("no delegated " << kDelegatedMemory
                         << " (scripts/devcluster/up makes one) or not root; not checked");
    return;
  }
  Parent parent;
  fs::permissions(parent.path(), fs::perms(0777));
  // nobody, with the directory's group: its own cgroup is root's, the delegated one takes it.
  const auto [code, message, pid] = sandbox_as_nobody({st.st_gid, 65534}, parent.path());
  INFO(message);
  CHECK(code == 0);
  CHECK(is_empty_dir(parent.path()));
  CHECK(sandbox_cgroups(pid).empty());
}

TEST_CASE("sandbox: 10 GB of memory is refused") {
  Parent parent;
  const auto r = run_python("b = bytearray(10 * 2**30)\nprint('allocated')\n", parent.path(), tight());
  INFO(r.output);
  CHECK_FALSE(r.passed());
  CHECK(r.status == SandboxStatus::kExited);
  CHECK(r.output.find("MemoryError") != std::string::npos);
  CHECK(r.output.find("allocated") == std::string::npos);
}

TEST_CASE("sandbox: nothing outside the scratch is writable") {
  // A scratch parent the sandbox sees (read-only) at its own path, unlike one under /tmp.
  std::string tmpl = "/var/tmp/forge-sbx-parent-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  const fs::path parent = tmpl;
  fs::permissions(parent, fs::perms(0711));
  const std::string name = unique_marker();
  const std::vector<std::string> outside = {"/var/tmp/" + name, (parent / name).string(), "/etc/" + name,
                                            "/dev/" + name};
  const std::string program = R"py(
import sys
escaped = False
for path in sys.argv[2:]:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        print("wrote", path)
        escaped = True
    except OSError as e:
        print("blocked", path, e.strerror)
# /tmp is the scratch: writable, and private to the sandbox.
with open("/tmp/" + sys.argv[1], "w") as f:
    f.write("inside")
assert open("/tmp/" + sys.argv[1]).read() == "inside"
sys.exit(0 if escaped else 1)
)py";
  std::vector<std::string> argv = {kPython, "prog.py", name};
  argv.insert(argv.end(), outside.begin(), outside.end());
  const auto r = run_sandboxed(argv, {{"prog.py", program}}, parent.string(), tight());
  INFO(r.output);
  CHECK_FALSE(r.passed());
  CHECK(r.status == SandboxStatus::kExited);
  CHECK(r.exit_code == 1);  // every outside write was refused and the scratch write worked
  // Outside the system directories there is nothing to write into; /etc holds only the loader's cache.
  CHECK(r.output.find("blocked /var/tmp/" + name + " No such file or directory") != std::string::npos);
  CHECK(r.output.find("blocked " + (parent / name).string() + " No such file or directory") !=
        std::string::npos);
  CHECK(r.output.find("blocked /etc/" + name + " Read-only file system") != std::string::npos);
  for (const auto& path : outside) CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists("/tmp/" + name));  // the host's real /tmp
  CHECK(is_empty_dir(parent));
  fs::remove_all(parent);
}

TEST_CASE("sandbox: only the system directories are visible, not the host's other files") {
  // A world-readable file where a team's data might sit, the scratch's own parent, users' homes and the
  // host's configuration: none of them exists for the program, while its interpreter runs.
  std::string tmpl = "/var/tmp/forge-sbx-data-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  const fs::path data = tmpl;
  fs::permissions(data, fs::perms(0755));
  std::ofstream(data / "dataset.txt") << "secret";
  fs::permissions(data / "dataset.txt", fs::perms(0644));
  Parent parent;
  const std::vector<std::string> hidden = {(data / "dataset.txt").string(),
                                           parent.path(),
                                           "/home",
                                           "/root",
                                           "/etc/passwd",
                                           "/etc/shadow",
                                           "/var",
                                           "/srv",
                                           "/opt",
                                           "/work"};
  std::string program =
      "import os, sys\nseen = [p for p in sys.argv[2:] if os.path.exists(p)]\n"
      "print('seen', seen)\nassert os.path.exists('/usr/bin/python3')\n"
      "sys.exit(1 if seen else 0)\n";
  std::vector<std::string> argv = {kPython, "prog.py", "-"};
  argv.insert(argv.end(), hidden.begin(), hidden.end());
  const auto r = run_sandboxed(argv, {{"prog.py", program}}, parent.path(), tight());
  INFO(r.output);
  CHECK(r.passed());
  CHECK(r.output.find("seen []") != std::string::npos);
  fs::remove_all(data);
}

TEST_CASE("sandbox: an endless loop is stopped by the CPU limit, a sleeper by the wall clock") {
  Parent parent;
  SECTION("CPU") {
    const std::string marker = unique_marker();
    const auto r = run_python("while True:\n    pass\n", parent.path(), tight(), marker);
    CHECK_FALSE(r.passed());
    CHECK(r.status == SandboxStatus::kCpuLimit);
    CHECK(r.wall_seconds >= 1.9);
    CHECK(r.wall_seconds < 4);
    CHECK(r.describe() == "CPU time limit exceeded");
    CHECK(processes_with(marker) == 0);
  }
  SECTION("wall clock, with children of its own") {
    const std::string marker = unique_marker();
    SandboxLimits limits = tight();
    limits.wall_seconds = 1;
    const auto r = run_python("import os, time\nos.fork()\ntime.sleep(100)\n", parent.path(), limits, marker);
    CHECK_FALSE(r.passed());
    CHECK(r.status == SandboxStatus::kTimedOut);
    CHECK(r.wall_seconds >= 1);
    CHECK(r.wall_seconds < 3);
    CHECK(r.describe().rfind("timed out after 1.", 0) == 0);
    CHECK(processes_with(marker) == 0);
  }
  CHECK(is_empty_dir(parent.path()));
}

TEST_CASE("sandbox: binary junk output is cut at output_bytes") {
  Parent parent;
  const auto r = run_python("import os\nos.write(1, os.urandom(10**7))\n", parent.path(), tight());
  CHECK(r.status == SandboxStatus::kExited);
  CHECK(r.exit_code == 0);
  CHECK(r.output.size() == SandboxLimits{}.output_bytes);
  CHECK(r.output_truncated);
  const std::string line = r.describe();
  CHECK(line == "exit 0, output truncated");
  CHECK(std::all_of(line.begin(), line.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
}

TEST_CASE("sandbox: a background child does not outlive the run") {
  Parent parent;
  const std::string marker = unique_marker();
  const std::string program = R"py(
import subprocess, sys
subprocess.Popen([sys.argv[1], "300"], executable="/usr/bin/sleep")
print("started")
)py";
  const auto r = run_python(program, parent.path(), tight(), marker);
  CHECK(r.passed());
  CHECK(r.output == "started\n");
  CHECK(r.wall_seconds < 3);
  CHECK(processes_with(marker) == 0);
}

TEST_CASE("sandbox: the file size limit") {
  Parent parent;
  const std::string program = R"py(
with open("big", "wb") as f:
    for _ in range(100):
        f.write(b"\0" * 2**20)
print("wrote 100 MB")
)py";
  const auto r = run_python(program, parent.path(), tight());
  INFO(r.output);
  CHECK_FALSE(r.passed());
  CHECK(r.output.find("File too large") != std::string::npos);
  CHECK(r.output.find("wrote 100 MB") == std::string::npos);
  CHECK(is_empty_dir(parent.path()));
}

TEST_CASE("sandbox: the scratch is removed whatever the program made of it") {
  Parent parent;
  // Modes taken away at every level, the scratch's own included, and a tree deeper than PATH_MAX and the
  // open-file limit.
  const std::string program = R"py(
import os
os.makedirs("ro/sub")
open("ro/sub/f", "w").write("x")
os.chmod("ro/sub/f", 0)
os.chmod("ro/sub", 0o500)
os.chmod("ro", 0)
os.mkdir("deep")
os.chdir("deep")
for i in range(2100):
    os.mkdir("d")
    os.chdir("d")
    if i % 1000 == 0:
        open("f", "w").write("x")
        os.chmod("f", 0)
        os.chmod("..", 0o500)
os.chmod("/tmp/deep", 0o500)
os.chmod("/tmp", 0)
print("done")
)py";
  const auto r = run_python(program, parent.path());  // default limits: slow disks take their time
  INFO(r.describe() + ": " + r.output);
  CHECK(r.passed());
  CHECK(is_empty_dir(parent.path()));
}

TEST_CASE("sandbox: runs side by side from several threads") {
  Parent parent;
  constexpr int kThreads = 4;
  std::vector<SandboxResult> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      results[i] =
          run_python("import sys\nopen('mine', 'w').write(sys.argv[1])\nprint(open('mine').read())\n",
                     parent.path(), tight(), std::to_string(i));
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    CHECK(results[i].passed());
    CHECK(results[i].output == std::to_string(i) + "\n");
  }
  CHECK(is_empty_dir(parent.path()));
}

TEST_CASE("sandbox: setup errors") {
  Parent parent;
  auto code_of = [](const auto& body) {
    try {
      body();
    } catch (const forge::Error& e) {
      return e.code();
    }
    return forge::ExitCode::kOk;
  };
  CHECK(code_of([&] {
          run_sandboxed({"python3", "-c", "pass"}, {}, parent.path(), {});
        }) == forge::ExitCode::kUsage);
  CHECK(code_of([&] {
          run_sandboxed({kPython, "-c", "pass"}, {{"../x", ""}}, parent.path(), {});
        }) == forge::ExitCode::kUsage);
  CHECK(code_of([&] {
          run_sandboxed({kPython, "-c", "pass"}, {{"/etc/x", ""}}, parent.path(), {});
        }) == forge::ExitCode::kUsage);
  CHECK(code_of([&] {
          run_sandboxed({kPython, "-c", "pass"}, {}, parent.path() + "/missing", {});
        }) == forge::ExitCode::kIo);
  if (::geteuid() == 0) {
    // As root the program runs as nobody, who cannot search a 0700 directory of root's.
    forge::test::TempDir closed;
    fs::permissions(closed.path(), fs::perms(0700));
    CHECK(code_of([&] {
            run_sandboxed({kPython, "-c", "pass"}, {}, closed.path().string(), {});
          }) == forge::ExitCode::kUsage);
    CHECK(is_empty_dir(closed.path()));
  }
  CHECK(is_empty_dir(parent.path()));
}

TEST_CASE("code tasks: hostile completions are contained and scored as failed") {
  // The gate's path (tasks.h): a chat reply's fenced code, then the task's tests, then the sentinel, run in
  // the sandbox. Each completion also defines the function right, so only what the sandbox stops (or the
  // sentinel it never printed) makes it fail.
  const Parent parent;
  Suite suite;
  suite.type = SuiteType::kCode;
  Task task;
  task.id = "one";
  task.tests = "assert f() == 1";
  const std::string marker = unique_marker(), outside = "/var/tmp/" + marker, sentinel = "ok-" + marker;
  const std::map<std::string, std::string> hostile = {
      {"socket", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n"},
      {"fork",
       "import os, time\nfor _ in range(1000):\n    if os.fork() == 0:\n        time.sleep(30)\n"
       "        os._exit(0)\n"},
      {"memory", "block = bytearray(10 * 2**30)\n"},
      {"outside", "open('" + outside + "', 'w').write('x')\n"},
      {"loop", "while True:\n    pass\n"},
      {"junk", "import os\nos.write(1, os.urandom(10**6))\n"},
      {"early exit", "import sys\nsys.exit(0)\n"}};
  const SandboxLimits limits = tight();
  const auto score = [&](const std::string& code) {
    const std::string reply = "```python\n" + code + "def f():\n    return 1\n```";
    return run_sandboxed({kPython, "-I", "solution.py", marker},
                         {{"solution.py", code_program(suite, task, reply, sentinel)}}, parent.path(),
                         limits);
  };
  for (const auto& [name, body] : hostile) {
    const SandboxResult r = score(body);
    INFO(name << ": " << r.describe());
    CHECK_FALSE(code_passed(r, sentinel));
  }
  // The honest completion passes on the same path, and the host is as it was.
  const SandboxResult honest = score("");
  INFO(honest.describe() << " " << honest.output);
  CHECK(code_passed(honest, sentinel));
  CHECK_FALSE(fs::exists(outside));
  CHECK(processes_with(marker) == 0);
  CHECK(is_empty_dir(parent.path()));
}
