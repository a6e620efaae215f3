// forge-health: node health checks for Slurm's Prolog, HealthCheckProgram and Epilog; drains a node that
// fails one and resumes only the nodes it drained itself (docs/HEALTH.md).
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/local_rank.h"
#include "forge/common/text.h"
#include "forge/health/health.h"

#include <boost/program_options.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>

namespace po = boost::program_options;
using namespace forge;
using namespace forge::health;

namespace {

constexpr const char* kUsage = R"(usage: forge-health COMMAND [options]   (docs/HEALTH.md)

commands:
  check [--mode quick|periodic|deep] [--node NAME] [--config FILE] [--no-drain] [--json]
        run the mode's checks; one line per failed check and a summary; drain the node on a failure
        (reason "forge-health: <check>: <detail>"), resume it when healthy and drained by forge-health
  drain --node NAME --check CHECK --detail TEXT [--down]
        drain with forge-health's reason (the detail is sanitized); an existing drain is kept;
        --down: mark it DOWN (a node that no longer answers: its jobs are requeued now)
  resume [--node NAME] [--mode MODE] [--config FILE]
        resume the node if and only if forge-health drained it and it is healthy now

node: --node, else $SLURMD_NODENAME, else the short host name
config: --config, else $FORGE_HEALTH_CONFIG, else /etc/forge/health.ini if it exists, else built-in defaults
exit: 0 healthy (or done), 1 unhealthy (or not resumed), 64 bad usage or configuration, 69 scontrol failed,
      70 internal error (never 1: a Prolog must not fail a node over a forge-health bug)
)";

constexpr int kInternal = 70;  // EX_SOFTWARE

std::string default_node(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return n;
  const std::string host = host_name();
  return host.substr(0, host.find('.'));
}

std::string default_config(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* c = std::getenv("FORGE_HEALTH_CONFIG"); c && *c) return c;
  return ::access("/etc/forge/health.ini", R_OK) == 0 ? "/etc/forge/health.ini" : "";
}

std::string_view status_name(Status s) {
  return s == Status::kPass ? "pass" : s == Status::kFail ? "fail" : "skip";
}

std::string_view action_name(Action a) {
  return a == Action::kDrain ? "drain" : a == Action::kResume ? "resume" : "none";
}

struct Options {
  std::string mode = "quick", node, config, check, detail;
  bool no_drain = false, json = false, down = false;
};

Options parse(const std::string& command, const std::vector<std::string>& args) {
  Options o;
  po::options_description d("options");
  d.add_options()("help,h", "show help")("node", po::value(&o.node), "node name");
  if (command == "check" || command == "resume")
    d.add_options()("mode", po::value(&o.mode), "quick, periodic or deep")("config", po::value(&o.config),
                                                                           "INI file");
  if (command == "check")
    d.add_options()("no-drain", po::bool_switch(&o.no_drain))("json", po::bool_switch(&o.json));
  if (command == "drain")
    d.add_options()("check", po::value(&o.check), "check name")(
        "detail", po::value(&o.detail), "what failed")("down", po::bool_switch(&o.down), "mark it DOWN");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << kUsage;
    std::exit(0);
  }
  if (command == "resume" && !vm.count("mode")) o.mode = "periodic";
  if (command == "drain" && (o.node.empty() || o.check.empty() || !vm.count("detail")))
    fail(ExitCode::kUsage, "drain needs --node NAME --check CHECK --detail TEXT");
  return o;
}

int run_check(const Options& o, Probes& probes, bool resume_only) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedConfig loaded = load_health_config(default_config(o.config));
  apply_environment(loaded.config, probes);
  const Mode mode = parse_mode(o.mode);
  const std::string node = default_node(o.node);
  // resume never drains: it decides without acting, then acts only on a resume.
  CheckReport r = check_node(loaded, mode, node, !o.no_drain && !resume_only, probes);
  if (resume_only && r.decision.action == Action::kResume) {
    r.action_error = scontrol_resume(node, probes, loaded.config.command_timeout_s);
    r.acted = r.action_error.empty();
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& w : r.warnings) std::cerr << "forge-health: warning: " << w << '\n';
  if (!r.action_error.empty())
    std::cerr << "forge-health: error: " << node << ": cannot " << action_name(r.decision.action) << ": "
              << r.action_error << '\n';
  if (o.json) {
    Json doc = {{"node", node},
                {"mode", std::string(mode_name(mode))},
                {"healthy", r.healthy()},
                {"elapsed_s", elapsed},
                {"action", std::string(action_name(r.decision.action))},
                {"reason", r.decision.reason},
                {"acted", r.acted},
                {"message", r.decision.message},
                {"warnings", r.warnings}};
    doc["checks"] = Json::array();
    for (const auto& c : r.results)
      doc["checks"].push_back(
          {{"check", c.check}, {"status", std::string(status_name(c.status))}, {"detail", c.detail}});
    std::cout << doc.dump() << '\n';
  } else {
    int failed = 0;
    std::string skipped;
    for (const auto& c : r.results) {
      if (c.status == Status::kFail) {
        ++failed;
        std::cout << "forge-health: " << node << ": FAIL " << c.check << ": " << c.detail << '\n';
      }
      if (c.status == Status::kSkip) skipped += (skipped.empty() ? "" : ", ") + c.check;
    }
    std::string action;
    if (r.decision.action != Action::kNone)
      action = r.acted ? "; " + r.decision.message
                       : fmt::format("; {} {}", r.action_error.empty() ? "would" : "could not",
                                     r.decision.message);
    else if (!r.decision.message.empty())
      action = "; " + r.decision.message;
    std::cout << fmt::format("forge-health: {}: {} ({}, {} checks, {} failed{}, {:.2f} s){}\n", node,
                             r.healthy() ? "healthy" : "unhealthy", mode_name(mode), r.results.size(), failed,
                             skipped.empty() ? "" : ", skipped: " + skipped, elapsed, action);
  }
  if (resume_only) return r.acted || (r.healthy() && r.decision.message.empty()) ? 0 : 1;
  return r.healthy() ? 0 : 1;
}

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::cout << kUsage;
    return argc < 2 ? static_cast<int>(ExitCode::kUsage) : 0;
  }
  const std::string command = argv[1];
  if (command != "check" && command != "drain" && command != "resume")
    fail(ExitCode::kUsage, "unknown command '{}': expected check, drain or resume (forge-health --help)",
         printable(command));
  const Options o = parse(command, std::vector<std::string>(argv + 2, argv + argc));
  auto probes = system_probes();
  if (command == "drain") {
    std::cout << "forge-health: " << drain_command(o.node, o.check, o.detail, *probes, 10, o.down) << '\n';
    return 0;
  }
  return run_check(o, *probes, command == "resume");
}

}  // namespace

int main(int argc, char** argv) {
  return run_cli("forge-health", [&] {
    try {
      return run(argc, argv);
    } catch (const Error&) {
      throw;
    } catch (const po::error&) {
      throw;
    } catch (const std::exception& e) {
      std::cerr << "forge-health: internal error: " << e.what() << '\n';
      return kInternal;
    }
  });
}
