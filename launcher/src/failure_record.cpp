#include "failure_record.h"

#include "forge/common/local_rank.h"
#include "forge/common/log.h"
#include "forge/common/text.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <utility>

namespace forge::launcher {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 11> kNames = {"preempted", "config",     "data",    "numeric",
                                                     "oom_host",  "oom_device", "gpu",     "comm",
                                                     "node_lost", "io",         "internal"};
constexpr int kFormat = 1;
constexpr size_t kMaxEvidence = 20, kMaxLine = 400;

std::vector<std::string> g_rank_hosts;
std::atomic<int64_t> g_last_step{-1};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json suspects_json(const std::vector<Suspect>& suspects) {
  Json out = Json::array();
  for (const Suspect& s : suspects) out.push_back({{"rank", s.rank}, {"host", s.host}});
  return out;
}

const double g_process_start_s = now_s();

}  // namespace

std::string_view failure_class_name(FailureClass c) {
  return kNames[size_t(c)];
}

std::optional<FailureClass> parse_failure_class(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return FailureClass(i);
  return std::nullopt;
}

FailureClass failure_class(ExitCode code, Fault fault) {
  switch (fault) {
    case Fault::kOomHost:
      return FailureClass::kOomHost;
    case Fault::kOomDevice:
      return FailureClass::kOomDevice;
    case Fault::kGpu:
      return FailureClass::kGpu;
    case Fault::kNone:
      break;
  }
  switch (code) {
    case ExitCode::kPreempted:
      return FailureClass::kPreempted;
    case ExitCode::kUsage:
      return FailureClass::kConfig;
    case ExitCode::kData:
      return FailureClass::kData;
    case ExitCode::kNumeric:
      return FailureClass::kNumeric;
    case ExitCode::kComm:
      return FailureClass::kComm;
    case ExitCode::kIo:
      return FailureClass::kIo;
    default:
      return FailureClass::kInternal;
  }
}

JobKey JobKey::from_environment() {
  JobKey k;
  k.job = env_or("SLURM_JOB_ID", "local");
  k.restart = int(parse_int(env_or("SLURM_RESTART_COUNT", "0")).value_or(0));
  k.attempt = int(parse_int(env_or("FORGE_STEP_ATTEMPT", "0")).value_or(0));
  return k;
}

std::string failure_record_path(const std::string& run_dir, const JobKey& key) {
  const std::string name = key.attempt == 0 ? fmt::format("{}-{}.json", key.job, key.restart)
                                            : fmt::format("{}-{}.{}.json", key.job, key.restart, key.attempt);
  return (fs::path(run_dir) / "failures" / name).string();
}

namespace {

// The attempt before `key` in this job: the step before it in the same allocation, or the last step of the
// instance before the requeue (the newest attempt of that restart with a record).
std::optional<JobKey> previous_attempt(const std::string& run_dir, const JobKey& key) {
  if (key.attempt > 0) return JobKey{key.job, key.restart, key.attempt - 1};
  if (key.restart == 0) return std::nullopt;
  JobKey k{key.job, key.restart - 1, 0};
  std::error_code ec;
  while (fs::exists(failure_record_path(run_dir, {k.job, k.restart, k.attempt + 1}), ec)) ++k.attempt;
  return k;
}

}  // namespace

void set_rank_hosts(std::vector<std::string> hosts) {
  g_rank_hosts = std::move(hosts);
}

void set_last_finished_step(int64_t step) {
  g_last_step = step;
}

int64_t last_finished_step() {
  return g_last_step;
}

std::string rank_host(int rank) {
  return rank >= 0 && size_t(rank) < g_rank_hosts.size() ? g_rank_hosts[size_t(rank)] : std::string();
}

bool write_failure_record(const std::string& run_dir, const JobKey& key, const FailureRecord& record,
                          const std::string& spec_hash, bool replace) {
  try {
    // A spec rejected before its run began leaves no run directory behind, not even for its record: the
    // error line says what is wrong, and the batch script's decision needs no file.
    if (!fs::is_directory(run_dir)) return false;
    const std::string path = failure_record_path(run_dir, key);
    fs::create_directories(fs::path(path).parent_path());
    Json evidence = Json::array();
    for (const std::string& e : record.evidence)
      if (evidence.size() < kMaxEvidence) evidence.push_back(printable(e, kMaxLine));
    const Json doc{{"format", kFormat},
                   {"run", fs::absolute(run_dir).lexically_normal().string()},
                   {"spec_hash", spec_hash},
                   {"job_id", key.job},
                   {"restart", key.restart},
                   {"attempt", key.attempt},
                   {"nodes", env_or("SLURM_JOB_NODELIST", node_name())},
                   {"class", std::string(failure_class_name(record.cls))},
                   {"exit_code", record.exit_code},
                   {"step", record.step},
                   {"time", now_s()},
                   {"written_by", {{"host", node_name()}, {"pid", int(getpid())}}},
                   {"suspects", suspects_json(record.suspects)},
                   {"evidence", std::move(evidence)},
                   {"advice", reaction(record.cls).advice}};
    if (replace) {
      write_json_atomic(path, doc);
      return true;
    }
    // First writer wins: the complete file is linked into place, which fails if another rank was first.
    const std::string tmp = fmt::format("{}.{}.{}.tmp", path, node_name(), getpid());
    write_json_atomic(tmp, doc);
    bool won = ::link(tmp.c_str(), path.c_str()) == 0;
    if (!won) {
      // Two exceptions to "first wins": outside Slurm every run is job "local" restart 0, so a record older
      // than this process is another run's; and a rank that names suspects (the one stuck in its own work)
      // says more than one of the same class that could not (a rank waiting for it in a collective).
      const Json there = read_json(path);
      const bool stale = key.job == "local" && there.value("time", 0.0) < g_process_start_s;
      const bool sharper = !record.suspects.empty() && there.value("suspects", Json::array()).empty() &&
                           there.value("class", std::string()) == failure_class_name(record.cls);
      if (stale || sharper) {
        fs::rename(tmp, path);
        return true;
      }
    }
    ::unlink(tmp.c_str());
    return won;
  } catch (const std::exception& e) {
    spdlog::warn("failure record not written under {}/failures: {}", run_dir, e.what());
    return false;
  }
}

std::optional<Json> read_failure_record(const std::string& run_dir, const JobKey& key) {
  const std::string path = failure_record_path(run_dir, key);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    Json doc = read_json(path);
    const std::string run = fs::absolute(run_dir).lexically_normal().string();
    if (doc.value("job_id", std::string()) != key.job || doc.value("restart", -1) != key.restart ||
        doc.value("attempt", 0) != key.attempt || doc.value("run", std::string()) != run) {
      spdlog::warn("{}: a failure record of job {} restart {} in {}, not of this job; ignored", path,
                   doc.value("job_id", std::string("?")), doc.value("restart", -1),
                   doc.value("run", std::string("?")));
      return std::nullopt;
    }
    if (!parse_failure_class(doc.value("class", std::string()))) {
      spdlog::warn("{}: unknown failure class '{}'; ignored", path, doc.value("class", std::string()));
      return std::nullopt;
    }
    return doc;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable failure record ({}); ignored", path, e.what());
    return std::nullopt;
  }
}

Reaction reaction(FailureClass c) {
  switch (c) {
    case FailureClass::kPreempted:
      return {true, false, ""};
    case FailureClass::kComm:
      return {true, false, "run again up to FORGE_MAX_COMM_RETRIES times (default 2) in a row"};
    case FailureClass::kGpu:
    case FailureClass::kNodeLost:
      return {true, true, "the suspect node is drained; the job requeues without it"};
    case FailureClass::kConfig:
      return {false, false, "fix the key named above in the job spec and resubmit"};
    case FailureClass::kData:
      return {false, false,
              "check the dataset or checkpoint named above (forge-data verify, forge-ckpt verify), then "
              "resubmit"};
    case FailureClass::kNumeric:
      return {false, false,
              "lower optim.lr or raise guard.max_bad_steps, then resubmit (the run resumes from its last "
              "checkpoint)"};
    case FailureClass::kOomHost:
      return {false, false,
              "needs less host memory per node: lower data.batch (raise parallel.microbatches to keep the "
              "batch), raise parallel.tp or parallel.pp, set parallel.zero = 1, or ask for more --mem"};
    case FailureClass::kOomDevice:
      return {
          false, false,
          "needs less device memory: lower data.batch (raise parallel.microbatches to keep the batch), raise "
          "parallel.tp or parallel.pp, or set parallel.zero = 1"};
    case FailureClass::kIo:
      return {false, false,
              "free space or fix permissions under run.dir, then resubmit (the run resumes from its last "
              "checkpoint)"};
    case FailureClass::kInternal:
      break;
  }
  return {false, false, "an internal error: report it with the job's log"};
}

namespace {

// What srun and slurmstepd said about the step, in their own words (Slurm 22.05).
struct SrunEvidence {
  std::vector<Suspect> killed;  // tasks killed by a signal before srun began to end the step
  std::set<std::string> failed_nodes;
  bool oom_kill = false;
  std::vector<std::string> lines;
};

std::vector<int> task_list(const std::string& text) {
  std::vector<int> out;
  std::regex part(R"((\d+)(?:-(\d+))?)");
  for (std::sregex_iterator it(text.begin(), text.end(), part), end; it != end; ++it) {
    const int a = std::stoi((*it)[1]), b = (*it)[2].matched ? std::stoi((*it)[2]) : a;
    for (int t = a; t <= b && out.size() < 4096; ++t) out.push_back(t);
  }
  return out;
}

SrunEvidence read_srun_log(const std::string& path) {
  SrunEvidence ev;
  std::ifstream in(path);
  const std::regex killed(
      R"(srun: error: (\S+): tasks? ([0-9,\-]+): (Killed|Terminated|Segmentation fault|Aborted))");
  std::string line;
  bool ending = false;  // srun is ending the step: later deaths are its doing (or the batch script's)
  while (std::getline(in, line)) {
    std::smatch m;
    bool keep = false;
    if (std::regex_search(line, m, killed)) {
      if (!ending)
        for (int t : task_list(m[2])) ev.killed.push_back({t, m[1]});
      keep = true;
    }
    if (line.find("Terminating StepId=") != std::string::npos) ending = true;
    if (line.find("Node failure on ") != std::string::npos) {
      const auto at = line.find("Node failure on ") + 16;
      ev.failed_nodes.insert(line.substr(at, line.find_first_of(" ,.", at) - at));
      keep = true;
    } else if (line.find("DUE TO NODE FAILURE") != std::string::npos) {
      keep = true;
    }
    if (line.find("oom_kill") != std::string::npos || line.find("oom-kill") != std::string::npos ||
        line.find("Out Of Memory") != std::string::npos) {
      ev.oom_kill = true;
      keep = true;
    }
    if (line.find("Exited with exit code") != std::string::npos) keep = true;
    if (keep && ev.lines.size() < kMaxEvidence) ev.lines.push_back(line);
  }
  return ev;
}

}  // namespace

int failure_command(int argc, char** argv) {
  const char* usage =
      "usage: forge-train failure RUN_DIR --exit RC [--srun-log FILE] [--lost-node NODE ...] "
      "[--max-comm-retries N] [--job-signalled 0|1]";
  if (argc < 3) fail(ExitCode::kUsage, "{}", usage);
  init_logging(0, 1, "info", false);  // warnings to stderr: stdout is the decision the script reads
  const std::string run_dir = argv[2];
  int rc = -1, max_comm_retries = 2;
  bool job_signalled = true;  // unknown: take a preemption for what it says
  std::string srun_log, spec_hash;
  std::vector<std::string> lost;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) fail(ExitCode::kUsage, "{} needs a value ({})", a, usage);
    const std::string v = argv[++i];
    if (a == "--exit") {
      try {
        rc = std::stoi(v);
      } catch (const std::exception&) {
        fail(ExitCode::kUsage, "--exit {}: not an exit code", v);
      }
    } else if (a == "--srun-log") {
      srun_log = v;
    } else if (a == "--lost-node") {
      lost.push_back(v);
    } else if (a == "--job-signalled") {
      if (v != "0" && v != "1") fail(ExitCode::kUsage, "--job-signalled {}: expected 0 or 1", v);
      job_signalled = v == "1";
    } else if (a == "--max-comm-retries") {
      const auto n = parse_int(v);
      if (!n || *n < 0 || *n > 1000) fail(ExitCode::kUsage, "--max-comm-retries {}: expected 0..1000", v);
      max_comm_retries = int(*n);
    } else {
      fail(ExitCode::kUsage, "unknown option {} ({})", a, usage);
    }
  }
  if (rc < 0 || rc > 255) fail(ExitCode::kUsage, "--exit must be given, 0..255 ({})", usage);
  if (rc == 0) {
    fmt::print("class=ok\nrestart=0\nrequeue=0\ndrain=\ndeep_check=0\nadvice=\n");
    return 0;
  }
  const JobKey key = JobKey::from_environment();
  const std::optional<Json> own = read_failure_record(run_dir, key);
  const SrunEvidence ev = srun_log.empty() ? SrunEvidence{} : read_srun_log(srun_log);

  FailureRecord r;
  r.exit_code = rc;
  if (own) {
    r.cls = *parse_failure_class(own->at("class").get<std::string>());
    r.step = own->value("step", int64_t(-1));
    spec_hash = own->value("spec_hash", std::string());
    for (const Json& s : own->value("suspects", Json::array()))
      r.suspects.push_back({s.value("rank", -1), s.value("host", std::string())});
    for (const Json& e : own->value("evidence", Json::array())) r.evidence.push_back(e.get<std::string>());
  } else if (rc > 128 && rc < 160) {
    // No rank lived to say why: one was killed and srun ended the rest.
    r.cls = FailureClass::kComm;
    r.evidence.push_back(
        fmt::format("the step ended with {} (a rank killed by signal {}), no rank wrote a "
                    "record",
                    rc, rc - 128));
  } else {
    r.cls = failure_class(ExitCode(rc), Fault::kNone);
    r.evidence.push_back(fmt::format("the step exited {} and no rank wrote a record", rc));
  }
  r.evidence.insert(r.evidence.end(), ev.lines.begin(), ev.lines.end());
  // What only the batch script sees outranks what the survivors saw: a peer that vanished looks like a
  // communication failure from inside.
  std::set<std::string> lost_nodes(lost.begin(), lost.end());
  lost_nodes.insert(ev.failed_nodes.begin(), ev.failed_nodes.end());
  if (!lost_nodes.empty()) {
    r.cls = FailureClass::kNodeLost;
    r.suspects.clear();
    for (const std::string& n : lost_nodes) {
      r.suspects.push_back({-1, n});
      r.evidence.push_back(fmt::format("node {} does not answer", n));
    }
  } else if (ev.oom_kill) {
    r.cls = FailureClass::kOomHost;
  }
  if (r.suspects.empty() && (r.cls == FailureClass::kComm || r.cls == FailureClass::kOomHost))
    r.suspects = ev.killed;
  // A stop signal the ranks got and the job did not: not a preemption, a time limit or a scancel, which
  // signal the batch shell as well, but a kill meant for an earlier step on the same step id (Slurm retries
  // one a node was slow to take, 60 s on). The checkpoint is saved: the step carries on in this allocation.
  const bool stray_stop = r.cls == FailureClass::kPreempted && !job_signalled;
  if (stray_stop)
    r.evidence.push_back("the step got a stop signal the job did not: a late kill of an earlier step");
  write_failure_record(run_dir, key, r, spec_hash, /*replace=*/true);

  Reaction what = reaction(r.cls);
  bool deep = false;
  if (r.cls == FailureClass::kComm) {
    // Communication failures are bounded in a row (another class in between resets the count). The first
    // runs the step again in this allocation: the fastest way back, and a new step id, which a kill of the
    // failed step that Slurm retries later (it does, 60 s on, when a node was slow to answer) cannot reach.
    // The second in a row is requeued, after the deep health check when it failed on the same nodes.
    int in_a_row = 1;
    for (auto k = previous_attempt(run_dir, key); k; k = previous_attempt(run_dir, *k), ++in_a_row) {
      const std::optional<Json> before = read_failure_record(run_dir, *k);
      if (!before || before->value("class", std::string()) != "comm") break;
      if (in_a_row == 1)
        deep = before->value("nodes", std::string()) == env_or("SLURM_JOB_NODELIST", node_name());
    }
    const bool again = in_a_row <= max_comm_retries;
    what.restart = again && in_a_row == 1;
    what.requeue = again && in_a_row > 1;
    if (!again)
      what.advice = fmt::format("communication failed {} times in a row; see {}/failures and resubmit",
                                in_a_row, run_dir);
  } else if (stray_stop && key.attempt < max_comm_retries) {
    what = {false, false, "", true};
  }
  std::set<std::string> drain;
  if (what.drain_suspects)
    for (const Suspect& s : r.suspects)
      if (!s.host.empty()) drain.insert(s.host);
  std::string drain_list;
  for (const std::string& n : drain) drain_list += (drain_list.empty() ? "" : ",") + n;
  fmt::print("class={}\nrestart={}\nrequeue={}\ndrain={}\ndeep_check={}\nadvice={}\nrecord={}\n",
             failure_class_name(r.cls), what.restart ? 1 : 0, what.requeue ? 1 : 0, drain_list, deep ? 1 : 0,
             what.advice, failure_record_path(run_dir, key));
  return 0;
}

}  // namespace forge::launcher
