// Training on the one trainer forge-train runs (forge::trainer::ParallelTrainer at layout 1,1,1) on the CUDA
// backend of the seam: the small benchmark config in FP32 and BF16 against the CPU backend (FP32) on the
// same token stream, losses compared step by step; then the GPT-2-124M-class config in BF16 for throughput
// (and in FP32 for a few steps, its losses against BF16's). The throughput table is printed last.
#include "check.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/trainer/cuda/backend.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/spec.h"

#include <cuda_profiler_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>

namespace forge::trainer::cuda::check {

namespace {

constexpr double kPeakBf16 = 989e12;  // H100/H200 SXM dense BF16 tensor-core peak, FLOP/s

// A deterministic token stream with learnable structure: every token has four successors picked by hash,
// taken with probabilities 0.6 / 0.2 / 0.1 / 0.05, else a uniformly random token. Row r of step s is a pure
// function of (seed, s, r), so the CPU and GPU runs read identical batches.
void fill_tokens(const TrainSpec& spec, int64_t step, std::vector<int32_t>& out) {
  const uint64_t seed = spec.seed;
  const int rows = spec.batch * spec.microbatches, cols = spec.model.seq_len + 1, vocab = spec.model.vocab;
  out.resize(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r) {
    uint64_t state = splitmix64(seed ^ splitmix64(uint64_t(step) * 1000003u + uint64_t(r)));
    int32_t tok = int32_t(state % uint64_t(vocab));
    for (int c = 0; c < cols; ++c) {
      out[size_t(r) * cols + c] = tok;
      state = splitmix64(state);
      const double u = double(state >> 11) * 0x1.0p-53;
      const int pick = u < 0.6 ? 0 : u < 0.8 ? 1 : u < 0.9 ? 2 : u < 0.95 ? 3 : -1;
      tok = pick < 0 ? int32_t(splitmix64(state + 1) % uint64_t(vocab))
                     : int32_t(splitmix64(seed + uint64_t(tok) * 4 + uint64_t(pick)) % uint64_t(vocab));
    }
  }
}

struct RunResult {
  std::string config, dtype;
  std::vector<double> losses;
  double step_ms = 0, tokens_per_s = 0, mfu = 0;
  size_t peak_bytes = 0;
};

// Median step time of the steps after the first three (cuBLASLt heuristics and allocations happen first).
double median_ms(std::vector<double> seconds) {
  if (seconds.size() > 4) seconds.erase(seconds.begin(), seconds.begin() + 3);
  std::sort(seconds.begin(), seconds.end());
  return 1e3 * seconds[seconds.size() / 2];
}

// The step's micro-batches: the stream's rows as next-token windows.
void fill_batches(const TrainSpec& spec, const std::vector<int32_t>& tokens,
                  std::vector<MicroBatch>& batches) {
  batches.resize(size_t(spec.microbatches));
  const size_t row = size_t(spec.model.seq_len) + 1;
  for (int mb = 0; mb < spec.microbatches; ++mb) {
    batches[size_t(mb)].resize(spec.batch, spec.model.seq_len);
    for (int r = 0; r < spec.batch; ++r)
      batches[size_t(mb)].set_window(r, tokens.data() + (size_t(mb) * size_t(spec.batch) + size_t(r)) * row,
                                     uint64_t(r), 0);
  }
}

// The process's CUDA backend (one per process, as in forge-train).
Backend& cuda_backend() {
  static const std::unique_ptr<Backend> backend = make_cuda_backend(0);
  return *backend;
}

RunResult run_gpu(const std::string& label, TrainSpec spec, DType dtype, int steps) {
  spec.dtype = dtype;
  spec.steps = steps;
  synchronize();
  const size_t before = device_memory_used();
  RunResult r{label, std::string(dtype_name(dtype)), {}, 0, 0, 0, 0};
  {
    ProcessGroups groups = make_groups(self_comm(), spec.layout);
    ParallelTrainer trainer(spec, groups, cuda_backend());
    std::vector<int32_t> tokens;
    std::vector<MicroBatch> batches;
    std::vector<double> seconds;
    for (int s = 0; s < steps; ++s) {
      fill_tokens(spec, s, tokens);
      fill_batches(spec, tokens, batches);
      const StepStats st = trainer.step(batches);
      r.losses.push_back(st.loss);
      seconds.push_back(st.seconds);
    }
    r.step_ms = median_ms(seconds);
    const double tokens_per_step = double(spec.batch) * spec.microbatches * spec.model.seq_len;
    r.tokens_per_s = tokens_per_step / (r.step_ms / 1e3);
    r.mfu = flops_per_token(spec.model) * r.tokens_per_s / kPeakBf16;
    r.peak_bytes = device_memory_used() - before;
  }
  fmt::print("{} {}: loss {:.4f} -> {:.4f} over {} steps, {:.1f} ms/step\n", r.config, r.dtype,
             r.losses.front(), r.losses.back(), steps, r.step_ms);
  std::fflush(stdout);
  return r;
}

std::vector<double> run_cpu(TrainSpec spec, int steps, int total_steps) {
  spec.dtype = DType::kF32;
  spec.steps = total_steps;  // the same schedule as the GPU runs
  spec.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // The one-process CPU trainer (ParallelTrainer at layout 1,1,1).
  ProcessGroups groups = make_groups(self_comm(), spec.layout);
  ParallelTrainer trainer(spec, groups);
  std::vector<int32_t> tokens;
  std::vector<MicroBatch> batches;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    fill_tokens(spec, s, tokens);
    fill_batches(spec, tokens, batches);
    losses.push_back(trainer.step(batches).loss);
  }
  return losses;
}

TrainSpec gpt2_spec(const TrainSpec& small, int batch) {
  TrainSpec gpt2 = small;
  gpt2.model = forge::trainer::gpt2_spec(12, 768, 12, 50304, 1024);
  gpt2.batch = batch;
  gpt2.microbatches = 1;
  gpt2.optim.lr = 6e-4;
  gpt2.optim.min_lr = 6e-5;
  gpt2.optim.warmup_steps = 5;
  return gpt2;
}

TrainSpec small_spec(const TrainOptions& o) {
  ConfigSchema schema;
  add_trainer_keys(schema);
  return train_spec(load_config(schema, o.config, {}));
}

void check_train_runs(const TrainOptions& o, Table& table, std::vector<RunResult>& runs) {
  const TrainSpec small = small_spec(o);
  fmt::print("\nTraining: {} ({} layers, d_model {}, {} heads, vocab {}, seq {}, batch {})\n", o.config,
             small.model.layers, small.model.d_model, small.model.heads, small.model.vocab,
             small.model.seq_len, small.batch);
  std::fflush(stdout);
  runs.push_back(run_gpu("small", small, DType::kF32, o.steps));
  runs.push_back(run_gpu("small", small, DType::kBF16, o.steps));
  const std::vector<double> cpu = run_cpu(small, o.cpu_steps, o.steps);

  // Per-step relative loss difference against the CPU FP32 run. FP32 differs only by summation order; BF16
  // by its rounding of the matrix-product inputs, about 0.4% per value.
  fmt::print("\n{:>4} {:>12} {:>12} {:>12}\n", "step", "cpu fp32", "cuda fp32", "cuda bf16");
  std::vector<double> err(runs.size(), 0.0);
  for (int s = 0; s < o.cpu_steps; ++s) {
    const double c = cpu[size_t(s)];
    fmt::print("{:>4} {:>12.6f}", s + 1, c);
    for (size_t i = 0; i < runs.size(); ++i) {
      const double e = std::fabs(runs[i].losses[size_t(s)] - c) / c;
      err[i] = std::isnan(e) ? e : std::max(err[i], e);
      fmt::print(" {:>12.6f}", runs[i].losses[size_t(s)]);
    }
    fmt::print("\n");
  }
  for (size_t i = 0; i < runs.size(); ++i)
    table.add(fmt::format("{}: loss vs CPU, {} steps", runs[i].config, o.cpu_steps), runs[i].dtype, err[i],
              runs[i].dtype == "fp32" ? 1e-3 : 2e-2);
  // The loss must fall: the stream's next-token entropy is far below log(vocab).
  for (const auto& r : runs)
    table.add(r.config + ": final/initial loss < 0.97", r.dtype, r.losses.back() / r.losses.front(), 0.97);

  if (o.gpt2) {
    const TrainSpec gpt2 = gpt2_spec(small, o.gpt2_batch);
    fmt::print("\nGPT-2-124M class: 12 layers, d_model 768, 12 heads, vocab 50304, seq 1024, batch {}\n",
               gpt2.batch);
    std::fflush(stdout);
    runs.push_back(run_gpu("gpt2-124m", gpt2, DType::kBF16, o.steps));
    const auto& bf16 = runs.back().losses;
    table.add("gpt2-124m: final/initial loss < 0.97", "bf16", bf16.back() / bf16.front(), 0.97);
    runs.push_back(run_gpu("gpt2-124m", gpt2, DType::kF32, std::min(o.steps, 10)));
    const auto& f32 = runs.back().losses;
    double e = 0;
    for (size_t s = 0; s < std::min<size_t>(5, f32.size()); ++s)
      e = std::max(e, std::fabs(bf16[s] - f32[s]) / f32[s]);
    table.add("gpt2-124m: bf16 vs fp32 loss, 5 steps", "bf16", e, 2e-2);
  }
}

}  // namespace

void profile_train(const TrainOptions& o) {
  TrainSpec spec = gpt2_spec(small_spec(o), o.gpt2_batch);
  spec.dtype = DType::kBF16;
  spec.steps = 4;
  ProcessGroups groups = make_groups(self_comm(), spec.layout);
  ParallelTrainer trainer(spec, groups, cuda_backend());
  std::vector<int32_t> tokens;
  std::vector<MicroBatch> batches;
  for (int s = 0; s < spec.steps; ++s) {
    fill_tokens(spec, s, tokens);
    fill_batches(spec, tokens, batches);
    if (s + 1 == spec.steps) check_cuda(cudaProfilerStart(), "cudaProfilerStart");
    const StepStats st = trainer.step(batches);
    fmt::print("gpt2-124m bf16 step {}: {:.1f} ms\n", s + 1, 1e3 * st.seconds);
  }
  check_cuda(cudaProfilerStop(), "cudaProfilerStop");
}

bool check_train(const TrainOptions& o) {
  Table table;
  std::vector<RunResult> runs;
  try {
    check_train_runs(o, table, runs);
  } catch (const std::exception& e) {
    // Reported as a failed row; the table and the runs that finished are still printed.
    fmt::print("training: {}\n", e.what());
    table.add("training run (error)", "-", std::numeric_limits<double>::quiet_NaN(), 0);
  }
  table.print("Training checks (relative loss difference)");

  fmt::print("\nThroughput (MFU against {:.0f} TFLOP/s dense BF16; model FLOPs 6N + 12LTd per token)\n",
             kPeakBf16 / 1e12);
  fmt::print("{:<12} {:<5} {:>10} {:>12} {:>7} {:>10}\n", "config", "dtype", "step ms", "tokens/s", "MFU",
             "memory");
  for (const auto& r : runs)
    fmt::print("{:<12} {:<5} {:>10.1f} {:>12.0f} {:>6.1f}% {:>7.2f} GiB\n", r.config, r.dtype, r.step_ms,
               r.tokens_per_s, 100 * r.mfu, double(r.peak_bytes) / double(1ull << 30));
  std::fflush(stdout);
  return table.all_pass();
}

}  // namespace forge::trainer::cuda::check
