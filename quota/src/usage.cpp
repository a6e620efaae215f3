#include "forge/quota/usage.h"

#include "forge/common/error.h"
#include "forge/common/ini.h"
#include "forge/common/text.h"
#include "forge/quota/policy.h"

#include <algorithm>
#include <ctime>
#include <sstream>

namespace forge::quota {
namespace {

std::vector<std::string> split_fields(const std::string& line, size_t max_fields) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (out.size() + 1 < max_fields) {
    const size_t bar = line.find('|', pos);
    if (bar == std::string::npos) break;
    out.push_back(line.substr(pos, bar - pos));
    pos = bar + 1;
  }
  out.push_back(line.substr(pos));  // the last field keeps any '|' of its own
  return out;
}

int64_t to_int(const std::string& s, int line, const char* what) {
  const auto v = parse_int(s);
  if (!v || *v < 0)
    fail(ExitCode::kData, "sacct output line {}: {} '{}' is not a non-negative number", line, what, s);
  return *v;
}

// Calls row(fields, line_number) for every non-blank line of a `tool --parsable2` listing, split into
// exactly `count` '|'-separated fields (`names`, if given, lists them in the error).
template <typename Row>
void for_each_row(const std::string& text, const char* tool, size_t count, const char* names, Row&& row) {
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    const auto f = split_fields(line, count);
    if (f.size() != count)
      fail(ExitCode::kData, "{} output line {}: expected {} '|'-separated fields{}, got {}", tool, number,
           count, *names ? fmt::format(" ({})", names) : std::string(), f.size());
    row(f, number);
  }
}

}  // namespace

std::optional<int64_t> parse_slurm_timestamp(const std::string& text) {
  std::tm tm{};
  if (text.size() != 19) return std::nullopt;
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(timegm(&tm));
}

std::string format_utc(int64_t t) {
  const time_t tt = static_cast<time_t>(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

std::string format_utc_minute(int64_t t) {
  const std::string s = format_utc(t);
  return s.substr(0, 10) + " " + s.substr(11, 5);
}

std::vector<RunRecord> parse_sacct(const std::string& text) {
  std::vector<RunRecord> runs;
  for_each_row(text, "sacct", 12, kSacctFields, [&](const std::vector<std::string>& f, int number) {
    const auto start = parse_slurm_timestamp(f[8]);
    if (!start) return;  // never started: no usage
    RunRecord r;
    r.job_id = f[0];
    r.user = f[1];
    r.account = f[2];
    r.qos = f[3];
    r.partition = f[4];
    r.state = f[5].substr(0, f[5].find(' '));  // "CANCELLED by 0" -> CANCELLED
    r.elapsed_s = to_int(f[6], number, "ElapsedRaw");
    r.gpus = gpus_in_tres(f[7], &r.gpu_type);
    r.start = *start;
    r.end = parse_slurm_timestamp(f[9]).value_or(0);
    r.nodelist = f[10];
    r.job_name = f[11];
    if (r.job_id.empty()) fail(ExitCode::kData, "sacct output line {}: empty JobID", number);
    runs.push_back(std::move(r));
  });
  return runs;
}

std::vector<QueuedJob> parse_squeue(const std::string& text) {
  std::vector<QueuedJob> jobs;
  for_each_row(text, "squeue", 9, "", [&](std::vector<std::string> f, int number) {
    for (auto& x : f) x = trim(x);
    QueuedJob j;
    j.job_id = f[0];
    j.user = f[1];
    j.account = f[2];
    j.qos = f[3];
    j.partition = f[4];
    j.state = f[5];
    j.elapsed_s = f[6] == "INVALID" ? 0 : parse_wall_time(f[6]).value_or(0);
    if (f[7] != "UNLIMITED" && f[7] != "INVALID" && f[7] != "NOT_SET") {
      const auto limit = parse_wall_time(f[7]);
      if (!limit)
        fail(ExitCode::kData, "squeue output line {}: TimeLimit '{}' is not a Slurm time", number, f[7]);
      j.time_limit_s = *limit;
    }
    j.gpus = gpus_in_tres(f[8]);
    jobs.push_back(std::move(j));
  });
  return jobs;
}

double gpu_hours_in(const RunRecord& run, int64_t from, int64_t to) {
  // A running job's row ends where sacct last saw it: start + elapsed.
  const int64_t end = run.end > 0 ? run.end : run.start + run.elapsed_s;
  const int64_t span = end - run.start;
  const double full = static_cast<double>(run.elapsed_s) * run.gpus / 3600.0;
  if (run.start >= from && end <= to) return full;
  const int64_t overlap = std::min(end, to) - std::max(run.start, from);
  if (overlap <= 0 || span <= 0) return 0.0;
  return full * static_cast<double>(overlap) / static_cast<double>(span);
}

bool is_wasted_state(const std::string& state) {
  static const char* const kWasted[] = {"FAILED",        "PREEMPTED", "REQUEUED",    "NODE_FAIL",
                                        "OUT_OF_MEMORY", "BOOT_FAIL", "REQUEUE_FED", "REQUEUE_HOLD"};
  return std::any_of(std::begin(kWasted), std::end(kWasted), [&](const char* s) { return state == s; });
}

}  // namespace forge::quota
