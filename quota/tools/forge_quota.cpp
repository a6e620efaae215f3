// forge-quota: the admission and accounting policy, applied to Slurm, and the usage it accounts.
#include "cli.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/privilege.h"
#include "forge/common/text.h"
#include "forge/quota/accounting.h"
#include "forge/quota/apply.h"
#include "forge/quota/approvals.h"
#include "forge/quota/identity.h"
#include "forge/quota/layout.h"
#include "forge/quota/ledger.h"
#include "forge/quota/policy.h"
#include "forge/quota/report.h"
#include "forge/quota/slurm_cli.h"
#include "forge/quota/sync.h"

#include <boost/program_options.hpp>

#include <cstdlib>
#include <ctime>
#include <iostream>

namespace po = boost::program_options;
using namespace forge;
using namespace forge::quota;
using namespace forge::quota::cli;

namespace {

#ifndef FORGE_SYSTEM_POLICY
#define FORGE_SYSTEM_POLICY "/etc/forge/quota.ini"
#endif

constexpr const char* kUsage = R"(usage: forge-quota COMMAND [options]   (docs/ADMISSION.md)

commands:
  check-policy FILE          validate a policy file and that its users and groups exist (exit 64 with
                             file:line on the first error)
  layout LAYOUT [--policy FILE]
                             a layout's ranks and nodes for scripts (exit 64 with the parser's message)
  apply [--dry-run]          write the policy into Slurm (accounts, QOS) with sacctmgr; idempotent
  sync [-S START] [-E END]   sacct + squeue + run summaries -> ledger -> usage snapshot
  status [--team T] [--format table|json|prom] [-o FILE]
                             budget, used, reserved, remaining per team and tier (from the ledger);
                             prom: gauges for node_exporter's textfile collector (-o DIR/forge_quota.prom)
  report --by team|tier|user|job [-S START] [-E END] [--top N] [--format table|csv|json|html] [-o FILE]
                             GPU-hours, cost, jobs, wasted GPU-hours, cost per M tokens, MFU, ETTR;
                             the costliest first (--top N: N rows and the rest summed)
  report --approvals [--format table|csv|json] [-o FILE]
                             approval requests: state, decision, expiry, uses and jobs
  request --gpus N --time T --tier X [--team T] --reason TEXT
                             ask for an approval of a large job; prints its id
  approve ID [--uses N] [--expires DURATION] [--note TEXT]
  deny ID [--note TEXT]      decide a request of a team you approve for (never your own)
  admit --uid UID --team T --tier X --gpus N --minutes M [--partition P] [--approval ID | --held-approval ID]
                             for job_submit.lua (root): one line, 'admit partition=P approval=ID|-'
                             (exit 0) or 'reject MESSAGE' (exit 1)

common options:
  --policy FILE    policy file (default: $FORGE_QUOTA_POLICY or )" FORGE_SYSTEM_POLICY R"()
  --ledger PATH    ledger database (default: [policy] ledger)
  --snapshot PATH  usage snapshot (default: [policy] snapshot)
status and report show the teams you belong to or approve for; admins and root see all. Installed
setgid, forge-quota reads only the system policy and its ledger, and runs no apply or sync.
times are UTC: YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] or now; -S defaults to the start of the budget
period, -E to now.
)";

int64_t parse_time_arg(const std::string& opt, const std::string& text) {
  if (text == "now") return now_s();
  std::string t = text;
  if (t.size() == 10) t += "T00:00:00";
  if (t.size() == 16) t += ":00";
  const auto v = parse_slurm_timestamp(t);
  if (!v) fail(ExitCode::kUsage, "{} {}: expected a UTC time YYYY-MM-DD[THH:MM[:SS]] or 'now'", opt, text);
  return *v;
}

struct Common {
  std::string policy_path, ledger, snapshot, start, end, format, team, by, output;
  size_t top = 0;  // report: 0 = every row
  std::vector<std::string> runs;
  bool dry_run = false;
  bool approvals = false;
};

po::options_description common_options(Common& c) {
  po::options_description d("options");
  d.add_options()("help,h", "show help")("policy",
                                         po::value(&c.policy_path)->default_value(default_policy_path()),
                                         "policy file")("ledger", po::value(&c.ledger), "ledger database")(
      "snapshot", po::value(&c.snapshot), "usage snapshot");
  return d;
}

void check_format(const std::string& format, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (format == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  fail(ExitCode::kUsage, "--format {}: must be one of {}", format, list);
}

int cmd_check_policy(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0].rfind("-", 0) == 0)
    fail(ExitCode::kUsage, "check-policy takes one argument, the policy file");
  const Policy p = load_policy(args[0]);
  check_policy_names(p);  // the parser makes no OS lookups; an unknown name here is a typo or a missing user
  std::cout << fmt::format("{}: OK ({} teams, {} tiers, {} GPUs per node, budgets per {})\n", args[0],
                           p.teams.size(), p.tiers.size(), p.topology.gpus_per_node, period_name(p.period));
  return 0;
}

// Facts about a layout for scripts (scripts/sbatch/submit-pipeline), so that they parse it with the one
// parser rather than their own. Nodes and tasks per node as the plugin derives them (nodes_for), with
// the policy's GPUs per node when --policy is given, else $FORGE_GPUS_PER_NODE, else 8.
int cmd_layout(const std::vector<std::string>& args) {
  std::string text, policy_path;
  po::options_description d("options");
  d.add_options()("help,h", "show help")("policy", po::value(&policy_path),
                                         "take GPUs per node from this policy's [topology]");
  po::options_description all;
  all.add(d).add_options()("layout", po::value(&text));
  po::positional_options_description positional;
  positional.add("layout", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: forge-quota layout LAYOUT [--policy FILE]\n" << d;
    return 0;
  }
  po::notify(vm);
  if (!vm.count("layout")) fail(ExitCode::kUsage, "layout takes one argument, the layout (e.g. tp2,pp2,dp4)");
  std::string why;
  const auto layout = parse_layout(text, &why);
  if (!layout) fail(ExitCode::kUsage, "{}", why);
  Topology topo;
  if (!policy_path.empty()) {
    topo = load_policy(policy_path).topology;
  } else if (const char* env = std::getenv("FORGE_GPUS_PER_NODE"); env && *env) {
    const auto gpn = parse_int(env);
    if (!gpn || *gpn < 1 || *gpn > 65536)
      fail(ExitCode::kUsage, "FORGE_GPUS_PER_NODE={}: expected a whole number from 1 to 65536",
           printable(env));
    topo.gpus_per_node = static_cast<int>(*gpn);
  }
  const int nodes = nodes_for(*layout, topo);
  const Layout& l = *layout;
  std::cout << fmt::format("layout={} tp={} cp={} ep={} dp={} pp={} ranks={} nodes={} tasks_per_node={}\n",
                           l.str(), l.tp, l.cp, l.ep, l.dp, l.pp, l.world(), nodes,
                           (l.world() + nodes - 1) / nodes);
  return 0;
}

int cmd_apply(const Policy& policy, const Common& c) {
  const SlurmState state = parse_slurm_state(run_checked([] {
                                               auto a = show_qos_args();
                                               a.insert(a.begin(), "sacctmgr");
                                               return a;
                                             }()),
                                             run_checked([&] {
                                               auto a = show_assoc_args(policy.cluster);
                                               a.insert(a.begin(), "sacctmgr");
                                               return a;
                                             }()));
  const auto plan = plan_apply(policy, state);
  if (plan.empty()) {
    std::cout << "forge-quota apply: Slurm already matches " << policy.path << "; nothing to change\n";
    return 0;
  }
  for (const auto& cmd : plan) {
    std::cout << shell_line(cmd) << '\n';
    if (c.dry_run) continue;
    std::vector<std::string> argv = {"sacctmgr", "-i"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    run_checked(argv);
  }
  std::cout << fmt::format("forge-quota apply: {} {} command(s)\n", c.dry_run ? "would run" : "ran",
                           plan.size());
  return 0;
}

int cmd_sync(const Policy& policy, const Common& c) {
  const int64_t now = now_s();
  SyncOptions o;
  o.from = c.start.empty() ? period_bounds(policy.period, now).first : parse_time_arg("-S", c.start);
  o.to = c.end.empty() ? now : parse_time_arg("-E", c.end);
  if (o.to <= o.from)
    fail(ExitCode::kUsage, "-S {} is not before -E {}", format_utc(o.from), format_utc(o.to));
  o.ledger_path = ledger_path(policy, c.ledger);
  o.snapshot_path = snapshot_path(policy, c.snapshot);
  o.runs_dirs = c.runs.empty() ? policy.runs_dirs : c.runs;
  const SyncResult r = sync_usage(policy, o, now);
  for (const auto& w : r.warnings) std::cerr << "forge-quota sync: warning: skipped " << w << '\n';
  std::cout << fmt::format(
      "forge-quota sync: {} runs ({} - {} UTC), {} queued jobs, {} run summaries, {} approved job(s) -> {}; "
      "snapshot {}\n",
      r.runs, format_utc(o.from), format_utc(o.to), r.queued, r.summaries, r.approval_jobs, o.ledger_path,
      o.snapshot_path);
  return 0;
}

// Writes a view that `who` may see only part of: a filtered view says which teams it shows, after a table,
// else on stderr (so that CSV, JSON, HTML and prom stay what they claim to be).
void write_seen_by(const Identity& who, const Policy& policy, const char* command, const Common& c,
                   std::string text) {
  if (!sees_all(policy, who)) {
    const std::string note = filter_note(visible_teams(policy, who));
    if (c.format == "table")
      text += note + "\n";
    else
      std::cerr << "forge-quota " << command << ": " << note << '\n';
  }
  write_output(c.output, text);
}

int cmd_status(const Policy& policy, const Common& c) {
  check_format(c.format, {"table", "json", "prom"});
  if (!c.team.empty() && !policy.team(c.team))
    fail(ExitCode::kUsage, "--team {}: no such team in {}; teams: {}", c.team, policy.path,
         policy.team_names());
  const Identity who = caller();
  const Ledger ledger(ledger_path(policy, c.ledger));
  if (ledger.last_sync() == 0)
    fail(ExitCode::kData, "the ledger has never been synced; run 'forge-quota sync' first");
  const auto [start, end] = period_bounds(policy.period, now_s());
  auto status = compute_status(policy, ledger.runs(start, end), ledger.queue(), start, end);
  if (!c.team.empty()) std::erase_if(status, [&](const TeamStatus& s) { return s.team != c.team; });
  if (!sees_all(policy, who))
    std::erase_if(status, [&](const TeamStatus& s) {
      const Team* team = policy.team(s.team);
      return !team || !policy.sees_team(who, *team);
    });
  const std::string text = c.format == "table"
                               ? render_status_table(status, policy) +
                                     fmt::format("(ledger synced {} UTC)\n", format_utc(ledger.last_sync()))
                           : c.format == "json" ? render_status_json(status)
                                                : render_status_prom(status, policy, ledger.last_sync());
  write_seen_by(who, policy, "status", c, text);
  return 0;
}

int cmd_report_approvals(const Policy& policy, const Common& c) {
  check_format(c.format, {"table", "csv", "json"});
  const Identity who = caller();
  const ApprovalStore store(ledger_path(policy, c.ledger));
  const auto rows = sees_all(policy, who) ? store.list_all() : store.list(policy, who);
  write_seen_by(who, policy, "report", c, render_approvals(rows, c.format, now_s()));
  return 0;
}

int cmd_report(const Policy& policy, const Common& c) {
  if (c.approvals) {
    if (!c.by.empty() || !c.start.empty() || !c.end.empty())
      fail(ExitCode::kUsage,
           "report --approvals takes no --by, -S or -E: it lists every request you can see");
    return cmd_report_approvals(policy, c);
  }
  if (c.by.empty()) fail(ExitCode::kUsage, "report needs --by team|tier|user|job (or --approvals)");
  check_format(c.format, {"table", "csv", "json", "html"});
  GroupBy by;
  if (c.by == "team")
    by = GroupBy::kTeam;
  else if (c.by == "tier")
    by = GroupBy::kTier;
  else if (c.by == "user")
    by = GroupBy::kUser;
  else if (c.by == "job")
    by = GroupBy::kJob;
  else
    fail(ExitCode::kUsage, "--by {}: must be one of team, tier, user, job", c.by);
  const int64_t now = now_s();
  const int64_t from =
      c.start.empty() ? period_bounds(policy.period, now).first : parse_time_arg("-S", c.start);
  const int64_t to = c.end.empty() ? now : parse_time_arg("-E", c.end);
  if (to <= from) fail(ExitCode::kUsage, "-S {} is not before -E {}", format_utc(from), format_utc(to));
  const Identity who = caller();
  const Ledger ledger(ledger_path(policy, c.ledger));
  auto runs = ledger.runs(from, to);
  if (!sees_all(policy, who))  // a run counts for the team whose account it ran under; others are nobody's
    std::erase_if(runs, [&](const RunRecord& r) {
      const Team* team = policy.team_by_account(r.account);
      return !team || !policy.sees_team(who, *team);
    });
  Report rep = build_report(policy, runs, ledger.summaries(), by, from, to);
  if (c.top > 0) keep_costliest(rep, c.top);
  write_seen_by(who, policy, "report", c,
                c.format == "csv"    ? render_report_csv(rep)
                : c.format == "json" ? render_report_json(rep)
                : c.format == "html" ? render_report_html(rep)
                                     : render_report_table(rep));
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 64 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  check_command_allowed(command);
  if (command == "check-policy" || command == "layout") {
    // Neither needs the setgid group; without it they may read any file the caller can, and no other.
    privilege::drop_group();
    return command == "layout" ? cmd_layout(args) : cmd_check_policy(args);
  }
  if (command == "request") return cmd_request(args);
  if (command == "approve" || command == "deny") return cmd_decide(command == "approve", args);
  if (command == "admit") return cmd_admit(args);

  Common c;
  po::options_description d = common_options(c);
  if (command == "apply") {
    d.add_options()("dry-run", po::bool_switch(&c.dry_run), "print the sacctmgr commands, run nothing");
  } else if (command == "sync") {
    d.add_options()("start,S", po::value(&c.start), "window start (UTC)")(
        "end,E", po::value(&c.end), "window end (UTC)")("runs", po::value(&c.runs)->composing(),
                                                        "directory with run summaries (repeatable)");
  } else if (command == "status") {
    d.add_options()("team", po::value(&c.team), "one team")(
        "format", po::value(&c.format)->default_value("table"), "table, json or prom")(
        "output,o", po::value(&c.output), "write to FILE (atomically) instead of stdout");
  } else if (command == "report") {
    d.add_options()("by", po::value(&c.by), "team, tier, user or job")(
        "approvals", po::bool_switch(&c.approvals), "list approval requests instead")(
        "top", po::value(&c.top), "the N costliest rows, the rest summed into one")(
        "start,S", po::value(&c.start), "window start (UTC)")("end,E", po::value(&c.end), "window end (UTC)")(
        "format", po::value(&c.format)->default_value("table"),
        "table, csv, json or html (approvals: not html)")("output,o", po::value(&c.output),
                                                          "write to FILE instead of stdout");
  } else {
    fail(ExitCode::kUsage,
         "unknown command '{}'; commands: check-policy, layout, apply, sync, status, report, request, "
         "approve, "
         "deny, admit (see --help)",
         printable(command));
  }
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: forge-quota " << command << " [options]\n" << d;
    return 0;
  }
  po::notify(vm);
  const Policy policy = load_run_policy(c.policy_path);
  if (command == "apply") return cmd_apply(policy, c);
  if (command == "sync") return cmd_sync(policy, c);
  if (command == "status") return cmd_status(policy, c);
  return cmd_report(policy, c);
}

}  // namespace

int main(int argc, char** argv) {
  privilege::init_umask();
  return run_cli("forge-quota", [&] { return run(argc, argv); });
}
