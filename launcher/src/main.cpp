// forge-train SPEC.ini [--section.key=value ...] [--print-config] [--force-new] [--trace]
// forge-train SPEC.ini [--section.key=value ...] --plan [--schedule] [--json]
// forge-train report RUN_DIR
// forge-train trace-merge TRACE_DIR
// forge-train failure RUN_DIR --exit RC [--srun-log FILE] [--lost-node NODE ...] [--max-comm-retries N]
// forge-train in-image IMAGE PROGRAM [ARGS...]
// Trains a GPT from a job spec on every rank of the job (srun --mpi=pmix, mpirun, or one process), or reports
// on a run directory. Exit codes: docs/ARCHITECTURE.md (64 bad spec, 65 bad data, 69 hang, 71 non-finite
// loss, 74 I/O, 75 preempted).
#include "checkpointing.h"
#include "failure_record.h"
#include "forge/comm/bootstrap.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/image.h"
#include "forge/common/local_rank.h"
#include "forge/common/log.h"
#include "forge/common/trace.h"
#include "forge/trainer/spec.h"
#include "in_image.h"
#include "plan.h"
#include "report.h"
#include "train_run.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: forge-train SPEC.ini [--section.key=value ...] [--print-config] [--force-new] [--trace]\n"
    "       forge-train SPEC.ini [--section.key=value ...] --plan [--schedule] [--json]\n"
    "       forge-train report RUN_DIR\n"
    "       forge-train trace-merge TRACE_DIR\n"
    "       forge-train failure RUN_DIR --exit RC [--srun-log FILE] [--lost-node NODE ...] "
    "[--max-comm-retries N]\n"
    "       forge-train in-image IMAGE PROGRAM [ARGS...]\n"
    "  Trains a GPT from the job spec; every key can be overridden as --section.key=value.\n"
    "  --print-config  print the resolved spec (and its hash) and exit\n"
    "  --plan          validate the spec and print, without allocating, what it asks of every rank at its\n"
    "                  layout ([parallel] keys): parameters held, memory (weights, gradients, AdamW, BF16\n"
    "                  copy, activations, buffers), the model's total and active parameters and FLOPs per\n"
    "                  token; then the same as one JSON line (--json: only that line). run.device = auto\n"
    "                  plans for CUDA; --schedule also lists every pipeline stage's actions in a step\n"
    "  --force-new     start afresh even if run.dir holds checkpoints of another spec (the old\n"
    "                  checkpoints, metrics and summary are moved to <run.dir>/superseded/<time>/)\n"
    "  --trace         trace 3 steps (run.trace_steps = auto; or A-B) into\n"
    "                  <run.dir>/trace/steps-A-B/: rank-NNNNN.json per rank and merged.json\n"
    "  Writes <run.dir>/metrics/rank-0.jsonl, <run.dir>/summary.json and checkpoints under\n"
    "  <run.dir>/checkpoints/; resumes from the newest valid one. SIGUSR1/SIGTERM: save and exit 75.\n"
    "  report: writes RUN_DIR/report.html (loss, throughput and MFU plots) and prints a summary.\n"
    "  trace-merge: puts the rank-*.json of TRACE_DIR on one timeline again (merged.json).\n"
    "  failure: for the batch scripts, after the step: completes RUN_DIR/failures/<job>-<restart>.json\n"
    "  and prints what to do (class, requeue, drain, deep_check, advice) as key=value lines.\n"
    "  in-image: for the batch scripts, as one task of a step: runs PROGRAM inside the OCI bundle IMAGE\n"
    "  (forge-image build) through the runtime of the node's oci.conf (docs/IMAGES.md).\n"
    "  Exit: 0 done, 64 bad spec, 65 bad data, 69 no progress (guard.watchdog_s), 71 non-finite loss\n"
    "  beyond [guard], 74 I/O failure, 75 preempted (checkpoint saved; requeue); every other exit\n"
    "  leaves <run.dir>/failures/<job>-<restart>.json with its class, suspects and evidence.\n";

// Leaves the failure record of an exit that has a run directory to leave it in.
void record_exit(const std::string& run_dir, const std::string& spec_hash, int rank, forge::ExitCode code,
                 forge::Fault fault, const std::string& what) {
  namespace L = forge::launcher;
  if (run_dir.empty() || code == forge::ExitCode::kOk) return;
  L::FailureRecord r;
  r.cls = L::failure_class(code, fault);
  r.exit_code = int(code);
  r.step = L::last_finished_step();
  // A fault of this rank's memory or device names it; a job-wide class (spec, preemption) names nobody.
  if (fault != forge::Fault::kNone || code == forge::ExitCode::kIo || code == forge::ExitCode::kFailure)
    r.suspects.push_back({rank, forge::node_name()});
  r.evidence.push_back(what.empty() && code == forge::ExitCode::kPreempted
                           ? "stopped by a signal (preemption or time limit) with a recovery checkpoint"
                           : what);
  L::write_failure_record(run_dir, L::JobKey::from_environment(), r, spec_hash);
}

// Validates the spec, starts the ranks and trains.
int train_command(const forge::Config& config, bool print_config, bool force_new,
                  forge::comm::Bootstrap& boot) {
  forge::trainer::TrainSpec spec = forge::trainer::train_spec(config);
  if (print_config) {
    fmt::print("# spec hash {}\n{}", config.hash(), config.to_ini());
    return 0;
  }
  // Before MPI starts: a rank outside the image the job asked for would start it from other libraries.
  forge::check_running_image(config.get<std::string>("run.image"));
  boot = forge::comm::bootstrap();
  // FORGE_LOG_LEVEL (trace..off) and FORGE_LOG_ALL_RANKS=1 for debugging (scripts/sbatch/debug.sh).
  const char* level = std::getenv("FORGE_LOG_LEVEL");
  const char* all_ranks = std::getenv("FORGE_LOG_ALL_RANKS");
  forge::init_logging(boot.rank, boot.size, level != nullptr ? level : "info",
                      all_ranks != nullptr && std::string(all_ranks) == "1");
  if (spec.parallel.elastic) {
    // The job's layout (--train-layout) is the largest it may run on; its dp follows the ranks started.
    forge::comm::check_layout_of_job(spec.layout);
    spec = forge::trainer::elastic_spec(spec, boot.size);
  } else {
    forge::comm::check_layout(boot, spec.layout);
  }
  return forge::launcher::train(config, spec, force_new, boot);
}

}  // namespace

int main(int argc, char** argv) {
  forge::comm::Bootstrap boot;
  std::string run_dir, spec_hash;  // known once the spec is read: where the failure record goes
  const int code = forge::run_cli("forge-train", [&]() -> int {
    if (argc >= 2 && std::string(argv[1]) == "report") {
      if (argc != 3)
        forge::fail(forge::ExitCode::kUsage, "usage: forge-train report RUN_DIR (one run directory)");
      forge::launcher::print_report(forge::launcher::write_report(argv[2]));
      return 0;
    }
    if (argc >= 2 && std::string(argv[1]) == "failure") return forge::launcher::failure_command(argc, argv);
    if (argc >= 2 && std::string(argv[1]) == "in-image") return forge::launcher::in_image_command(argc, argv);
    if (argc >= 2 && std::string(argv[1]) == "trace-merge") {
      if (argc != 3)
        forge::fail(forge::ExitCode::kUsage,
                    "usage: forge-train trace-merge TRACE_DIR (one trace directory)");
      const int ranks = forge::merge_traces(argv[2]);
      fmt::print("{}/merged.json: {} ranks on one timeline\n", argv[2], ranks);
      return 0;
    }
    std::string spec_path;
    std::vector<std::string> overrides;
    bool print_config = false, force_new = false, plan = false, json = false, schedule = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--print-config") {
        print_config = true;
      } else if (a == "--plan") {
        plan = true;
      } else if (a == "--json") {
        json = true;
      } else if (a == "--schedule") {
        schedule = true;
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
    if ((json || schedule) && !plan)
      forge::fail(forge::ExitCode::kUsage, "{} goes with --plan (forge-train SPEC.ini --plan {})",
                  json ? "--json" : "--schedule", json ? "--json" : "--schedule");
    // A plan starts no ranks and writes nothing: no failure record either.
    if (plan) return forge::launcher::plan_command(config, json, schedule);
    run_dir = config.get<std::string>("run.dir");
    spec_hash = config.hash();
    try {
      return train_command(config, print_config, force_new, boot);
    } catch (const forge::Error& e) {
      record_exit(run_dir, spec_hash, boot.rank, e.code(), e.fault(), e.what());
      throw;
    } catch (const std::bad_alloc&) {
      const forge::Error oom(
          forge::ExitCode::kFailure,
          fmt::format("rank {} on {}: out of host memory; {}", boot.rank, forge::node_name(),
                      forge::launcher::reaction(forge::launcher::FailureClass::kOomHost).advice),
          forge::Fault::kOomHost);
      record_exit(run_dir, spec_hash, boot.rank, oom.code(), oom.fault(), oom.what());
      throw oom;
    } catch (const std::exception& e) {
      record_exit(run_dir, spec_hash, boot.rank, forge::ExitCode::kFailure, forge::Fault::kNone,
                  std::string("internal error: ") + e.what());
      throw;
    }
  });
  // A rank that failed alone would leave its peers blocked in a collective: end the whole job with its
  // code (the ranks that fail together, e.g. on a bad spec, get here all with the same one).
  if (code != 0 && boot.size > 1 && boot.world) boot.world->abort(code);
  return code;
}
