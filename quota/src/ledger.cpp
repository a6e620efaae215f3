#include "forge/quota/ledger.h"

#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/sqlite.h"
#include "ledger_db.h"

#include <filesystem>

namespace forge::quota {
namespace {

using sqlite::Stmt;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  job_id TEXT NOT NULL, start INTEGER NOT NULL, end_time INTEGER NOT NULL, user TEXT NOT NULL,
  account TEXT NOT NULL, qos TEXT NOT NULL, partition TEXT NOT NULL, state TEXT NOT NULL,
  elapsed_s INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu_type TEXT NOT NULL, nodelist TEXT NOT NULL,
  job_name TEXT NOT NULL, PRIMARY KEY (job_id, start));
CREATE INDEX IF NOT EXISTS runs_start ON runs(start);
CREATE TABLE IF NOT EXISTS queue (
  job_id TEXT PRIMARY KEY, user TEXT NOT NULL, account TEXT NOT NULL, qos TEXT NOT NULL,
  partition TEXT NOT NULL, state TEXT NOT NULL, gpus INTEGER NOT NULL, elapsed_s INTEGER NOT NULL,
  time_limit_s INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS summaries (job_id TEXT PRIMARY KEY, tokens REAL NOT NULL, mfu REAL);
CREATE TABLE IF NOT EXISTS segments (
  job_id TEXT NOT NULL, start REAL NOT NULL, end_time REAL NOT NULL, resumed INTEGER NOT NULL,
  startup_s REAL NOT NULL, kept_train_s REAL NOT NULL, lost_s REAL NOT NULL,
  exit_class TEXT NOT NULL, PRIMARY KEY (job_id, start));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS approvals (
  id TEXT PRIMARY KEY, team TEXT NOT NULL, tier TEXT NOT NULL, gpus INTEGER NOT NULL,
  time_limit_s INTEGER NOT NULL, reason TEXT NOT NULL, requester TEXT NOT NULL,
  requested_at INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied')),
  decided_by TEXT, decided_at INTEGER, note TEXT, expires_at INTEGER,
  uses_allowed INTEGER NOT NULL DEFAULT 0, uses_left INTEGER NOT NULL DEFAULT 0 CHECK (uses_left >= 0));
CREATE TABLE IF NOT EXISTS approval_uses (
  id TEXT NOT NULL, used_at INTEGER NOT NULL, user TEXT NOT NULL, gpus INTEGER NOT NULL,
  time_limit_s INTEGER NOT NULL, job_id TEXT);
CREATE INDEX IF NOT EXISTS approval_uses_id ON approval_uses(id);
)sql";

}  // namespace

std::unique_ptr<sqlite::Db> open_ledger(const std::string& path) {
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  sqlite::Errors errors;
  errors.noun = "ledger";
  errors.code = ExitCode::kIo;
  errors.damaged_hint =
      "restore it from a backup, or move it aside and run 'forge-quota sync' (usage comes back from sacct, "
      "approvals do not)";
  errors.access_hint =
      "check its permissions: the ledger's directory is root:forge-quota 2771 and its files group "
      "forge-quota "
      "0660, and users reach them only through the setgid forge-quota";
  auto db = sqlite::open_shared(path, sqlite::Db::Mode::kCreate, errors);  // the group's, through forge-quota
  db->exec(kSchema, "schema");
  return db;
}

Ledger::Ledger(const std::string& path) : db_(open_ledger(path)) {}

Ledger::~Ledger() = default;

void Ledger::record(const std::vector<RunRecord>& runs, const std::vector<QueuedJob>& queue,
                    const std::map<std::string, RunSummary>& summaries, int64_t synced_at) {
  sqlite::Transaction tx(*db_);
  {
    Stmt up(*db_,
            "INSERT INTO runs VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13) "
            "ON CONFLICT(job_id, start) DO UPDATE SET end_time=?3, user=?4, account=?5, qos=?6, "
            "partition=?7, state=?8, elapsed_s=?9, gpus=?10, gpu_type=?11, nodelist=?12, job_name=?13");
    for (const auto& r : runs) {
      up.bind(1, r.job_id).bind(2, r.start).bind(3, r.end).bind(4, r.user).bind(5, r.account);
      up.bind(6, r.qos).bind(7, r.partition).bind(8, r.state).bind(9, r.elapsed_s);
      up.bind(10, static_cast<int64_t>(r.gpus))
          .bind(11, r.gpu_type)
          .bind(12, r.nodelist)
          .bind(13, r.job_name);
      up.step();
    }
    db_->exec("DELETE FROM queue", "clear queue");
    Stmt q(*db_, "INSERT OR REPLACE INTO queue VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)");
    for (const auto& j : queue) {
      q.bind(1, j.job_id).bind(2, j.user).bind(3, j.account).bind(4, j.qos).bind(5, j.partition);
      q.bind(6, j.state).bind(7, static_cast<int64_t>(j.gpus)).bind(8, j.elapsed_s).bind(9, j.time_limit_s);
      q.step();
    }
    Stmt s(*db_, "INSERT OR REPLACE INTO summaries VALUES (?1,?2,?3)");
    for (const auto& [id, sum] : summaries) {
      s.bind(1, id).bind(2, sum.tokens);
      if (sum.mfu)
        s.bind(3, *sum.mfu);
      else
        s.bind_null(3);
      s.step();
    }
    Stmt seg(*db_, "INSERT OR REPLACE INTO segments VALUES (?1,?2,?3,?4,?5,?6,?7,?8)");
    for (const auto& [id, sum] : summaries)
      for (const RunSegment& g : sum.segments) {
        seg.bind(1, g.job_id)
            .bind(2, g.start)
            .bind(3, g.end)
            .bind(4, int64_t(g.resumed))
            .bind(5, g.startup_s);
        seg.bind(6, g.kept_train_s).bind(7, g.lost_s).bind(8, g.exit_class);
        seg.step();
      }
    Stmt m(*db_, "INSERT OR REPLACE INTO meta VALUES ('last_sync', ?1)");
    m.bind(1, std::to_string(synced_at)).step();
  }
  tx.commit();
}

std::vector<RunRecord> Ledger::runs(int64_t from, int64_t to) const {
  Stmt s(*db_,
         "SELECT job_id,start,end_time,user,account,qos,partition,state,elapsed_s,gpus,gpu_type,nodelist,"
         "job_name FROM runs WHERE start < ?2 AND (CASE WHEN end_time > 0 THEN end_time ELSE start + "
         "elapsed_s END) >= ?1 ORDER BY start, job_id");
  s.bind(1, from).bind(2, to);
  std::vector<RunRecord> out;
  while (s.step()) {
    RunRecord r;
    r.job_id = s.text(0);
    r.start = s.integer(1);
    r.end = s.integer(2);
    r.user = s.text(3);
    r.account = s.text(4);
    r.qos = s.text(5);
    r.partition = s.text(6);
    r.state = s.text(7);
    r.elapsed_s = s.integer(8);
    r.gpus = static_cast<int>(s.integer(9));
    r.gpu_type = s.text(10);
    r.nodelist = s.text(11);
    r.job_name = s.text(12);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<QueuedJob> Ledger::queue() const {
  Stmt s(*db_, "SELECT job_id,user,account,qos,partition,state,gpus,elapsed_s,time_limit_s FROM queue");
  std::vector<QueuedJob> out;
  while (s.step()) {
    QueuedJob j{
        s.text(0),    s.text(1),   s.text(2), s.text(3), s.text(4), s.text(5), static_cast<int>(s.integer(6)),
        s.integer(7), s.integer(8)};
    out.push_back(std::move(j));
  }
  return out;
}

std::map<std::string, RunSummary> Ledger::summaries() const {
  Stmt s(*db_, "SELECT job_id,tokens,mfu FROM summaries");
  std::map<std::string, RunSummary> out;
  while (s.step()) {
    RunSummary r;
    r.tokens = s.real(1);
    if (!s.is_null(2)) r.mfu = s.real(2);
    out[s.text(0)] = r;
  }
  Stmt g(*db_,
         "SELECT job_id,start,end_time,resumed,startup_s,kept_train_s,lost_s,exit_class FROM segments "
         "ORDER BY job_id, start");
  while (g.step()) {
    RunSegment seg{g.text(0), g.real(1), g.real(2), g.integer(3) != 0,
                   g.real(4), g.real(5), g.real(6), g.text(7)};
    out[seg.job_id].segments.push_back(std::move(seg));
  }
  return out;
}

int64_t Ledger::last_sync() const {
  Stmt s(*db_, "SELECT value FROM meta WHERE key='last_sync'");
  int64_t v = 0;
  if (s.step()) v = std::stoll(s.text(0));
  return v;
}

std::map<std::string, RunSummary> scan_summaries(const std::vector<std::string>& dirs,
                                                 std::vector<std::string>* skipped) {
  namespace fs = std::filesystem;
  std::map<std::string, RunSummary> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (it.depth() >= 3) it.disable_recursion_pending();
      if (it->path().filename() != "summary.json" || !it->is_regular_file(ec)) continue;
      try {
        const Json doc = read_json(it->path().string());
        const Json& id = doc.at("job_id");
        const std::string job = id.is_string() ? id.get<std::string>() : std::to_string(id.get<int64_t>());
        if (job.empty() || job == "0") throw std::runtime_error("no Slurm job id");
        RunSummary s;
        s.tokens = doc.contains("tokens") ? doc.at("tokens").get<double>() : 0.0;
        // forge-train writes the mean over the steps it ran (launcher/src/train_run.cpp, write_summary).
        if (doc.contains("mean_mfu") && doc.at("mean_mfu").is_number())
          s.mfu = doc.at("mean_mfu").get<double>();
        for (const Json& g : doc.value("segments", Json::array())) {
          RunSegment seg = RunSegment::from_json(g);
          if (!seg.job_id.empty()) s.segments.push_back(std::move(seg));  // outside Slurm: no allocation
        }
        out[job] = s;
      } catch (const std::exception& e) {
        if (skipped) skipped->push_back(fmt::format("{}: {}", it->path().string(), e.what()));
      }
    }
  }
  return out;
}

std::map<std::string, RunSummary> parse_job_comments(const std::string& text) {
  std::map<std::string, RunSummary> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line(text.data() + at, eol - at);
    at = eol + 1;
    const size_t bar = line.find('|');  // JobID never holds one; the comment may (not ours, escaped)
    if (bar == std::string_view::npos || line.substr(bar + 1, 6) != "forge:") continue;
    const Json doc = Json::parse(line.substr(bar + 7), nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object()) continue;
    RunSummary s;
    if (doc.contains("tokens") && doc.at("tokens").is_number()) s.tokens = doc.at("tokens").get<double>();
    if (doc.contains("mfu") && doc.at("mfu").is_number()) s.mfu = doc.at("mfu").get<double>();
    out[std::string(line.substr(0, bar))] = s;
  }
  return out;
}

}  // namespace forge::quota
