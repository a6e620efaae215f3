#include "in_image.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

extern char** environ;

namespace fs = std::filesystem;

namespace forge::launcher {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// The name part of an environment entry ("NAME=value").
std::string env_name(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

// The node's directories the image shows at their own paths: its bind mounts whose source is their
// destination (one seen elsewhere inside does not count).
std::vector<std::string> node_paths_in_image(const Json& image_config) {
  std::vector<std::string> out;
  for (const auto& m : image_config.value("mounts", Json::array())) {
    const auto options = m.value("options", std::vector<std::string>());
    const bool bind = std::find(options.begin(), options.end(), "bind") != options.end() ||
                      std::find(options.begin(), options.end(), "rbind") != options.end();
    const std::string dest = m.value("destination", std::string());
    if (bind && m.value("source", std::string()) == dest) out.push_back(dest);
  }
  return out;
}

// The runtime, as a child this process waits for, passing on the signals Slurm sends the task (preemption's
// SIGUSR1, a cancel's SIGTERM): then the task's bundle directory goes too, also where /tmp outlives the job.
// Returns the child's exit status; a child killed by a signal is this process killed by it.
volatile std::sig_atomic_t runtime_pid = 0;
void pass_on(int sig) {
  if (runtime_pid > 0) ::kill(runtime_pid, sig);
}

int run_removing(const std::string& command, const std::string& dir) {
  const int forwarded[] = {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCONT};
  sigset_t set, before;
  ::sigemptyset(&set);
  for (const int sig : forwarded) ::sigaddset(&set, sig);
  // Held until the child's pid is known, so that none arrives with nowhere to go.
  ::sigprocmask(SIG_BLOCK, &set, &before);
  struct sigaction sa {};
  sa.sa_handler = pass_on;
  for (const int sig : forwarded) ::sigaction(sig, &sa, nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    sa.sa_handler = SIG_DFL;
    for (const int sig : forwarded) ::sigaction(sig, &sa, nullptr);
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid < 0) fail(ExitCode::kIo, "cannot start the OCI runtime: {}", std::strerror(errno));
  runtime_pid = pid;
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (WIFSIGNALED(status)) {
    ::signal(WTERMSIG(status), SIG_DFL);
    ::raise(WTERMSIG(status));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

TaskIds TaskIds::from_environment() {
  TaskIds ids;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  ids.node = env_or("SLURMD_NODENAME", host);
  const uid_t uid = getuid();
  const passwd* pw = getpwuid(uid);
  ids.user = pw != nullptr ? pw->pw_name : std::to_string(uid);
  ids.uid = std::to_string(uid);
  ids.job = env_or("SLURM_JOB_ID", "0");
  ids.step = env_or("SLURM_STEP_ID", "0");
  ids.task = env_or("SLURM_PROCID", "0");
  return ids;
}

Json task_config(const Json& image_config, const std::string& image_dir, const std::vector<std::string>& args,
                 const std::vector<std::string>& env, const std::string& cwd, unsigned uid, unsigned gid) {
  Json config = image_config;
  std::string root = config["root"].value("path", std::string("rootfs"));
  if (root.empty() || root[0] != '/') root = (fs::path(image_dir) / root).lexically_normal().string();
  config["root"]["path"] = root;
  Json& process = config["process"];
  process["args"] = args;
  // The task's environment, then the image's entries over it (PATH, the MPI transport settings).
  std::vector<std::string> merged = env;
  for (const auto& entry : process.value("env", std::vector<std::string>())) {
    std::erase_if(merged, [&](const std::string& e) { return env_name(e) == env_name(entry); });
    merged.push_back(entry);
  }
  process["env"] = merged;
  process["cwd"] = cwd;
  process["user"] = {{"uid", uid}, {"gid", gid}};
  config["linux"]["uidMappings"] = Json::array({{{"containerID", uid}, {"hostID", uid}, {"size", 1}}});
  config["linux"]["gidMappings"] = Json::array({{{"containerID", gid}, {"hostID", gid}, {"size", 1}}});
  return config;
}

std::string runtime_command(const std::string& pattern, const std::string& bundle, const std::string& rootfs,
                            const TaskIds& ids) {
  const std::map<char, std::string> values = {{'%', "%"},      {'b', bundle},   {'r', rootfs},
                                              {'n', ids.node}, {'u', ids.user}, {'U', ids.uid},
                                              {'j', ids.job},  {'s', ids.step}, {'t', ids.task}};
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    const char c = i + 1 < pattern.size() ? pattern[++i] : '\0';
    const auto value = values.find(c);
    if (value == values.end())
      fail(ExitCode::kUsage,
           "oci.conf's RunTimeRun has the pattern '%{}', which forge-train in-image does not fill in "
           "(it knows %b %r %n %u %U %j %s %t %%): docs/IMAGES.md",
           c);
    out += value->second;
  }
  return out;
}

std::string oci_run_pattern(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail(ExitCode::kUsage,
         "cannot read {}: this node's Slurm is not set up to run jobs in images (docs/IMAGES.md)", path);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || line.find('#') < eq) continue;
    std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (key != "runtimerun") continue;
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
      value = value.substr(1, value.size() - 2);
    return value;
  }
  fail(ExitCode::kUsage,
       "{} has no RunTimeRun: the runtime command forge-train in-image runs (docs/IMAGES.md)", path);
}

bool visible_in_image(const Json& image_config, const std::string& path) {
  const fs::path p = fs::weakly_canonical(fs::absolute(path));
  for (const std::string& dest : node_paths_in_image(image_config)) {
    const auto rel = p.lexically_relative(dest);
    if (!rel.empty() && *rel.begin() != "..") return true;
  }
  return false;
}

int in_image_command(int argc, char** argv) {
  if (argc < 4)
    fail(ExitCode::kUsage,
         "usage: forge-train in-image IMAGE PROGRAM [ARGS...] (PROGRAM: a path inside IMAGE)");
  const std::string image = argv[2];
  if (!fs::is_regular_file(fs::path(image) / "config.json") || !fs::is_directory(fs::path(image) / "rootfs"))
    fail(ExitCode::kUsage,
         "image '{}' is not an OCI bundle (no config.json and rootfs/): make one with "
         "forge-image build",
         image);
  const Json image_config = read_json(image + "/config.json");
  std::vector<std::string> args(argv + 3, argv + argc);
  // The working directory and the files named on the command line (the spec) must be where the ranks
  // inside look for them.
  const std::string cwd = fs::current_path().string();
  auto require_visible = [&](const std::string& path, const char* what) {
    if (visible_in_image(image_config, path)) return;
    std::string binds;  // the site's directories: not the system's every image has
    for (const std::string& dest : node_paths_in_image(image_config))
      if (dest != "/proc" && dest != "/sys" && dest != "/dev" && dest.rfind("/etc/", 0) != 0)
        binds += (binds.empty() ? "" : " ") + dest;
    fail(ExitCode::kUsage,
         "{} '{}' is not visible inside image '{}', which shows only {} of this node: move it under one of "
         "them, or build the image with --bind (docs/IMAGES.md)",
         what, path, image, binds);
  };
  require_visible(cwd, "the working directory");
  for (size_t i = 1; i < args.size(); ++i)
    if (args[i].rfind("-", 0) != 0 && fs::is_regular_file(args[i])) require_visible(args[i], "the file");

  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  const Json config =
      task_config(image_config, fs::absolute(image).string(), args, env, cwd, getuid(), getgid());

  // The task's own bundle: its config.json next to nothing else (root.path points into the image). A
  // directory of its own in the temporary directory, never one shared with other users' tasks.
  const TaskIds ids = TaskIds::from_environment();
  const std::string tmp = env_or("TMPDIR", "/tmp");
  std::string dir = fmt::format("{}/forge-oci-{}.{}.{}.XXXXXX", tmp, ids.job, ids.step, ids.task);
  if (mkdtemp(dir.data()) == nullptr)
    fail(ExitCode::kIo, "cannot make the task's bundle directory in {}: {}", tmp, std::strerror(errno));
  write_json_atomic(dir + "/config.json", config);

  const std::string conf_dir = fs::path(env_or("SLURM_CONF", "/etc/slurm/slurm.conf")).parent_path().string();
  const std::string command =
      runtime_command(oci_run_pattern(conf_dir + "/oci.conf"), dir, config["root"]["path"], ids);
  return run_removing(command, dir);
}

}  // namespace forge::launcher
