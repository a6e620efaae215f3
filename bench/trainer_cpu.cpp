// Trainer CPU benchmark: our training step on a GPT config (default: the benchmark, 6 layers,
// d 384, 6 heads, vocab 8192, seq 256, batch 8, FP32, AdamW, 2 threads), the sgemm peak on the same
// threads, MFU against it, a per-op profile of one step's kernels at the same shapes, and peak RSS
// against the analytic minimum. bench/trainer_cpu.sh runs this and the PyTorch peer in one invocation.
//
// Usage: bench_trainer_cpu [--threads N] [--steps N] [--layers N] [--dmodel N] [--heads N] [--vocab N]
//                          [--seq N] [--model.KEY=VALUE ...] [--batch N] [--dtype fp32|bf16] [--no-profile]
//                          [--trace-rounds N]
// --trace-rounds N: what tracing (trace.h) costs, in N rounds alternating 3 steps untraced and 3 traced.
#include "cpu/kernels.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/trace.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace forge::trainer;
using forge::MicroBatch;

namespace {

double seconds_of(const std::function<void()>& f, int reps = 3) {
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Time of each kernel at the model's shapes, times its count per step.
void profile(const ModelSpec& m, int B, double step_s) {
  namespace k = forge::trainer::cpu;
  const int T = m.seq_len, C = m.d_model, NH = m.heads, V = m.vocab, L = m.layers, N = B * T;
  const forge::trainer::AttentionShape shape = m.attention();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  auto x = fill(size_t(N) * C), y = fill(size_t(N) * C), qkv = fill(size_t(N) * 3 * C);
  auto h = fill(size_t(N) * 4 * C), h2 = fill(size_t(N) * 4 * C), dqkv = fill(size_t(N) * 3 * C);
  auto w = fill(size_t(4) * C * C), dw = fill(size_t(4) * C * C), wte = fill(size_t(V) * C);
  auto dwte = fill(size_t(V) * C), bias = fill(size_t(4) * C), stats = fill(size_t(2) * N);
  auto lse = fill(size_t(N) * NH), dx = fill(size_t(N) * C);
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = int32_t(rng() % unsigned(V));
  // The tied classifier and its loss, as the model runs them (layers.h).
  ParamInfo wte_info;
  wte_info.name = "wte.weight";
  wte_info.shape = wte_info.local_shape = {V, C};
  Classifier classifier(cpu_backend(), {&wte_info, wte.data(), dwte.data()}, 0);
  DeviceBatch batch;
  batch.targets = tok.data();
  const LmCrossEntropy loss;
  struct Row {
    const char* name;
    double seconds;
    int per_step;
  };
  std::vector<Row> rows = {
      {"matmul fwd qkv",
       seconds_of([&] { k::matmul_forward(qkv.data(), x.data(), w.data(), bias.data(), N, C, 3 * C); }), L},
      {"matmul fwd attn.proj",
       seconds_of([&] { k::matmul_forward(y.data(), x.data(), w.data(), nullptr, N, C, C); }), L},
      {"matmul fwd mlp.fc",
       seconds_of([&] { k::matmul_forward(h.data(), x.data(), w.data(), nullptr, N, C, 4 * C); }), L},
      {"matmul fwd mlp.proj",
       seconds_of([&] { k::matmul_forward(y.data(), h.data(), w.data(), nullptr, N, 4 * C, C); }), L},
      {"matmul bwd qkv", seconds_of([&] {
         k::matmul_backward(x.data(), dw.data(), bias.data(), dqkv.data(), y.data(), w.data(), N, C, 3 * C);
       }),
       L},
      {"matmul bwd attn.proj", seconds_of([&] {
         k::matmul_backward(x.data(), dw.data(), bias.data(), y.data(), dx.data(), w.data(), N, C, C);
       }),
       L},
      {"matmul bwd mlp.fc", seconds_of([&] {
         k::matmul_backward(x.data(), dw.data(), bias.data(), h.data(), y.data(), w.data(), N, C, 4 * C);
       }),
       L},
      {"matmul bwd mlp.proj", seconds_of([&] {
         k::matmul_backward(h2.data(), dw.data(), bias.data(), y.data(), h.data(), w.data(), N, 4 * C, C);
       }),
       L},
      {"attention fwd",
       seconds_of([&] { k::attention_forward(y.data(), lse.data(), qkv.data(), nullptr, B, T, shape); }), L},
      {"attention bwd", seconds_of([&] {
         k::attention_backward(dqkv.data(), dx.data(), qkv.data(), y.data(), lse.data(), nullptr, B, T,
                               shape);
       }),
       L},
      {"layernorm fwd", seconds_of([&] {
         k::layernorm_forward(y.data(), stats.data(), stats.data() + N, x.data(), bias.data(), bias.data(), N,
                              C);
       }),
       1},
      {"residual+layernorm fwd", seconds_of([&] {
         k::residual_layernorm_forward(dx.data(), y.data(), stats.data(), stats.data() + N, x.data(),
                                       y.data(), bias.data(), bias.data(), bias.data(), N, C);
       }),
       2 * L},
      {"layernorm bwd", seconds_of([&] {
         k::layernorm_backward(dx.data(), dw.data(), dw.data() + C, y.data(), x.data(), bias.data(),
                               stats.data(), stats.data() + N, N, C);
       }),
       2 * L + 1},
      {"bias+gelu fwd", seconds_of([&] { k::bias_gelu_forward(h2.data(), h.data(), bias.data(), N, 4 * C); }),
       L},
      {"gelu bwd", seconds_of([&] { k::gelu_backward(h2.data(), h.data(), N, 4 * C); }), L},
      {"classifier fwd+bwd",
       seconds_of(
           [&] { classifier.forward_backward(dx.data(), x.data(), batch, N, loss, 1.0f / N, nullptr); }, 1),
       1},
      {"embedding fwd", seconds_of([&] {
         k::embedding_forward(x.data(), tok.data(), nullptr, wte.data(), wte.data(), B, T, C);
       }),
       1},
      {"embedding bwd", seconds_of([&] {
         k::embedding_backward(dwte.data(), dw.data(), dx.data(), tok.data(), nullptr, B, T, C);
       }),
       1},
  };
  const size_t n_params = parameter_table(m).back().offset + parameter_table(m).back().numel;
  std::vector<float> pw(n_params, 0.01f), pg(n_params, 0.001f);
  OptimConfig oc;
  AdamW opt(oc, parameter_table(m), n_params);
  rows.push_back({"adamw + grad norm", seconds_of([&] {
                    clip_grad_norm(pg, 1.0);
                    opt.step(pw, pg, 1e-4);
                  }),
                  1});
  double sum = 0;
  std::printf("\nper-op profile (kernel timed alone at the step's shapes, x count per step):\n");
  std::printf("  %-26s %9s %6s %9s %6s\n", "op", "ms/call", "calls", "ms/step", "share");
  for (const auto& r : rows) sum += r.seconds * r.per_step;
  for (const auto& r : rows)
    std::printf("  %-26s %9.2f %6d %9.1f %5.1f%%\n", r.name, r.seconds * 1e3, r.per_step,
                r.seconds * r.per_step * 1e3, 100.0 * r.seconds * r.per_step / step_s);
  std::printf("  %-26s %9s %6s %9.1f %5.1f%%  (rest: zeroing, copies, thread hand-offs)\n", "sum of ops", "",
              "", sum * 1e3, 100.0 * sum / step_s);
}

// Tracing on against off, same process, same batches (best round of each); and the off path's cost: the
// number of trace points a step passes times the measured cost of one that is off.
void trace_overhead(ParallelTrainer& trainer, const std::vector<MicroBatch>& batches, int rounds) {
  constexpr int kSteps = 3;
  double off_s = 1e30, on_s = 1e30, write_s = 1e30;
  size_t events = 0;
  const std::string dir = "/tmp/forge-bench-trace-" + std::to_string(::getpid());
  for (int r = 0; r < rounds; ++r)
    for (const bool on : {false, true}) {
      if (on) Trace::start();
      double s = 0;
      for (int i = 0; i < kSteps; ++i) s += trainer.step(batches).seconds;
      (on ? on_s : off_s) = std::min(on ? on_s : off_s, s / kSteps);
      if (!on) continue;
      events = Trace::events() / kSteps;
      const auto t0 = std::chrono::steady_clock::now();
      Trace::stop_and_write(dir, 0, "bench");
      write_s =
          std::min(write_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  // One trace point that is off, as the step meets it: a load of the flag that the compiler cannot hoist.
  constexpr int kPoints = 100'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kPoints; ++i) {
    TraceSpan span("bench", "compute", i);
    asm volatile("" ::: "memory");
  }
  const double point_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kPoints;
  // And one that is on: a span's two events recorded.
  constexpr int kSpans = 100'000;
  Trace::start();
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSpans; ++i) TraceSpan span("bench", "compute", i);
  const double span_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() / kSpans;
  Trace::stop_and_write(dir, 0, "bench");
  std::filesystem::remove_all(dir);
  // Each span is two events when on; each trace point off costs one check.
  const double off_cost = double(events) / 2 * point_s / off_s;
  std::printf("trace off: %zu trace points per step x %.2f ns = %.1e%% of the %.1f ms step (goal < 0.5%%)\n",
              events / 2, point_s * 1e9, 100 * off_cost, off_s * 1e3);
  std::printf(
      "trace on: step %.1f ms against %.1f ms off = %+.2f%% (goal < 5%%); %zu events per step x %.0f ns = "
      "%.1e%% of the step, written in %.2f ms per %d steps\n",
      on_s * 1e3, off_s * 1e3, 100 * (on_s / off_s - 1), events, span_s / 2 * 1e9,
      100 * double(events) * span_s / 2 / off_s, write_s * 1e3, kSteps);
}

}  // namespace

int main(int argc, char** argv) {
  TrainSpec s;
  // The model as [model] overrides: the GPT-2 bench size unless changed (--model.KEY=VALUE passes any key,
  // e.g. --model.family=llama --model.kv_heads=3).
  std::vector<std::string> model = {"--model.layers=6", "--model.d_model=384", "--model.heads=6",
                                    "--model.vocab=8192", "--model.seq_len=256"};
  s.batch = 8;
  s.threads = 2;
  int steps = 8;
  bool do_profile = true;
  int trace_rounds = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_trainer_cpu: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--threads")
      s.threads = next();
    else if (a == "--steps")
      steps = next();
    else if (a == "--layers")
      model.push_back("--model.layers=" + std::to_string(next()));
    else if (a == "--dmodel")
      model.push_back("--model.d_model=" + std::to_string(next()));
    else if (a == "--heads")
      model.push_back("--model.heads=" + std::to_string(next()));
    else if (a == "--vocab")
      model.push_back("--model.vocab=" + std::to_string(next()));
    else if (a == "--seq")
      model.push_back("--model.seq_len=" + std::to_string(next()));
    else if (a.starts_with("--model."))
      model.push_back(a);
    else if (a == "--batch")
      s.batch = next();
    else if (a == "--dtype" && i + 1 < argc)
      s.dtype = std::strcmp(argv[++i], "bf16") == 0 ? DType::kBF16 : DType::kF32;
    else if (a == "--no-profile")
      do_profile = false;
    else if (a == "--trace-rounds")
      trace_rounds = next();
    else {
      std::fprintf(stderr,
                   "bench_trainer_cpu: unknown option %s (see the usage comment in bench/trainer_cpu.cpp)\n",
                   a.c_str());
      return 64;
    }
  }
  s.model = model_spec(model);
  s.steps = steps;
  use_threads(s.threads);
  const double peak = measure_sgemm_gflops(2048, 3);

  // The one-process trainer: ParallelTrainer at layout 1,1,1.
  ProcessGroups groups = make_groups(self_comm(), s.layout);
  ParallelTrainer trainer(s, groups);
  std::mt19937 rng(0);
  std::vector<MicroBatch> batches(size_t(s.microbatches));
  std::vector<int32_t> window(size_t(s.model.seq_len) + 1);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    for (MicroBatch& b : batches) {
      b.resize(s.batch, s.model.seq_len);
      for (int r = 0; r < s.batch; ++r) {
        for (auto& t : window) t = int32_t(rng() % unsigned(s.model.vocab));
        b.set_window(r, window.data(), uint64_t(r), 0);
      }
    }
    times.push_back(trainer.step(batches).seconds);
  }
  std::vector<double> tail(times.begin() + std::min<size_t>(2, times.size() - 1), times.end());
  std::sort(tail.begin(), tail.end());
  const double step_s = tail[tail.size() / 2];
  const double tps = double(s.batch) * s.model.seq_len / step_s;
  const double fpt = flops_per_token(s.model);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const auto& params = trainer.model().params();
  const double n_all = double(params.back().offset + params.back().numel);
  // Analytic minimum: weights, grads, Adam m and v (4 x N floats) + what backward reads per token and
  // layer (residual in, ln1, qkv, attention out, residual mid, ln2, fc pre-activation and GELU output:
  // 16 C) + the final residual and lnf (2 C); LayerNorm statistics and lse are negligible.
  const double tokens_mb = double(s.batch) * s.model.seq_len;
  const double act = tokens_mb * (16.0 * s.model.layers + 2.0) * s.model.d_model * 4;
  const double analytic = 16.0 * n_all + act;
  std::printf("config: layers=%d d_model=%d heads=%d vocab=%d seq=%d batch=%d dtype=%s threads=%d\n",
              s.model.layers, s.model.d_model, s.model.heads, s.model.vocab, s.model.seq_len, s.batch,
              dtype_name(s.dtype).data(), s.threads);
  std::printf("sgemm_peak_gflops=%.1f\n", peak);
  std::printf("forge step_median_ms=%.0f tokens_per_s=%.0f model_gflops=%.1f mfu=%.1f%%\n", step_s * 1e3, tps,
              tps * fpt / 1e9, 100.0 * tps * fpt / (peak * 1e9));
  std::printf("peak_rss_mib=%.0f analytic_min_mib=%.0f (weights+grads+adam %.0f, activations %.0f)\n",
              double(ru.ru_maxrss) / 1024.0, analytic / 1048576.0, 16.0 * n_all / 1048576.0, act / 1048576.0);
  if (do_profile) profile(s.model, s.batch, step_s);
  if (trace_rounds > 0) trace_overhead(trainer, batches, trace_rounds);
  return 0;
}
