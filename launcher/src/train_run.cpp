#include "train_run.h"

#include "checkpointing.h"
#include "data_source.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/trainer/metrics.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace forge::launcher {

namespace fs = std::filesystem;

namespace {

// SIGUSR1 (Slurm's --signal=B:USR1@N, forwarded by the batch script, or preemption) and SIGTERM ask the
// run to finish its step, save a recovery checkpoint and exit 75 so the job is requeued.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

struct Totals {
  int64_t steps = 0, tokens = 0;
  double mfu_sum = 0, last_loss = 0;
};

void write_summary(const trainer::TrainSpec& spec, const Config& config, const Totals& t, double wall_s,
                   double peak, double fpt, ExitCode code) {
  const char* job = std::getenv("SLURM_JOB_ID");
  Json s{{"name", spec.name},
         {"job_id", job != nullptr ? Json(job) : Json(nullptr)},
         {"spec_hash", config.hash()},
         {"steps", t.steps},
         {"tokens", t.tokens},
         {"wall_s", wall_s},
         {"mean_mfu", t.steps > 0 ? t.mfu_sum / double(t.steps) : 0.0},
         {"tokens_per_s", wall_s > 0 ? double(t.tokens) / wall_s : 0.0},
         {"final_loss", t.last_loss},
         {"peak_gflops", peak},
         {"flops_per_token", fpt},
         {"threads", spec.threads},
         {"dtype", spec.dtype == trainer::DType::kBF16 ? "bf16" : "fp32"},
         {"exit_code", int(code)},
         {"exit_class", std::string(exit_class_name(code))}};
  write_json_atomic((fs::path(spec.dir) / "summary.json").string(), s);
}

}  // namespace

int train(const Config& config, const trainer::TrainSpec& spec) {
  // Everything that can reject the spec or the data runs before the model's memory is allocated.
  auto data = open_data(config, spec);
  std::error_code ec;
  fs::create_directories(fs::path(spec.dir) / "metrics", ec);
  if (ec) fail(ExitCode::kIo, "cannot create run directory {}/metrics: {}", spec.dir, ec.message());

  trainer::use_threads(spec.threads);
  const double peak = spec.peak_gflops > 0 ? spec.peak_gflops : trainer::measure_sgemm_gflops(2048, 2);
  const double fpt = trainer::flops_per_token(spec.model);
  trainer::Trainer trainer(spec);
  RunCheckpoints checkpoints(config, spec, trainer, data->version());
  const int64_t first_step = checkpoints.resume();
  trainer::MetricsWriter metrics((fs::path(spec.dir) / "metrics" / "rank-0.jsonl").string(), first_step);
  spdlog::info("run '{}': steps {}..{} on {}, {} threads, {} parameters, peak {:.0f} GFLOP/s, spec {}",
               spec.name, first_step + 1, spec.steps, data->describe(), spec.threads,
               trainer.model().weights().size(), peak, config.hash());
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  const auto start = std::chrono::steady_clock::now();
  const auto wall = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  Totals totals;
  totals.steps = first_step;
  const std::string spec_hash = config.hash();
  std::vector<int32_t> tokens(trainer.tokens_per_step());
  trainer::StepStats st;
  try {
    for (int64_t step = first_step; step < spec.steps; ++step) {
      data->next(step, tokens);
      st = trainer.step(tokens);
      totals.steps = st.step;
      totals.tokens += st.tokens;
      totals.last_loss = st.loss;
      const int64_t tokens_so_far = st.step * st.tokens;
      const double stall_s = checkpoints.after_step(st, tokens_so_far, tokens);
      Json rec = trainer::metrics_record(st, tokens_so_far, fpt, peak);
      rec["spec_hash"] = spec_hash;
      rec["ckpt_stall_ms"] = stall_s * 1e3;
      for (const auto& e : checkpoints.take_events()) rec["ckpt_events"].push_back(e.to_json());
      totals.mfu_sum += rec["mfu"].get<double>();
      metrics.write(rec);
      fmt::print(stderr, "step {}/{} loss {:.4f} gnorm {:.3f} lr {:.2e} {:.0f} ms {:.0f} tok/s mfu {:.1f}%\n",
                 st.step, spec.steps, st.loss, st.grad_norm, st.lr, st.seconds * 1e3,
                 rec["tokens_per_s"].get<double>(), 100.0 * rec["mfu"].get<double>());
      if (g_stop_signal != 0 && st.step < spec.steps) {
        checkpoints.save_now(st, tokens_so_far, tokens);
        fail(ExitCode::kPreempted,
             "stopped by signal {} after step {}; recovery checkpoint saved, requeue to resume",
             int(g_stop_signal), st.step);
      }
    }
    if (st.step > 0) checkpoints.finish(st, st.step * st.tokens, tokens);
  } catch (const Error& e) {
    write_summary(spec, config, totals, wall(), peak, fpt, e.code());
    throw;
  }
  write_summary(spec, config, totals, wall(), peak, fpt, ExitCode::kOk);
  spdlog::info("run '{}' finished: {} steps, {} tokens, final loss {:.4f}, {:.1f} s", spec.name, totals.steps,
               totals.tokens, totals.last_loss, wall());
  return 0;
}

}  // namespace forge::launcher
