#include "forge/health/checks.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <map>
#include <set>

namespace forge::health {
namespace {

CheckResult pass(std::string_view check, std::string detail) {
  return {std::string(check), Status::kPass, std::move(detail)};
}
CheckResult failed(std::string_view check, std::string detail) {
  return {std::string(check), Status::kFail, std::move(detail)};
}
CheckResult skipped(std::string_view check, std::string detail) {
  return {std::string(check), Status::kSkip, std::move(detail)};
}

std::string join(const std::vector<std::string>& items, std::string_view sep = "; ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

// The first non-empty line of a command's stderr (else stdout), for one-line details.
std::string first_line(const CommandOutput& r) {
  for (const std::string* s : {&r.err, &r.out}) {
    size_t pos = 0;
    while (pos < s->size()) {
      const size_t end = std::min(s->find('\n', pos), s->size());
      const std::string line = trim(std::string_view(*s).substr(pos, end - pos));
      if (!line.empty()) return line;
      pos = end + 1;
    }
  }
  return "no message";
}

std::string command_problem(const std::string& program, const CommandOutput& r, double timeout_s) {
  if (r.not_found) return fmt::format("{} not found", program);
  if (r.timed_out) return fmt::format("{} did not answer within {:g} s", program, timeout_s);
  return fmt::format("{} failed (exit {}): {}", program, r.status, first_line(r));
}

// A command that failed fails the check, except a timeout in quick mode: under a loaded machine a slow
// answer in the Prolog is not proof of a fault, and the periodic check (longer timeout) will tell.
CheckResult command_failed(std::string_view check, const std::string& program, const CommandOutput& r,
                           const CheckContext& ctx) {
  const std::string why = command_problem(program, r, ctx.timeout_s());
  if (r.timed_out && ctx.mode == Mode::kQuick)
    return {std::string(check), Status::kSkip, why + "; left to the periodic check"};
  return {std::string(check), Status::kFail, why};
}

std::string utc(int64_t t) {
  const time_t tt = static_cast<time_t>(t);
  tm parts{};
  gmtime_r(&tt, &parts);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return buf;
}

std::string mib_text(uint64_t bytes) {
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  return mib >= 10240 ? fmt::format("{:.0f} GiB", mib / 1024) : fmt::format("{:.0f} MiB", mib);
}

// ---- gpu -----------------------------------------------------------------------------------------------
bool yes(std::string_view v) {
  const std::string t = trim(v);
  return t == "Yes" || t == "yes" || t == "YES";
}

// One row of `nvidia-smi --query-gpu=<kGpuFields> --format=csv,noheader,nounits`.
constexpr const char* kGpuFields =
    "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,"
    "remapped_rows.failure";
// Drivers or GPUs without row remapping reject those field names: ask for the rest.
constexpr const char* kGpuFieldsBasic =
    "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending";

std::vector<std::string> gpu_row_problems(const std::vector<std::string>& f) {
  std::vector<std::string> out;
  const std::string name = fmt::format("gpu{} ({})", f.size() > 0 ? f[0] : "?", f.size() > 1 ? f[1] : "?");
  if (f.size() > 2) {
    const auto ecc = parse_int(f[2]);  // "[N/A]" on GPUs without ECC: not a fault
    if (ecc && *ecc > 0) out.push_back(fmt::format("{}: {} uncorrected ECC errors", name, *ecc));
  }
  if (f.size() > 3 && yes(f[3])) out.push_back(fmt::format("{}: retired pages pending, reset the GPU", name));
  if (f.size() > 4 && yes(f[4])) out.push_back(fmt::format("{}: row remapping pending, reset the GPU", name));
  if (f.size() > 5 && yes(f[5])) out.push_back(fmt::format("{}: row remapping failed", name));
  return out;
}

CheckResult gpu_nvidia_smi(const CheckContext& ctx, Probes& probes, int expected) {
  const HealthConfig& cfg = *ctx.config;
  const double t = ctx.timeout_s();
  auto query = [&](const char* fields) {
    return probes.run({cfg.nvidia_smi, std::string("--query-gpu=") + fields, "--format=csv,noheader,nounits"},
                      "", t);
  };
  CommandOutput r = query(kGpuFields);
  if (r.status != 0 && !r.timed_out && !r.not_found &&
      (r.err + r.out).find("not a valid field") != std::string::npos)
    r = query(kGpuFieldsBasic);
  if (r.timed_out || r.not_found || r.status != 0) return command_failed("gpu", cfg.nvidia_smi, r, ctx);
  std::vector<std::string> problems;
  int rows = 0;
  size_t pos = 0;
  while (pos < r.out.size()) {
    const size_t end = std::min(r.out.find('\n', pos), r.out.size());
    const std::string line = trim(std::string_view(r.out).substr(pos, end - pos));
    pos = end + 1;
    if (line.empty()) continue;
    ++rows;
    std::vector<std::string> fields;
    for (const auto& f : split_list(line, ',')) fields.push_back(trim(f));
    for (auto& p : gpu_row_problems(fields)) problems.push_back(std::move(p));
  }
  if (expected >= 0 && rows < expected)
    problems.insert(problems.begin(), fmt::format("{} of {} GPUs visible to nvidia-smi", rows, expected));
  for (auto& x : recent_xids(probes.kernel_log(), probes.uptime_s(), cfg.xid_window_s, cfg.fatal_xids))
    problems.push_back(std::move(x));
  if (!problems.empty()) return failed("gpu", join(problems));
  return pass("gpu", fmt::format("{} GPUs, no ECC, retired-page or Xid faults", rows));
}

CheckResult gpu_fake(const CheckContext& ctx, Probes& probes, int expected) {
  const std::string dir = ctx.config->fake_gpu_dir + "/" + ctx.node;
  // Unknown gres: the dev cluster's eight fake GPUs.
  const int count = expected >= 0 ? expected : 8;
  std::vector<std::string> problems;
  for (int i = 0; i < count; ++i) {
    const auto text = probes.read_file(fmt::format("{}/gpu{}", dir, i));
    if (!text) continue;  // no file: healthy
    const std::string t = trim(*text);
    const std::string first = trim(t.substr(0, t.find('\n')));
    if (first.empty() || first == "ok") continue;
    problems.push_back(fmt::format("gpu{}: {}", i, first));
  }
  if (!problems.empty()) return failed("gpu", join(problems));
  return pass("gpu", fmt::format("{} fake GPUs healthy ({})", count, dir));
}

// ---- stale processes -----------------------------------------------------------------------------------
bool runs_node(const ProcessInfo& p, const std::string& node) {
  for (size_t i = 0; i + 1 < p.argv.size(); ++i)
    if (p.argv[i] == "-N" && p.argv[i + 1] == node) return true;
  for (const auto& a : p.argv)
    if (a == "-N" + node) return true;
  return false;
}
bool has_node_flag(const ProcessInfo& p) {
  for (const auto& a : p.argv)
    if (a.rfind("-N", 0) == 0) return true;
  return false;
}

// The mount namespace the node's processes live in, or "" for "every process on this host". Several
// slurmd on one host (the dev cluster) each run in their own mount namespace; a real node has one slurmd
// in the host's namespace.
std::string node_namespace(const std::vector<ProcessInfo>& procs, const std::string& node) {
  const ProcessInfo* slurmd = nullptr;
  for (const auto& p : procs)
    if (p.comm == "slurmd" && runs_node(p, node)) slurmd = &p;
  if (!slurmd)
    for (const auto& p : procs)
      if (p.comm == "slurmd" && !has_node_flag(p)) slurmd = &p;
  if (!slurmd || slurmd->mnt_ns.empty()) return "";
  for (const auto& p : procs)
    if (p.pid == 1 && p.mnt_ns == slurmd->mnt_ns) return "";
  return slurmd->mnt_ns;
}

std::string describe(const ProcessInfo& p) {
  std::string cmd;
  for (const auto& a : p.argv) cmd += (cmd.empty() ? "" : " ") + a;
  if (cmd.empty()) cmd = p.comm;
  return fmt::format("pid {} {}", p.pid, printable(cmd, 40));
}

}  // namespace

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::kQuick:
      return "quick";
    case Mode::kPeriodic:
      return "periodic";
    case Mode::kDeep:
      return "deep";
  }
  return "?";
}

Mode parse_mode(std::string_view name) {
  if (name == "quick") return Mode::kQuick;
  if (name == "periodic") return Mode::kPeriodic;
  if (name == "deep") return Mode::kDeep;
  fail(ExitCode::kUsage, "--mode {}: expected quick, periodic or deep", printable(name));
}

double CheckContext::timeout_s() const {
  return mode == Mode::kQuick ? config->quick_command_timeout_s : config->command_timeout_s;
}

// Which checks run in which mode by default (docs/HEALTH.md has the same table). quick runs in every
// Prolog, so it reads files and asks munge; it does not write to disks or scan processes.
const std::array<CheckInfo, 6> kChecks = {{
    {"gpu", check_gpu, true, true, true},
    {"disk", check_disk, true, true, true},
    {"memory", check_memory, true, true, true},
    {"munge", check_munge, true, true, true},
    {"clock", check_clock, true, true, true},
    {"stale_processes", check_stale_processes, false, false, true},
}};

const CheckInfo* find_check(std::string_view name) {
  for (const auto& c : kChecks)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> default_checks(Mode mode) {
  std::vector<std::string> out;
  for (const auto& c : kChecks)
    if (mode == Mode::kQuick ? c.quick : mode == Mode::kPeriodic ? c.periodic : c.deep)
      out.emplace_back(c.name);
  return out;
}

std::optional<int64_t> parse_mem_available_kib(std::string_view meminfo) {
  const std::string_view key = "MemAvailable:";
  size_t pos = 0;
  while (pos < meminfo.size()) {
    const size_t end = std::min(meminfo.find('\n', pos), meminfo.size());
    const std::string_view line = meminfo.substr(pos, end - pos);
    pos = end + 1;
    if (line.substr(0, key.size()) != key) continue;
    std::string v = trim(line.substr(key.size()));
    if (v.size() > 3 && v.substr(v.size() - 3) == " kB") v = trim(v.substr(0, v.size() - 3));
    return parse_int(v);
  }
  return std::nullopt;
}

std::vector<std::string> recent_xids(const std::vector<std::string>& kmsg, double uptime_s, int64_t window_s,
                                     const std::vector<int>& fatal) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& rec : kmsg) {
    const size_t semi = rec.find(';');
    if (semi == std::string::npos) continue;
    const std::string_view text = std::string_view(rec).substr(semi + 1);
    const size_t at = text.find("NVRM: Xid (");
    if (at == std::string_view::npos) continue;
    // "prio,seq,usec,flags": the record's time since boot.
    const auto head = split_list(std::string_view(rec).substr(0, semi), ',');
    if (head.size() < 3) continue;
    const auto usec = parse_int(head[2]);
    if (!usec) continue;
    if (window_s > 0 && uptime_s - static_cast<double>(*usec) / 1e6 > static_cast<double>(window_s)) continue;
    const std::string_view rest = text.substr(at + 11);  // "PCI:0000:3b:00): 79, pid=..., ..."
    const size_t close = rest.find("): ");
    if (close == std::string_view::npos) continue;
    const std::string_view dev = rest.substr(0, close);
    std::string_view tail = rest.substr(close + 3);
    const size_t comma = tail.find(',');
    const auto xid = parse_int(trim(tail.substr(0, comma)));
    if (!xid || std::find(fatal.begin(), fatal.end(), *xid) == fatal.end()) continue;
    tail = comma == std::string_view::npos ? std::string_view() : tail.substr(comma + 1);
    // Keep the message, not the pid/name fields of the offending process.
    std::string msg;
    for (const auto& part : split_list(tail, ',')) {
      const std::string p = trim(part);
      if (p.rfind("pid=", 0) == 0 || p.rfind("name=", 0) == 0 || p.rfind("Ch ", 0) == 0) continue;
      msg += (msg.empty() ? "" : ", ") + p;
    }
    const std::string key = fmt::format("{}/{}", *xid, dev);
    if (!seen.insert(key).second) continue;
    out.push_back(fmt::format("xid {} ({}){}{}", *xid, dev, msg.empty() ? "" : ": ", printable(msg, 60)));
  }
  return out;
}

int64_t parse_build_date(std::string_view date) {
  static constexpr std::array<const char*, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  if (date.size() != 11) return 0;
  int month = -1;
  for (int i = 0; i < 12; ++i)
    if (date.substr(0, 3) == kMonths[static_cast<size_t>(i)]) month = i;
  const auto day = parse_int(trim(date.substr(4, 2)));
  const auto year = parse_int(date.substr(7, 4));
  if (month < 0 || !day || !year) return 0;
  tm parts{};
  parts.tm_year = static_cast<int>(*year) - 1900;
  parts.tm_mon = month;
  parts.tm_mday = static_cast<int>(*day);
  return static_cast<int64_t>(timegm(&parts));
}

CheckResult check_gpu(const CheckContext& ctx, Probes& probes) {
  const HealthConfig& cfg = *ctx.config;
  const int expected = cfg.expected_gpus >= 0 ? cfg.expected_gpus : ctx.gres_gpus;
  if (probes.have_program(cfg.nvidia_smi)) return gpu_nvidia_smi(ctx, probes, expected);
  if (!cfg.fake_gpu_dir.empty()) return gpu_fake(ctx, probes, expected);
  return skipped("gpu", fmt::format("no {} and no fake GPU directory ([gpu] fake_dir)", cfg.nvidia_smi));
}

CheckResult check_disk(const CheckContext& ctx, Probes& probes) {
  const HealthConfig& cfg = *ctx.config;
  std::vector<std::pair<std::string, std::string>> roots;  // label, path
  for (const auto& [label, path] : std::vector<std::pair<const char*, std::string>>{
           {"run", cfg.run_root}, {"checkpoint", cfg.checkpoint_root}, {"tmp", cfg.tmp_root}}) {
    if (path.empty()) continue;
    if (std::none_of(roots.begin(), roots.end(), [&](const auto& r) { return r.second == path; }))
      roots.emplace_back(label, path);
  }
  if (roots.empty())
    return skipped("disk", "no roots configured ([disk] run_root, checkpoint_root, tmp_root)");
  std::vector<std::string> problems, seen;
  for (const auto& [label, path] : roots) {
    if (!probes.is_directory(path)) {
      problems.push_back(fmt::format("{} root {} is not a directory", label, path));
      continue;
    }
    std::string error;
    const auto space = probes.disk_space(path, error);
    if (!space) {
      problems.push_back(fmt::format("{} root {}: statvfs: {}", label, path, error));
      continue;
    }
    const uint64_t min_bytes = static_cast<uint64_t>(cfg.min_free_mib) << 20;
    if (space->free_bytes < min_bytes)
      problems.push_back(fmt::format("{} root {}: {} free, below {} MiB", label, path,
                                     mib_text(space->free_bytes), cfg.min_free_mib));
    if (space->total_inodes > 0) {
      const double pct =
          100.0 * static_cast<double>(space->free_inodes) / static_cast<double>(space->total_inodes);
      if (pct < cfg.min_free_inodes_percent)
        problems.push_back(fmt::format("{} root {}: {:.2f}% inodes free, below {:g}%", label, path, pct,
                                       cfg.min_free_inodes_percent));
    }
    if (ctx.mode == Mode::kDeep) {
      const std::string err = probes.write_read_test(path);
      if (!err.empty()) problems.push_back(fmt::format("{} root {}: write/read test: {}", label, path, err));
    }
    seen.push_back(fmt::format("{} {} free", path, mib_text(space->free_bytes)));
  }
  if (!problems.empty()) return failed("disk", join(problems));
  return pass("disk", join(seen, ", ") + (ctx.mode == Mode::kDeep ? ", write/read ok" : ""));
}

CheckResult check_memory(const CheckContext& ctx, Probes& probes) {
  const auto text = probes.read_file("/proc/meminfo");
  if (!text) return skipped("memory", "/proc/meminfo unreadable");
  const auto kib = parse_mem_available_kib(*text);
  if (!kib) return skipped("memory", "/proc/meminfo has no MemAvailable");
  const int64_t mib = *kib / 1024;
  if (mib < ctx.config->min_available_mib)
    return failed("memory",
                  fmt::format("MemAvailable {} MiB, below {} MiB", mib, ctx.config->min_available_mib));
  return pass("memory", fmt::format("MemAvailable {} MiB", mib));
}

CheckResult check_munge(const CheckContext& ctx, Probes& probes) {
  const std::string& socket = ctx.config->munge_socket;
  std::vector<std::string> munge = {"munge", "-n"}, unmunge = {"unmunge"};
  if (!socket.empty()) {
    for (auto* argv : {&munge, &unmunge}) argv->insert(argv->end(), {"-S", socket});
  }
  const double t = ctx.timeout_s();
  const CommandOutput cred = probes.run(munge, "", t);
  if (cred.not_found || cred.timed_out || cred.status != 0)
    return command_failed("munge", "munge -n", cred, ctx);
  const CommandOutput decoded = probes.run(unmunge, cred.out, t);
  if (decoded.not_found || decoded.timed_out || decoded.status != 0)
    return command_failed("munge", "unmunge", decoded, ctx);
  return pass("munge", socket.empty() ? "munge -n | unmunge ok" : "munge -n | unmunge ok via " + socket);
}

CheckResult check_clock(const CheckContext& ctx, Probes& probes) {
  const HealthConfig& cfg = *ctx.config;
  const int64_t now = probes.now_s();
  const int64_t floor = cfg.build_epoch > 0 ? cfg.build_epoch : parse_build_date(__DATE__);
  if (floor > 0 && now < floor - 86400)
    return failed("clock",
                  fmt::format("system time {} is before this program's build date {}: fix the clock/NTP",
                              utc(now), utc(floor).substr(0, 10)));
  // Synchronisation: asked only outside the Prolog, and only where a tool answers.
  if (ctx.mode == Mode::kQuick) return pass("clock", utc(now));
  const double t = ctx.timeout_s();
  std::string sync = "unknown (no chronyc or timedatectl answer)";
  bool synced = true;
  if (probes.have_program("chronyc")) {
    const CommandOutput r = probes.run({"chronyc", "-n", "tracking"}, "", t);
    const size_t at = r.out.find("Leap status");
    if (r.status == 0 && at != std::string::npos) {
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      synced = line.find("Not synchronised") == std::string::npos;
      sync = synced ? "chronyc: synchronised" : "chronyc: not synchronised";
    }
  }
  if (sync.rfind("unknown", 0) == 0 && probes.have_program("timedatectl")) {
    const CommandOutput r = probes.run({"timedatectl", "show", "-p", "NTPSynchronized", "--value"}, "", t);
    const std::string v = trim(r.out.substr(0, r.out.find('\n')));
    if (r.status == 0 && (v == "yes" || v == "no")) {
      synced = v == "yes";
      sync = synced ? "timedatectl: synchronised" : "timedatectl: not synchronised";
    }
  }
  if (!synced && cfg.require_sync)
    return failed("clock",
                  fmt::format("{} ({}): start NTP or set [clock] require_sync = false", sync, utc(now)));
  return pass("clock", fmt::format("{}, sync {}", utc(now), sync));
}

CheckResult check_stale_processes(const CheckContext& ctx, Probes& probes) {
  const std::vector<ProcessInfo> before = probes.processes();
  if (before.empty()) return skipped("stale_processes", "cannot list processes (/proc)");
  const std::string ns = node_namespace(before, ctx.node);
  // Never this process or its ancestors: an Epilog's own environment names the ending job.
  std::set<int> mine;
  std::map<int, int> parent;
  for (const auto& p : before) parent[p.pid] = p.ppid;
  for (int pid = probes.self_pid(); pid > 0 && mine.insert(pid).second;) {
    const auto it = parent.find(pid);
    pid = it == parent.end() ? 0 : it->second;
  }
  std::vector<const ProcessInfo*> candidates;
  for (const auto& p : before) {
    if (p.slurm_job_id.empty() || mine.count(p.pid) || p.comm == "slurmd") continue;
    if (!ns.empty() && p.mnt_ns != ns) continue;
    candidates.push_back(&p);
  }
  if (candidates.empty()) return pass("stale_processes", "no job processes on the node");
  const double t = ctx.timeout_s();
  // Every job Slurm still knows (any node, any state but finished), not only this node's: a job requeued
  // a moment ago is pending while its processes here are still being torn down, which is not stale.
  const CommandOutput q = probes.run({"squeue", "-h", "-a", "-o", "%A"}, "", t);
  if (q.not_found || q.timed_out || q.status != 0)
    return skipped("stale_processes", "cannot list the node's jobs: " + command_problem("squeue", q, t));
  std::set<std::string> jobs;
  for (const auto& line : split_list(q.out, '\n')) jobs.insert(trim(line));
  // Listed before squeue answered and still there after: a job that ended meanwhile left no process.
  std::set<std::pair<int, std::string>> still;
  for (const auto& p : probes.processes()) still.insert({p.pid, p.slurm_job_id});
  std::vector<const ProcessInfo*> stale;
  for (const auto* p : candidates)
    if (!jobs.count(p->slurm_job_id) && still.count({p->pid, p->slurm_job_id})) stale.push_back(p);
  if (stale.empty())
    return pass("stale_processes", fmt::format("{} job processes, all of running jobs", candidates.size()));
  std::set<std::string> stale_jobs;
  std::vector<std::string> shown;
  for (const auto* p : stale) {
    stale_jobs.insert(p->slurm_job_id);
    if (shown.size() < 3) shown.push_back(describe(*p));
  }
  const std::string jobs_text = join(std::vector<std::string>(stale_jobs.begin(), stale_jobs.end()), ",");
  if (ctx.config->kill_stale && ctx.mode == Mode::kDeep) {
    std::vector<std::string> survivors;
    for (const auto* p : stale)
      if (!probes.kill_process(p->pid)) survivors.push_back(describe(*p));
    if (survivors.empty())
      return pass("stale_processes",
                  fmt::format("killed {} processes of ended jobs {}", stale.size(), jobs_text));
    return failed("stale_processes", fmt::format("cannot kill {} processes of ended jobs {}: {}",
                                                 survivors.size(), jobs_text, join(survivors, ", ")));
  }
  return failed(
      "stale_processes",
      fmt::format("{} processes of ended jobs {} ({}): kill them, or set [stale_processes] kill = true",
                  stale.size(), jobs_text, join(shown, ", ")));
}

std::vector<CheckResult> run_checks(const std::vector<std::string>& names, const CheckContext& ctx,
                                    Probes& probes) {
  std::vector<CheckResult> out;
  for (const auto& name : names) {
    const CheckInfo* info = find_check(name);
    if (!info) continue;
    try {
      out.push_back(info->run(ctx, probes));
    } catch (const std::exception& e) {
      out.push_back(skipped(name, fmt::format("could not run: {}", e.what())));
    }
  }
  return out;
}

}  // namespace forge::health
