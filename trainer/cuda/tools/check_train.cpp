// Training on the one trainer forge-train runs (forge::trainer::ParallelTrainer at layout 1,1,1) on the CUDA
// backend of the seam: the small benchmark config in FP32 and BF16 against the CPU backend (FP32) on the
// same token stream, losses compared step by step; then the GPT-2-124M-class config in BF16 for throughput
// (and in FP32 for a few steps, its losses against BF16's), and a Llama-family config (Llama-3-8B's blocks,
// fewer of them) in BF16 for throughput. The throughput table is printed last.
#include "check.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/trainer/cuda/backend.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/spec.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

namespace forge::trainer::cuda::check {

namespace {

constexpr double kPeakBf16 = 989e12;  // H100/H200 SXM dense BF16 tensor-core peak, FLOP/s
constexpr double kGiB = double(1ull << 30);
using Clock = std::chrono::steady_clock;

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
  std::string note;  // a run not made: why (no losses then)
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

// `stop_by`: no step starts that would likely end after it (the run then has fewer steps than asked).
RunResult run_gpu(const std::string& label, TrainSpec spec, DType dtype, int steps,
                  std::optional<Clock::time_point> stop_by = std::nullopt) {
  spec.dtype = dtype;
  spec.steps = steps;
  synchronize();
  const size_t before = device_memory_used();
  RunResult r{label, std::string(dtype_name(dtype)), {}, 0, 0, 0, 0, ""};
  {
    comm::ProcessGroups groups = comm::make_groups(comm::self_comm(), spec.layout);
    ParallelTrainer trainer(spec, groups, cuda_backend());
    std::vector<int32_t> tokens;
    std::vector<MicroBatch> batches;
    std::vector<double> seconds;
    for (int s = 0; s < steps; ++s) {
      const Clock::time_point t0 = Clock::now();
      fill_tokens(spec, s, tokens);
      fill_batches(spec, tokens, batches);
      const StepStats st = trainer.step(batches);
      r.losses.push_back(st.loss);
      seconds.push_back(st.seconds);
      const Clock::time_point t1 = Clock::now();
      if (stop_by && s + 1 < steps && t1 + 2 * (t1 - t0) > *stop_by) {
        fmt::print("{} {}: stopped after {} of {} steps (--deadline)\n", label, dtype_name(dtype), s + 1,
                   steps);
        break;
      }
    }
    r.step_ms = median_ms(seconds);
    const double tokens_per_step = double(spec.batch) * spec.microbatches * spec.model.seq_len;
    r.tokens_per_s = tokens_per_step / (r.step_ms / 1e3);
    r.mfu = flops_per_token(spec.model) * r.tokens_per_s / kPeakBf16;
    r.peak_bytes = device_memory_used() - before;
  }
  fmt::print("{} {}: loss {:.4f} -> {:.4f} over {} steps, {:.1f} ms/step\n", r.config, r.dtype,
             r.losses.front(), r.losses.back(), r.losses.size(), r.step_ms);
  std::fflush(stdout);
  return r;
}

std::vector<double> run_cpu(TrainSpec spec, int steps, int total_steps) {
  spec.dtype = DType::kF32;
  spec.steps = total_steps;  // the same schedule as the GPU runs
  spec.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // The one-process CPU trainer (ParallelTrainer at layout 1,1,1).
  comm::ProcessGroups groups = comm::make_groups(comm::self_comm(), spec.layout);
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

// The Llama-family row: Llama-3-8B's block (d_model 4096, 32 query heads on 8 key/value heads of 128, SwiGLU
// 14336 wide, vocabulary 128256 with an untied classifier, RMSNorm, rotary positions with theta 500000;
// configs/families/llama3-8b.ini without its 128k-position scaling) with o.llama_layers of its 32 layers, so
// that it trains on one H200 (140 GiB) in BF16 with FP32 master weights and AdamW. What it allocates at the
// defaults, 8 layers, seq 4096, batch 2 (BF16 mode, layout 1,1,1; model.cpp, attention.cpp, optimizer.cpp,
// parallel_trainer.cpp, the CUDA backend):
//   parameters: 8 x 218.1 M (q 16.8 M, k and v 4.2 M each, output 16.8 M, gate|up 117.4 M, down 58.7 M, two
//     norms) + embedding and head 2 x 525.3 M = 2,795.6 M; 26 bytes each: FP32 weights, gradients, the
//     working copy (weights rounded to BF16, held in FP32), the trainer's reduced-gradient shard (the whole
//     buffer at dp 1) and AdamW's m and v (4 bytes each), and the backend's BF16 copy for the products (2):
//     72.7 GB = 67.7 GiB;
//   per token and layer 155,784 bytes: the stream entering the block and after its attention (FP32, 2 x 4 d),
//     the norms' outputs (BF16, 2 x 2 d), q|k|v (BF16, 2 x 6144), the attention's output (BF16, 2 x 4096)
//     and log-sum-exp (4 x 32), gate|up (BF16, 2 x 28672) and SwiGLU's output (BF16, 2 x 14336), the norms'
//     1/rms (2 x 4): at seq 4096 x batch 2 = 8192 tokens, 8 layers, 10.2 GB = 9.5 GiB;
//   per token outside the layers 311,296 bytes: the backward's workspace (FP32 gradients of the stream, a
//     norm's output, the attention's output, q|k|v and 3 x 14336 for SwiGLU) and the head's stream, final
//     norm and gradients: 2.5 GB = 2.4 GiB;
//   the classifier's chunk: 2048 rows x 128256 FP32 logits and their BF16 gradient, 1.5 GiB; the backend's
//     other BF16 scratch (the attention's dq|dk|dv), 0.1 GiB.
// In all 81.1 GiB, and llama_bytes adds 0.5 GiB for the rest (cuBLASLt's workspace, small buffers): 81.6 GiB,
// leaving some 58 GiB of the H200's 140 free (the weights are 83% of it; seq 4096 x batch 1 would save
// 6 GiB). 16 layers would take 4,540 M x 26 bytes = 110 GiB before activations: too close. At seq 4096 a
// token costs flops_per_token = 6 x 2,270 M (the head multiplies, the embedding is a lookup) + 12 x 8 x 4096
// x 32 x 128 = 15.2 GFLOP, 125 TFLOP a step of 8192 tokens: about 0.3 s at 40% MFU.
TrainSpec llama_spec(const TrainSpec& small, const TrainOptions& o) {
  TrainSpec llama = small;
  llama.model = forge::trainer::model_spec(
      {"--model.family=llama", fmt::format("--model.layers={}", o.llama_layers), "--model.d_model=4096",
       "--model.heads=32", "--model.kv_heads=8", "--model.head_dim=128", "--model.ffn_hidden=14336",
       "--model.vocab=128256", fmt::format("--model.seq_len={}", o.llama_seq), "--model.rope_theta=500000"});
  llama.batch = o.llama_batch;
  llama.microbatches = 1;
  llama.document_mask = false;  // documents would take the FP32 attention
  llama.optim.lr = 3e-4;
  llama.optim.min_lr = 3e-5;
  llama.optim.warmup_steps = 3;
  return llama;
}

// The device bytes the comment above adds up, for any layer count, sequence and batch (dense Llama shapes,
// BF16, one rank): what the run is skipped without when the device has less free.
double llama_bytes(const TrainSpec& spec) {
  const ModelSpec& m = spec.model;
  const double d = m.d_model, q = double(m.heads) * m.head_dim, kv = double(m.kv_heads) * m.head_dim;
  const double h = m.ffn_hidden, tokens = double(spec.batch) * m.seq_len;
  const double per_layer =
      4 * 2 * d + 2 * 2 * d + 2 * (q + 2 * kv) + 2 * q + 4.0 * m.heads + 2 * 2 * h + 2 * h + 2 * 4.0;
  const double outside = 4 * (2 * d + q + (q + 2 * kv) + 3 * h) + 4 * 4 * d;
  const double chunk = 2048.0 * m.vocab * (4 + 2);
  return 26 * parameter_counts(m).total + tokens * (m.layers * per_layer + outside) + chunk +
         2 * tokens * (q + 2 * kv) + 0.5 * kGiB;
}

TrainSpec small_spec(const TrainOptions& o) {
  ConfigSchema schema;
  add_trainer_keys(schema);
  return train_spec(load_config(schema, o.config, {}));
}

// The Llama-family row, last: skipped (with the reason in its row) when the device has too little memory
// free for it or too little time is left before --deadline to start it (its parameters' host-side
// initialization takes about 20 s on 16 cores); an error in it fails its own row only.
void check_llama(const TrainOptions& o, const TrainSpec& small, Table& table, std::vector<RunResult>& runs) {
  const TrainSpec llama = llama_spec(small, o);
  const ModelSpec& m = llama.model;
  const std::string label = fmt::format("llama3-8b-{}L", m.layers);
  const double need = llama_bytes(llama);
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  fmt::print(
      "\nLlama family (Llama-3-8B's blocks): {} of its 32 layers, d_model {}, {} heads on {} key/value "
      "heads of {}, SwiGLU {}, vocab {} (untied), rope theta {:.0f}, seq {}, batch {}: {:.2f} B parameters, "
      "{:.2f} GFLOP/token; needs about {:.1f} GiB, {:.1f} of {:.1f} GiB free\n",
      m.layers, m.d_model, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab, double(m.rope.theta),
      m.seq_len, llama.batch, parameter_counts(m).total / 1e9, flops_per_token(m) / 1e9, need / kGiB,
      double(free_bytes) / kGiB, double(total_bytes) / kGiB);
  std::fflush(stdout);
  std::optional<Clock::time_point> stop_by;
  if (o.deadline > 0) stop_by = o.started + std::chrono::seconds(o.deadline);
  RunResult skipped{label, "bf16", {}, 0, 0, 0, 0, ""};
  if (need > double(free_bytes)) {
    skipped.note = fmt::format("not run: needs ~{:.0f} GiB, {:.0f} free (--llama-layers, --llama-batch)",
                               need / kGiB, double(free_bytes) / kGiB);
  } else if (stop_by && *stop_by - Clock::now() < std::chrono::seconds(60)) {
    skipped.note = fmt::format("not run: {:.0f} s left before --deadline, 60 needed",
                               std::chrono::duration<double>(*stop_by - Clock::now()).count());
  } else {
    try {
      runs.push_back(run_gpu(label, llama, DType::kBF16, o.llama_steps, stop_by));
      // Finite, and not rising over the few steps (it falls from ln 128256 = 11.76 once warmed up).
      const auto& l = runs.back().losses;
      table.add(label + ": final/initial loss <= 1", "bf16", l.back() / l.front(), 1.0);
      return;
    } catch (const std::exception& e) {
      fmt::print("{}: {}\n", label, e.what());
      table.add(label + " run (error)", "bf16", std::numeric_limits<double>::quiet_NaN(), 0);
      skipped.note = "error (above)";
    }
  }
  fmt::print("{}: {}\n", label, skipped.note);
  runs.push_back(skipped);
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
  if (o.llama) check_llama(o, small, table, runs);
}

}  // namespace

void profile_train(const TrainOptions& o) {
  TrainSpec spec = gpt2_spec(small_spec(o), o.gpt2_batch);
  spec.dtype = DType::kBF16;
  spec.steps = 4;
  comm::ProcessGroups groups = comm::make_groups(comm::self_comm(), spec.layout);
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

  // flops_per_token (model.h): N counts the parameters that multiply (not an untied embedding, a lookup);
  // the attention term counts the keys a query sees (the window), heads and head_dim.
  fmt::print(
      "\nThroughput (MFU against {:.0f} TFLOP/s dense BF16; model FLOPs per token 6N + 12 L T heads "
      "head_dim, N without an untied embedding)\n",
      kPeakBf16 / 1e12);
  fmt::print("{:<14} {:<5} {:>10} {:>12} {:>7} {:>10}\n", "config", "dtype", "step ms", "tokens/s", "MFU",
             "memory");
  for (const auto& r : runs) {
    if (r.losses.empty()) {
      fmt::print("{:<14} {:<5} {}\n", r.config, r.dtype, r.note);
      continue;
    }
    fmt::print("{:<14} {:<5} {:>10.1f} {:>12.0f} {:>6.1f}% {:>7.2f} GiB\n", r.config, r.dtype, r.step_ms,
               r.tokens_per_s, 100 * r.mfu, double(r.peak_bytes) / kGiB);
  }
  std::fflush(stdout);
  return table.all_pass();
}

}  // namespace forge::trainer::cuda::check
