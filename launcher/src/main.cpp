// forge-train SPEC.ini [--section.key=value ...] [--print-config]
// Trains a GPT from a job spec in one process. Exit codes: ARCHITECTURE.md (64 bad spec, 65 bad data,
// 71 non-finite loss, 74 I/O).
#include "checkpointing.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/log.h"
#include "forge/trainer/spec.h"
#include "train_run.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: forge-train SPEC.ini [--section.key=value ...] [--print-config]\n"
    "  Trains a GPT from the job spec; every key can be overridden as --section.key=value.\n"
    "  --print-config  print the resolved spec (and its hash) and exit\n"
    "  Writes <run.dir>/metrics/rank-0.jsonl, <run.dir>/summary.json and checkpoints under\n"
    "  <run.dir>/checkpoints/; resumes from the newest valid one. SIGUSR1/SIGTERM: save and exit 75.\n"
    "  Exit: 0 done, 64 bad spec, 65 bad data, 71 non-finite loss, 74 I/O failure, 75 preempted.\n";

}  // namespace

int main(int argc, char** argv) {
  return forge::run_cli("forge-train", [&]() -> int {
    std::string spec_path;
    std::vector<std::string> overrides;
    bool print_config = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--print-config") {
        print_config = true;
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
    forge::init_logging(0, 1);
    return forge::launcher::train(config, spec);
  });
}
