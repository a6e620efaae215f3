#include "forge/quota/approvals.h"

#include "forge/common/error.h"
#include "forge/common/sqlite.h"
#include "forge/common/text.h"
#include "forge/quota/admission.h"
#include "forge/quota/usage.h"
#include "ledger_db.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>

namespace forge::quota {
namespace {

using sqlite::Stmt;
using sqlite::Transaction;

constexpr int kMaxGpus = 1048576;
constexpr size_t kMaxText = 500;
constexpr int kMaxUses = 100;
constexpr int64_t kMaxExpiry = 366LL * 86400;

constexpr const char* kColumns =
    "id,team,tier,gpus,time_limit_s,reason,requester,requested_at,state,decided_by,decided_at,note,"
    "expires_at,uses_allowed,uses_left";

// Six random bytes from the kernel as 12 hex digits: ids are not guessable, so knowing one is knowing it
// was handed out.
std::string new_approval_id() {
  unsigned char bytes[6];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(ExitCode::kIo, "cannot make an approval id: getrandom: {}", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  std::string id = "apr-";
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

// An id as given, safe to show: its first 40 characters, escaped, and "…" when there was more.
std::string shown_id(std::string_view text) {
  std::string out = printable(text.substr(0, 40), 400);
  if (text.size() > 40) out += "…";
  return out;
}

// "2026-12-09 10:00 UTC"
std::string utc_minute(int64_t t) {
  return format_utc_minute(t) + " UTC";
}

// Free text a person wrote (reason, note): one line of at most 500 bytes.
void check_text(const std::string& text, const char* what, bool required) {
  if (required && text.empty()) fail(ExitCode::kUsage, "{} is empty: say what the job is for", what);
  if (text.size() > kMaxText)
    fail(ExitCode::kUsage, "{} is {} bytes; keep it to {}", what, text.size(), kMaxText);
  for (unsigned char c : text)
    if (c < 0x20 || c == 0x7f)
      fail(ExitCode::kUsage, "{} contains a control character (\\x{:02x}); write it as one line", what, c);
}

ApprovalState state_of(const std::string& s) {
  if (s == "approved") return ApprovalState::kApproved;
  if (s == "denied") return ApprovalState::kDenied;
  return ApprovalState::kPending;
}

Approval row_of(const Stmt& s) {
  Approval a;
  a.id = s.text(0);
  a.team = s.text(1);
  a.tier = s.text(2);
  a.gpus = static_cast<int>(s.integer(3));
  a.time_limit_s = s.integer(4);
  a.reason = s.text(5);
  a.requester = s.text(6);
  a.requested_at = s.integer(7);
  a.state = state_of(s.text(8));
  a.decided_by = s.text(9);
  a.decided_at = s.integer(10);
  a.note = s.text(11);
  a.expires_at = s.integer(12);
  a.uses_allowed = static_cast<int>(s.integer(13));
  a.uses_left = static_cast<int>(s.integer(14));
  return a;
}

// The requests with `id` (empty: all of them), each with the jobs that used it.
std::vector<Approval> select(const sqlite::Db& db, const std::string& id = "") {
  const char* where = id.empty() ? "" : "WHERE id = ?1";
  Stmt s(db, fmt::format("SELECT {} FROM approvals {} ORDER BY requested_at, id", kColumns, where));
  Stmt jobs(db, fmt::format("SELECT id, job_id FROM approval_uses WHERE job_id IS NOT NULL {} "
                            "ORDER BY used_at, rowid",
                            id.empty() ? "" : "AND id = ?1"));
  if (!id.empty()) s.bind(1, id), jobs.bind(1, id);
  std::vector<Approval> out;
  std::map<std::string, size_t> index;
  while (s.step()) {
    index[s.text(0)] = out.size();
    out.push_back(row_of(s));
  }
  while (jobs.step())
    if (const auto it = index.find(jobs.text(0)); it != index.end())
      out[it->second].job_ids.push_back(jobs.text(1));
  return out;
}

AdmitResult reject(std::string message, const std::string& partition = "") {
  AdmitResult r;
  r.message = std::move(message);
  r.partition = partition;
  return r;
}

// "train" or "train,eval": names of 1-64 letters, digits, '.', '_' or '-', comma-separated.
bool is_partition_list(const std::string& text) {
  size_t name = 0;
  for (char c : text) {
    if (c == ',') {
      if (name == 0) return false;
      name = 0;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') {
      if (++name > 64) return false;
    } else {
      return false;
    }
  }
  return name > 0;
}

}  // namespace

const char* state_name(ApprovalState state) {
  switch (state) {
    case ApprovalState::kPending:
      return "pending";
    case ApprovalState::kApproved:
      return "approved";
    case ApprovalState::kDenied:
      return "denied";
  }
  return "pending";
}

bool is_approval_id(std::string_view text) {
  if (text.size() != 16 || text.substr(0, 4) != "apr-") return false;
  return std::all_of(text.begin() + 4, text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

ApprovalStore::ApprovalStore(const std::string& ledger_path) : path_(ledger_path) {}

sqlite::Db& ApprovalStore::db() const {
  if (!db_) db_ = open_ledger(path_);
  return *db_;
}

ApprovalStore::~ApprovalStore() = default;

std::string ApprovalStore::request(const Policy& policy, const Identity& who, const std::string& team_name,
                                   const std::string& tier_name, int gpus, int64_t time_limit_s,
                                   const std::string& reason, int64_t now) {
  const Team* team = policy.team(team_name);
  if (!team)
    fail(ExitCode::kUsage, "unknown team '{}'; teams in the policy: {}", printable(team_name),
         policy.team_names());
  if (!team->has_member(who.user, who.groups))
    fail(ExitCode::kUsage, "user {} is not a member of team {}: only its members may ask for its jobs",
         printable(who.user), team->name);
  const Tier* tier = policy.tier(tier_name);
  if (!tier)
    fail(ExitCode::kUsage, "unknown tier '{}'; tiers in the policy: {}", printable(tier_name),
         policy.tier_names());
  if (!team->allows_tier(tier->name))
    fail(ExitCode::kUsage, "team {} may not use tier '{}'; its tiers are: {}", team->name, tier->name,
         fmt::join(team->tiers, ", "));
  if (time_limit_s <= 0) fail(ExitCode::kUsage, "--time must be a positive duration such as 12:00:00");
  if (time_limit_s > tier->max_wall_s)
    fail(ExitCode::kUsage, "--time {} is over tier '{}''s max wall {}; ask for at most that",
         format_hours(time_limit_s), tier->name, format_hours(tier->max_wall_s));
  if (gpus < 1 || gpus > kMaxGpus) fail(ExitCode::kUsage, "--gpus {}: expected 1 to {}", gpus, kMaxGpus);
  if (gpus > team->max_gpus)
    fail(ExitCode::kUsage, "--gpus {}: team {} may hold at most {} GPUs at once; ask for at most that", gpus,
         team->name, team->max_gpus);
  check_text(reason, "--reason", true);

  // 48 random bits: a clash is next to impossible, but an id must never name two requests.
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string id = new_approval_id();
    Stmt s(db(),
           "INSERT OR IGNORE INTO approvals "
           "(id,team,tier,gpus,time_limit_s,reason,requester,requested_at,state) "
           "VALUES (?1,?2,?3,?4,?5,?6,?7,?8,'pending')");
    s.bind(1, id).bind(2, team->name).bind(3, tier->name).bind(4, gpus).bind(5, time_limit_s);
    s.bind(6, reason).bind(7, who.user).bind(8, now);
    s.step();
    if (db().changes() == 1) return id;
  }
  fail(ExitCode::kIo, "ledger '{}': could not find an unused approval id", db().path());
}

Approval ApprovalStore::decide(const Policy& policy, const Identity& who, const std::string& id,
                               const Verdict& verdict, int64_t now) {
  if (!is_approval_id(id))
    fail(ExitCode::kUsage, "approval id '{}' is malformed (expected apr- and 12 hex digits)", shown_id(id));
  if (verdict.approve && (verdict.uses < 1 || verdict.uses > kMaxUses))
    fail(ExitCode::kUsage, "--uses {}: expected 1 to {}", verdict.uses, kMaxUses);
  const int64_t expires_in = verdict.expires_in_s.value_or(policy.approval.ttl_s);
  if (verdict.approve && (expires_in <= 0 || expires_in > kMaxExpiry))
    fail(ExitCode::kUsage, "--expires {}: expected a duration from 1 second to 366 days", expires_in);
  check_text(verdict.note, "--note", false);

  Transaction tx(db());  // the check and the update see the same row: two approvers cannot both decide
  const auto found = select(db(), id);
  if (found.empty())
    fail(ExitCode::kUsage, "no approval request {} (forge-quota report --approvals lists those you can see)",
         id);
  const Approval& a = found.front();
  const Team* team = policy.team(a.team);
  if (!team) fail(ExitCode::kUsage, "{} is for team {}, which {} no longer has", id, a.team, policy.path);
  if (!team->has_approver(who.user, who.groups))
    fail(ExitCode::kUsage, "user {} may not decide requests of team {}; its approvers: {}",
         printable(who.user), team->name, team->approvers.text());
  if (who.user == a.requester)
    fail(ExitCode::kUsage,
         "{} asked for {} and may not decide it too: another approver of team {} must (four eyes)",
         a.requester, id, team->name);
  if (a.state != ApprovalState::kPending)
    fail(ExitCode::kUsage, "{} was {} by {} at {}; only a pending request can be decided", id,
         state_name(a.state), a.decided_by, utc_minute(a.decided_at));

  Stmt s(
      db(),
      "UPDATE approvals SET state=?2, decided_by=?3, decided_at=?4, note=?5, expires_at=?6, uses_allowed=?7, "
      "uses_left=?7 WHERE id=?1 AND state='pending'");
  s.bind(1, id).bind(2, std::string(verdict.approve ? "approved" : "denied")).bind(3, who.user).bind(4, now);
  s.bind(5, verdict.note);
  s.bind(6, verdict.approve ? std::optional<int64_t>(now + expires_in) : std::nullopt);
  s.bind(7, verdict.approve ? verdict.uses : 0);
  s.step();
  tx.commit();
  return select(db(), id).front();
}

AdmitResult ApprovalStore::admit(const Policy& policy, const Identity& who, const JobRequest& job,
                                 int64_t now) {
  const Team* team = policy.team(job.team);
  if (!team)
    return reject(
        fmt::format("unknown team '{}'; teams in the policy: {}", printable(job.team), policy.team_names()));
  if (!team->has_member(who.user, who.groups))
    return reject(fmt::format("user {} is not a member of team {}", printable(who.user), team->name));
  const Tier* tier = policy.tier(job.tier);
  if (!tier)
    return reject(
        fmt::format("unknown tier '{}'; tiers in the policy: {}", printable(job.tier), policy.tier_names()));
  if (!team->allows_tier(tier->name))
    return reject(fmt::format("team {} may not use tier '{}'; its tiers are: {}", team->name, tier->name,
                              fmt::join(team->tiers, ", ")));
  if (job.gpus < 1 || job.time_limit_s < 1)
    return reject(fmt::format("the job asks for {} GPUs and a time limit of {} s; both must be positive",
                              job.gpus, job.time_limit_s));
  // The partition goes back to the controller on its one line of answer: names and commas only.
  if (!job.partition.empty() && !is_partition_list(job.partition))
    return reject(fmt::format("partition '{}' is not a list of partition names", printable(job.partition)));
  std::string partition = job.partition;
  if (auto problem = pool_problem(policy, *tier, partition)) return reject(*problem);

  const auto needed = approval_needed(policy, *tier, job.gpus, job.time_limit_s);
  if (!needed) {
    AdmitResult r;
    r.admitted = true;
    r.partition = partition;
    r.message = "admitted: the job needs no approval";
    return r;
  }
  if (!job.approval_id)
    return reject(approval_missing_message(*needed, *team, *tier, job.gpus, job.time_limit_s), partition);
  const std::string& id = *job.approval_id;
  if (!is_approval_id(id))
    return reject(
        fmt::format("approval id '{}' is malformed (expected apr- and 12 hex digits)", shown_id(id)),
        partition);

  // Read, check and take the use under the write lock: a concurrent admit waits, then sees the use gone.
  Transaction tx(db());
  const auto found = select(db(), id);
  if (found.empty())
    return reject(
        fmt::format("approval {} does not exist; check the id (forge-quota report --approvals)", id),
        partition);
  const Approval& a = found.front();
  if (a.state == ApprovalState::kPending)
    return reject(fmt::format("approval {} is not approved yet; approvers of team {}: {}", id, a.team,
                              policy.team(a.team) ? policy.team(a.team)->approvers.text() : "none"),
                  partition);
  if (a.state == ApprovalState::kDenied)
    return reject(fmt::format("approval {} was denied by {}{}", id, a.decided_by,
                              a.note.empty() ? "" : ": " + printable(a.note, 200)),
                  partition);
  if (a.team != team->name) return reject(fmt::format("approval {} was for team {}", id, a.team), partition);
  if (a.tier != tier->name)
    return reject(fmt::format("approval {} was for tier '{}', not '{}'", id, a.tier, tier->name), partition);
  if (job.gpus > a.gpus)
    return reject(fmt::format("approval {} covers {} GPUs and this job asks for {}", id, a.gpus, job.gpus),
                  partition);
  if (job.time_limit_s > a.time_limit_s)
    return reject(fmt::format("approval {} covers a time limit of {} and this job asks for {}", id,
                              format_hours(a.time_limit_s), format_hours(job.time_limit_s)),
                  partition);
  if (job.approval_held) {
    AdmitResult r;
    r.admitted = true;
    r.partition = partition;
    r.approval_id = id;
    r.message = fmt::format("admitted: approval {}, taken at submission, still covers the job", id);
    return r;
  }
  if (now >= a.expires_at)
    return reject(fmt::format("approval {} expired at {}", id, utc_minute(a.expires_at)), partition);
  if (a.uses_left <= 0)
    return reject(fmt::format("approval {} is used up ({} of {} uses)", id, a.uses_allowed - a.uses_left,
                              a.uses_allowed),
                  partition);

  Stmt take(db(), "UPDATE approvals SET uses_left = uses_left - 1 WHERE id = ?1 AND uses_left > 0");
  take.bind(1, id).step();
  if (db().changes() != 1) return reject(fmt::format("approval {} is used up", id), partition);
  Stmt use(
      db(),
      "INSERT INTO approval_uses (id,used_at,user,gpus,time_limit_s,job_id) VALUES (?1,?2,?3,?4,?5,NULL)");
  use.bind(1, id).bind(2, now).bind(3, who.user).bind(4, job.gpus).bind(5, job.time_limit_s).step();
  tx.commit();

  AdmitResult r;
  r.admitted = true;
  r.partition = partition;
  r.approval_id = id;
  r.message =
      fmt::format("admitted with approval {} ({} of {} uses left)", id, a.uses_left - 1, a.uses_allowed);
  return r;
}

size_t ApprovalStore::record_job_ids(const std::string& sacct_text) {
  static constexpr std::string_view kTag = "forge-approval=";
  Transaction tx(db());
  Stmt seen(db(), "SELECT 1 FROM approval_uses WHERE id = ?1 AND job_id = ?2");
  Stmt set(
      db(),
      "UPDATE approval_uses SET job_id = ?2 WHERE rowid = (SELECT rowid FROM approval_uses WHERE id = ?1 "
      "AND job_id IS NULL ORDER BY used_at, rowid LIMIT 1)");
  size_t updated = 0;
  size_t at = 0;
  while (at < sacct_text.size()) {
    size_t eol = sacct_text.find('\n', at);
    if (eol == std::string::npos) eol = sacct_text.size();
    const std::string_view line(sacct_text.data() + at, eol - at);
    at = eol + 1;
    const size_t bar = line.find('|');  // JobID never holds one; the comment may
    if (bar == std::string_view::npos || bar == 0) continue;
    const std::string job(line.substr(0, bar));
    const std::string_view comment = line.substr(bar + 1);
    for (size_t pos = comment.find(kTag); pos != std::string_view::npos; pos = comment.find(kTag, pos + 1)) {
      if (pos > 0 && comment[pos - 1] != ' ' && comment[pos - 1] != ',' && comment[pos - 1] != ';') continue;
      const std::string_view rest = comment.substr(pos + kTag.size());
      const std::string id(rest.substr(0, rest.find_first_of(" ,;\r\t")));
      if (!is_approval_id(id)) continue;
      seen.bind(1, id).bind(2, job);
      const bool known = seen.step();
      if (known) {
        while (seen.step()) {
        }
        continue;
      }
      set.bind(1, id).bind(2, job).step();
      updated += static_cast<size_t>(db().changes());
    }
  }
  tx.commit();
  return updated;
}

std::vector<Approval> ApprovalStore::list(const Policy& policy, const Identity& who) const {
  auto all = list_all();
  if (policy.is_admin(who)) return all;
  std::erase_if(all, [&](const Approval& a) {
    const Team* team = policy.team(a.team);
    return !team || !policy.sees_team(who, *team);
  });
  return all;
}

std::vector<Approval> ApprovalStore::list_all() const {
  return select(db());
}

std::optional<Approval> ApprovalStore::find(const std::string& id) const {
  if (!is_approval_id(id)) return std::nullopt;
  auto found = select(db(), id);
  if (found.empty()) return std::nullopt;
  return std::move(found.front());
}

}  // namespace forge::quota
