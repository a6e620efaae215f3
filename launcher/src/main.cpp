// forge-train SPEC.ini [--section.key=value ...] [--print-config] [--force-new] [--trace]
// forge-train report RUN_DIR
// forge-train trace-merge TRACE_DIR
// Trains a GPT from a job spec on every rank of the job (srun --mpi=pmix, mpirun, or one process), or reports
// on a run directory. Exit codes: docs/ARCHITECTURE.md (64 bad spec, 65 bad data, 69 hang, 71 non-finite
// loss, 74 I/O, 75 preempted).
#include "checkpointing.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/log.h"
#include "forge/trainer/bootstrap.h"
#include "forge/trainer/spec.h"
#include "forge/trainer/trace.h"
#include "report.h"
#include "train_run.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: forge-train SPEC.ini [--section.key=value ...] [--print-config] [--force-new] [--trace]\n"
    "       forge-train report RUN_DIR\n"
    "       forge-train trace-merge TRACE_DIR\n"
    "  Trains a GPT from the job spec; every key can be overridden as --section.key=value.\n"
    "  --print-config  print the resolved spec (and its hash) and exit\n"
    "  --force-new     start afresh even if run.dir holds checkpoints of another spec (the old\n"
    "                  checkpoints, metrics and summary are moved to <run.dir>/superseded/<time>/)\n"
    "  --trace         trace 3 steps (run.trace_steps = auto; or A-B) into\n"
    "                  <run.dir>/trace/steps-A-B/: rank-NNNNN.json per rank and merged.json\n"
    "  Writes <run.dir>/metrics/rank-0.jsonl, <run.dir>/summary.json and checkpoints under\n"
    "  <run.dir>/checkpoints/; resumes from the newest valid one. SIGUSR1/SIGTERM: save and exit 75.\n"
    "  report: writes RUN_DIR/report.html (loss, throughput and MFU plots) and prints a summary.\n"
    "  trace-merge: puts the rank-*.json of TRACE_DIR on one timeline again (merged.json).\n"
    "  Exit: 0 done, 64 bad spec, 65 bad data, 69 no progress (guard.watchdog_s), 71 non-finite loss\n"
    "  beyond [guard], 74 I/O failure, 75 preempted (checkpoint saved; requeue).\n";

}  // namespace

int main(int argc, char** argv) {
  forge::trainer::Bootstrap boot;
  const int code = forge::run_cli("forge-train", [&]() -> int {
    if (argc >= 2 && std::string(argv[1]) == "report") {
      if (argc != 3)
        forge::fail(forge::ExitCode::kUsage, "usage: forge-train report RUN_DIR (one run directory)");
      forge::launcher::print_report(forge::launcher::write_report(argv[2]));
      return 0;
    }
    if (argc >= 2 && std::string(argv[1]) == "trace-merge") {
      if (argc != 3)
        forge::fail(forge::ExitCode::kUsage,
                    "usage: forge-train trace-merge TRACE_DIR (one trace directory)");
      const int ranks = forge::trainer::merge_traces(argv[2]);
      fmt::print("{}/merged.json: {} ranks on one timeline\n", argv[2], ranks);
      return 0;
    }
    std::string spec_path;
    std::vector<std::string> overrides;
    bool print_config = false, force_new = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--print-config") {
        print_config = true;
      } else if (a == "--force-new") {
        force_new = true;
      } else if (a == "--trace") {
        overrides.push_back("--run.trace_steps=auto");
      } else if (a.rfind("--", 0) == 0) {
        overrides.push_back(a);
      } else if (spec_path.empty()) {
        spec_path = a;
      } else {
        forge::fail(forge::ExitCode::kUsage,
                    "unexpected argument '{}' (one SPEC.ini, then --section.key=value)", a);
      }
    }
    if (spec_path.empty())
      forge::fail(
          forge::ExitCode::kUsage,
          "missing SPEC.ini (usage: forge-train SPEC.ini [--section.key=value ...] [--print-config])");
    forge::ConfigSchema schema;
    forge::trainer::add_trainer_keys(schema);
    forge::launcher::add_checkpoint_keys(schema);
    const forge::Config config = forge::load_config(schema, spec_path, overrides);
    const forge::trainer::TrainSpec spec = forge::trainer::train_spec(config);
    if (print_config) {
      fmt::print("# spec hash {}\n{}", config.hash(), config.to_ini());
      return 0;
    }
    boot = forge::trainer::bootstrap();
    // FORGE_LOG_LEVEL (trace..off) and FORGE_LOG_ALL_RANKS=1 for debugging (scripts/sbatch/debug.sh).
    const char* level = std::getenv("FORGE_LOG_LEVEL");
    const char* all_ranks = std::getenv("FORGE_LOG_ALL_RANKS");
    forge::init_logging(boot.rank, boot.size, level != nullptr ? level : "info",
                        all_ranks != nullptr && std::string(all_ranks) == "1");
    forge::trainer::check_layout(boot, spec.layout);
    return forge::launcher::train(config, spec, force_new, boot);
  });
  // A rank that failed alone would leave its peers blocked in a collective: end the whole job with its
  // code (the ranks that fail together, e.g. on a bad spec, get here all with the same one).
  if (code != 0 && boot.size > 1 && boot.world) boot.world->abort(code);
  return code;
}
