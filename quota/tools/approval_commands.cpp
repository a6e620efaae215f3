// forge-quota request / approve / deny / admit and the approvals report (docs/ADMISSION.md, "Approvals").
#include "cli.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/text.h"
#include "forge/quota/approvals.h"
#include "forge/quota/identity.h"
#include "forge/quota/usage.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <iostream>

namespace po = boost::program_options;

namespace forge::quota::cli {
namespace {

// Parses `args` against `d` (and one positional argument into `positional` when given); false after
// printing --help.
bool parse(const std::string& command, const std::vector<std::string>& args, po::options_description& d,
           const char* positional = nullptr) {
  po::options_description all;
  all.add(d);
  po::positional_options_description pos;
  if (positional) pos.add(positional, 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: forge-quota " << command << (positional ? " ID" : "") << " [options]\n" << d;
    return false;
  }
  po::notify(vm);
  return true;
}

void add_common(po::options_description& d, std::string& policy, std::string& ledger) {
  d.add_options()("help,h", "show help")("policy", po::value(&policy)->default_value(default_policy_path()),
                                         "policy file")("ledger", po::value(&ledger), "ledger database");
}

int64_t duration_arg(const char* option, const std::string& text) {
  const auto secs = parse_wall_time(text);
  if (!secs || *secs <= 0)
    fail(ExitCode::kUsage, "{} {}: expected a Slurm duration such as 12:00:00 or 2-00:00:00", option,
         printable(text));
  return *secs;
}

// What the report shows as the state: an approval past its expiry or out of uses says so.
std::string shown_state(const Approval& a, int64_t now) {
  if (a.state != ApprovalState::kApproved) return state_name(a.state);
  if (now >= a.expires_at) return "expired";
  if (a.uses_left <= 0) return "used";
  return "approved";
}

// "2026-12-09 10:00" (UTC), or "-".
std::string minute(int64_t t) {
  return t <= 0 ? "-" : format_utc_minute(t);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string render_approvals(const std::vector<Approval>& approvals, const std::string& format, int64_t now) {
  if (format == "json") {
    Json rows = Json::array();
    for (const auto& a : approvals)
      rows.push_back({{"id", a.id},
                      {"team", a.team},
                      {"tier", a.tier},
                      {"gpus", a.gpus},
                      {"time_limit_s", a.time_limit_s},
                      {"time", format_hours(a.time_limit_s)},
                      {"requester", a.requester},
                      {"reason", a.reason},
                      {"requested_at", format_utc(a.requested_at)},
                      {"state", shown_state(a, now)},
                      {"decided_by", a.decided_by.empty() ? Json(nullptr) : Json(a.decided_by)},
                      {"decided_at", a.decided_at > 0 ? Json(format_utc(a.decided_at)) : Json(nullptr)},
                      {"note", a.note},
                      {"expires_at", a.expires_at > 0 ? Json(format_utc(a.expires_at)) : Json(nullptr)},
                      {"uses_used", a.uses_allowed - a.uses_left},
                      {"uses_allowed", a.uses_allowed},
                      {"job_ids", a.job_ids}});
    return rows.dump(2) + "\n";
  }
  if (format == "csv") {
    std::string out =
        "id,team,tier,gpus,time,requester,reason,state,decided_by,decided_at,expires,uses_used,uses_allowed,"
        "job_ids\n";
    for (const auto& a : approvals)
      out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", a.id, a.team, a.tier, a.gpus,
                         format_hours(a.time_limit_s), a.requester, csv_field(a.reason), shown_state(a, now),
                         a.decided_by, a.decided_at > 0 ? format_utc(a.decided_at) : "",
                         a.expires_at > 0 ? format_utc(a.expires_at) : "", a.uses_allowed - a.uses_left,
                         a.uses_allowed, fmt::join(a.job_ids, " "));
    return out;
  }
  std::string out =
      fmt::format("{:<16} {:<12} {:<10} {:>5} {:>10} {:<12} {:<8} {:<12} {:<16} {:<16} {:>5} {:<12} {}\n",
                  "id", "team", "tier", "gpus", "time", "requester", "state", "decided_by", "decided_at",
                  "expires", "uses", "jobs", "reason");
  for (const auto& a : approvals)
    out +=
        fmt::format("{:<16} {:<12} {:<10} {:>5} {:>10} {:<12} {:<8} {:<12} {:<16} {:<16} {:>5} {:<12} {}\n",
                    a.id, a.team, a.tier, a.gpus, format_hours(a.time_limit_s), a.requester,
                    shown_state(a, now), a.decided_by.empty() ? "-" : a.decided_by, minute(a.decided_at),
                    minute(a.expires_at), fmt::format("{}/{}", a.uses_allowed - a.uses_left, a.uses_allowed),
                    a.job_ids.empty() ? std::string("-") : fmt::format("{}", fmt::join(a.job_ids, ",")),
                    printable(a.reason, 500));
  out += fmt::format("({} request(s); times UTC)\n", approvals.size());
  return out;
}

int cmd_request(const std::vector<std::string>& args) {
  std::string policy_path, ledger, team, tier, time, reason;
  int gpus = 0;
  po::options_description d("options");
  add_common(d, policy_path, ledger);
  d.add_options()("gpus", po::value(&gpus)->required(), "GPUs of the job")(
      "time", po::value(&time)->required(), "its time limit (12:00:00, 2-00:00:00)")(
      "tier", po::value(&tier)->required(), "its tier")("team", po::value(&team),
                                                        "its team (default: yours, when you are in one)")(
      "reason", po::value(&reason)->required(), "what the job is for (one line, up to 500 bytes)");
  if (!parse("request", args, d)) return 0;
  const Policy policy = load_run_policy(policy_path);
  const Identity who = caller();
  if (team.empty()) {
    std::vector<std::string> mine;
    for (const auto& [name, t] : policy.teams)
      if (t.has_member(who.user, who.groups)) mine.push_back(name);
    if (mine.empty())
      fail(ExitCode::kUsage, "user {} is a member of no team in {}: ask the administrators",
           printable(who.user), policy.path);
    if (mine.size() > 1)
      fail(ExitCode::kUsage, "user {} is in teams {}: say which with --team", printable(who.user),
           fmt::join(mine, ", "));
    team = mine.front();
  }
  const int64_t secs = duration_arg("--time", time);
  ApprovalStore store(ledger_path(policy, ledger));
  const std::string id = store.request(policy, who, team, tier, gpus, secs, reason, now_s());
  std::cout << id << '\n';
  const Team& t = *policy.team(team);
  if (t.approvers.empty())
    std::cerr << fmt::format(
        "forge-quota request: team {} has no approvers: ask the administrators to name some ([team.{}] "
        "approvers in {})\n",
        team, team, policy.path);
  else
    std::cerr << fmt::format(
        "forge-quota request: {} asks for {} GPUs for {} in tier {} of team {}; an approver of the team ({}) "
        "runs: forge-quota approve {}\n",
        id, gpus, format_hours(secs), tier, team, t.approvers.text(), id);
  return 0;
}

int cmd_decide(bool approve, const std::vector<std::string>& args) {
  const std::string command = approve ? "approve" : "deny";
  std::string policy_path, ledger, id, expires, note;
  int uses = 1;
  po::options_description d("options");
  add_common(d, policy_path, ledger);
  d.add_options()("id", po::value(&id)->required(), "the request's id (apr-...)")(
      "note", po::value(&note), "a note for the requester (one line)");
  if (approve)
    d.add_options()("uses", po::value(&uses)->default_value(1), "jobs it admits (1-100)")(
        "expires", po::value(&expires), "valid for this long (default: [approval] ttl)");
  if (!parse(command, args, d, "id")) return 0;
  const Policy policy = load_run_policy(policy_path);
  Verdict v;
  v.approve = approve;
  v.uses = uses;
  v.note = note;
  if (!expires.empty()) v.expires_in_s = duration_arg("--expires", expires);
  ApprovalStore store(ledger_path(policy, ledger));
  const Approval a = store.decide(policy, caller(), id, v, now_s());
  if (approve)
    std::cout << fmt::format(
        "approved {}: team {}, tier {}, up to {} GPUs for {}, {} use(s), expires {} UTC\n", a.id, a.team,
        a.tier, a.gpus, format_hours(a.time_limit_s), a.uses_allowed, minute(a.expires_at));
  else
    std::cout << fmt::format("denied {}: team {}, tier {}, {} GPUs for {} (asked by {})\n", a.id, a.team,
                             a.tier, a.gpus, format_hours(a.time_limit_s), a.requester);
  return 0;
}

int cmd_admit(const std::vector<std::string>& args) {
  std::string policy_path, ledger, partition, approval, held;
  JobRequest job;
  int64_t uid = -1, minutes = 0;
  po::options_description d("options");
  add_common(d, policy_path, ledger);
  d.add_options()("uid", po::value(&uid)->required(), "the submitting user's uid")(
      "team", po::value(&job.team)->required(), "the job's team")("tier", po::value(&job.tier)->required(),
                                                                  "its tier")(
      "gpus", po::value(&job.gpus)->required(), "its GPUs")("minutes", po::value(&minutes)->required(),
                                                            "its time limit in minutes")(
      "partition", po::value(&partition), "its partition(s), if it named any")(
      "approval", po::value(&approval), "the approval id it gave (a use is taken)")(
      "held-approval", po::value(&held), "the approval it took a use of at submission (a change to the job)");
  if (!parse("admit", args, d)) return 0;
  // The answer spends approvals and speaks for the controller: only root, the user slurmctld runs as
  // ([approval] controller, its SlurmUser) or, on a test cluster, the owner of the policy file may ask.
  // The policy names that user because a setgid checker cannot trust slurm.conf: SLURM_CONF is the caller's.
  const Policy policy = load_run_policy(policy_path);
  const uid_t me = ::getuid();
  const passwd* controller = ::getpwnam(policy.approval.controller.c_str());
  struct stat st {};
  if (me != 0 && !(controller && controller->pw_uid == me) &&
      (::stat(policy_path.c_str(), &st) != 0 || st.st_uid != me))
    fail(ExitCode::kUsage, "admit is for the controller (root or [approval] controller '{}')",
         policy.approval.controller);
  if (uid < 0 || uid > 4294967294LL) fail(ExitCode::kUsage, "--uid {}: expected a uid", uid);
  if (minutes < 1 || minutes > 366LL * 24 * 60)
    fail(ExitCode::kUsage, "--minutes {}: expected 1 to {}", minutes, 366LL * 24 * 60);
  job.time_limit_s = minutes * 60;
  job.partition = partition;
  if (!approval.empty() && !held.empty())
    fail(ExitCode::kUsage, "--approval and --held-approval exclude each other");
  if (!approval.empty()) job.approval_id = approval;
  if (!held.empty()) {
    job.approval_id = held;
    job.approval_held = true;
  }
  ApprovalStore store(ledger_path(policy, ledger));
  const AdmitResult r = store.admit(policy, identity_of_uid(static_cast<uid_t>(uid)), job, now_s());
  if (!r.admitted) {
    std::cout << "reject " << r.message << '\n';
    return 1;
  }
  std::cout << fmt::format("admit partition={} approval={}\n", r.partition.empty() ? "-" : r.partition,
                           r.approval_id.empty() ? "-" : r.approval_id);
  return 0;
}

}  // namespace forge::quota::cli
