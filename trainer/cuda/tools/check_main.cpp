// forge-cuda-check: the GPU backend against the CPU trainer on one GPU (docs/GPU.md, scripts/gpu/check.sh).
// `forge-cuda-check backend` checks only the CUDA backend of the seam against the CPU backend, op by op.
#include "check.h"

#include "forge/common/error.h"
#include "forge/trainer/cuda/device.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>

namespace check = forge::trainer::cuda::check;

namespace forge::trainer::cuda::check {

void Table::add(const std::string& what, const std::string& dtype, double err, double tol) {
  rows_.push_back({what, dtype, err, tol, std::isfinite(err) && err <= tol});
}

void Table::print(const char* title) const {
  fmt::print("\n{}\n{:<50} {:<5} {:>12} {:>10}  {}\n", title, "op", "dtype", "max rel err", "tolerance",
             "pass");
  for (const auto& r : rows_)
    fmt::print("{:<50} {:<5} {:>12.3e} {:>10.0e}  {}\n", r.what, r.dtype, r.err, r.tol,
               r.pass ? "yes" : "NO");
  std::fflush(stdout);
}

bool Table::all_pass() const {
  for (const auto& r : rows_)
    if (!r.pass) return false;
  return !rows_.empty();
}

}  // namespace forge::trainer::cuda::check

int main(int argc, char** argv) {
  return forge::run_cli("forge-cuda-check", [&] {
    check::TrainOptions train;
    train.config = std::string(FORGE_SOURCE_DIR) + "/configs/bench-cpu.ini";
    bool ops = true, run_train = true;
    // The mode `backend` comes first and takes no options.
    const bool backend = argc > 1 && std::string(argv[1]) == "backend";
    if (backend && argc > 2)
      forge::fail(forge::ExitCode::kUsage, "forge-cuda-check backend takes no options");
    for (int i = backend ? argc : 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) forge::fail(forge::ExitCode::kUsage, "{} needs a value", arg);
        return argv[++i];
      };
      const auto number = [&]() {
        const std::string v = value();
        try {
          return std::stoi(v);
        } catch (const std::exception&) {
          forge::fail(forge::ExitCode::kUsage, "{} needs an integer, got '{}'", arg, v);
        }
      };
      if (arg == "--ops-only")
        run_train = false;
      else if (arg == "--train-only")
        ops = false;
      else if (arg == "--config")
        train.config = value();
      else if (arg == "--steps")
        train.steps = number();
      else if (arg == "--cpu-steps")
        train.cpu_steps = number();
      else if (arg == "--gpt2-batch")
        train.gpt2_batch = number();
      else if (arg == "--no-gpt2")
        train.gpt2 = false;
      else if (arg == "--no-llama")
        train.llama = false;
      else if (arg == "--llama-layers")
        train.llama_layers = number();
      else if (arg == "--llama-seq")
        train.llama_seq = number();
      else if (arg == "--llama-batch")
        train.llama_batch = number();
      else if (arg == "--llama-steps")
        train.llama_steps = number();
      else if (arg == "--deadline")
        train.deadline = number();
      else if (arg == "--profile")
        train.profile = true;
      else
        forge::fail(forge::ExitCode::kUsage,
                    "unknown argument '{}' (usage: forge-cuda-check backend | forge-cuda-check [--ops-only "
                    "--train-only --config PATH --steps N --cpu-steps N --gpt2-batch N --no-gpt2 --no-llama "
                    "--llama-layers N --llama-seq N --llama-batch N --llama-steps N --deadline SECONDS "
                    "--profile])",
                    arg);
    }
    if (train.steps < 4 || train.cpu_steps < 1 || train.cpu_steps > train.steps || train.gpt2_batch < 1)
      forge::fail(forge::ExitCode::kUsage,
                  "need --steps >= 4, 1 <= --cpu-steps <= --steps and --gpt2-batch >= 1");
    if (train.llama_layers < 1 || train.llama_seq < 1 || train.llama_batch < 1 || train.llama_steps < 4 ||
        train.deadline < 0)
      forge::fail(forge::ExitCode::kUsage,
                  "need --llama-layers, --llama-seq and --llama-batch >= 1, --llama-steps >= 4 and "
                  "--deadline >= 0");
    const auto dev = forge::trainer::cuda::bind_device(0, forge::trainer::cuda::read_device_env());
    fmt::print("forge-cuda-check: {} (CUDA device {}, GPU {})\n", dev.name, dev.ordinal, dev.physical);
    if (backend) {
      const bool ok = check::check_backend(20261202, dev.ordinal);
      fmt::print("\nforge-cuda-check backend: {}\n", ok ? "all ops passed" : "SOME OPS FAILED");
      return ok ? 0 : int(forge::ExitCode::kFailure);
    }
    if (train.profile) {
      check::profile_train(train);
      return 0;
    }
    bool ok = true;
    if (ops) ok = check::check_ops(20261129) && ok;
    if (run_train) ok = check::check_train(train) && ok;
    fmt::print("\nforge-cuda-check: {}\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : int(forge::ExitCode::kFailure);
  });
}
