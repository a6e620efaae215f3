// Trainer CPU benchmark: our training step on a decoder config (default: the benchmark, a GPT-2
// block, 6 layers, d 384, 6 heads, vocab 8192, seq 256, batch 8, FP32, AdamW, 2 threads; any family through
// --model.KEY=VALUE, e.g. the Llama block of bench/trainer_cpu.sh), the sgemm peak on the same threads, MFU
// against it, a per-op profile of one step's kernels at the same shapes (the ops of the spec's norm,
// activation, positions and attention shape) with the share of the peak the matrix products reach, and peak
// RSS against the analytic minimum. bench/trainer_cpu.sh runs this and the PyTorch peers in one invocation.
//
// Usage: bench_trainer_cpu [--threads N] [--steps N] [--layers N] [--dmodel N] [--heads N] [--vocab N]
//                          [--seq N] [--model.KEY=VALUE ...] [--batch N] [--dtype fp32|bf16] [--no-profile]
//                          [--trace-rounds N]
// --trace-rounds N: what tracing (trace.h) costs, in N rounds alternating 3 steps untraced and 3 traced.
#include "cpu/kernels.h"
#include "forge/common/trace.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/runtime.h"
#include "timing.h"

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
using namespace forge::comm;
using forge::MicroBatch;
using forge::Trace;
using forge::TraceSpan;

namespace {

// Time of each kernel at the model's shapes, times its count per step; the ops follow the spec's slots (norm:
// LayerNorm or RMSNorm; activation: GELU or SwiGLU; positions: learned or rotary; the attention's q | k | v
// widths for grouped-query heads; biases where the spec has them). Returns nothing; prints the table and
// what the matrix products reach against the sgemm peak.
void profile(const ModelSpec& m, int B, double step_s, double peak_gflops) {
  namespace k = forge::trainer::cpu;
  const int T = m.seq_len, C = m.d_model, NH = m.heads, V = m.vocab, L = m.layers, N = B * T;
  const forge::trainer::AttentionShape shape = m.attention();
  const bool rms = m.norm == Norm::kRmsNorm, swiglu = m.activation == Activation::kSwiglu;
  const bool rotary = m.positions == Positions::kRotary;
  // Widths: the q | k | v product, the attention output, the FFN's hidden width and its first product.
  const int QKV = shape.qkv_width(), Q = shape.q_width(), H = m.ffn_hidden, F = swiglu ? 2 * H : H;
  const int W = std::max({QKV, Q, F, C});
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  const auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  auto x = fill(size_t(N) * C), y = fill(size_t(N) * C), dx = fill(size_t(N) * C);
  auto qkv = fill(size_t(N) * QKV), dqkv = fill(size_t(N) * QKV), att = fill(size_t(N) * Q);
  auto datt = fill(size_t(N) * Q), pre = fill(size_t(N) * F), dpre = fill(size_t(N) * F);
  auto act = fill(size_t(N) * H), dact = fill(size_t(N) * H);
  auto w = fill(size_t(W) * C), dw = fill(size_t(W) * C), wte = fill(size_t(V) * C);
  auto dwte = fill(size_t(V) * C), bias = fill(size_t(W)), stats = fill(size_t(2) * N);
  auto lse = fill(size_t(N) * NH), logits = fill(size_t(256) * V);
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = int32_t(rng() % unsigned(V));
  const RopeTable rope = rope_table(m.rope, m.head_dim);
  // Biases of the products as the spec has them (null: none).
  float* const qkv_bias = m.qkv_bias ? bias.data() : nullptr;
  float* const lin_bias = m.linear_bias ? bias.data() : nullptr;
  // The classifier (tied to the embedding or its own head) and its loss, as the model runs them (layers.h).
  ParamInfo head_info;
  head_info.name = m.tied_embeddings ? "wte.weight" : "head.weight";
  head_info.shape = head_info.local_shape = {V, C};
  Classifier classifier(cpu_backend(), {&head_info, wte.data(), dwte.data()}, 0);
  DeviceBatch batch;
  batch.targets = tok.data();
  const LmCrossEntropy loss;
  struct Row {
    std::string name;
    double seconds;
    int per_step;
    double flops = 0;  // per call, for the matrix products
  };
  std::vector<Row> rows;
  // One Linear layer, forward and backward (input gradient, weight gradient, bias sum), at [N, in] -> out.
  // The forward adds only the q | k | v bias: the output biases of attn.proj and of the FFN's second product
  // join the residual add, and GPT-2's fc bias its GELU.
  const auto linear = [&](const std::string& name, float* in, float* out, float* din, float* dout, int cin,
                          int cout, float* b, bool forward_bias) {
    const double f = 2.0 * N * cin * cout;
    rows.push_back({"matmul fwd " + name, forge::bench::best_seconds([&] {
                      k::matmul_forward(out, in, w.data(), forward_bias ? b : nullptr, N, cin, cout);
                    }),
                    L, f});
    rows.push_back({"matmul bwd " + name, forge::bench::best_seconds([&] {
                      k::matmul_backward(din, dw.data(), b != nullptr ? dw.data() : nullptr, dout, in,
                                         w.data(), N, cin, cout);
                    }),
                    L, 2 * f});
  };
  linear(m.fused_qkv() ? "qkv" : "q|k|v", x.data(), qkv.data(), dx.data(), dqkv.data(), C, QKV, qkv_bias,
         true);
  linear("attn.proj", att.data(), y.data(), datt.data(), dx.data(), Q, C, lin_bias, false);
  linear(swiglu ? "mlp.gate_up" : "mlp.fc", x.data(), pre.data(), dx.data(), dpre.data(), C, F, lin_bias,
         false);
  linear(swiglu ? "mlp.down" : "mlp.proj", act.data(), y.data(), dact.data(), dx.data(), H, C, lin_bias,
         false);
  const size_t block_products = rows.size();
  const std::string heads = shape.kv_heads == shape.heads
                                ? std::string()
                                : " (GQA " + std::to_string(NH) + "/" + std::to_string(shape.kv_heads) + ")";
  rows.push_back({"attention fwd" + heads, forge::bench::best_seconds([&] {
                    k::attention_forward(att.data(), lse.data(), qkv.data(), nullptr, B, T, shape);
                  }),
                  L});
  rows.push_back({"attention bwd" + heads, forge::bench::best_seconds([&] {
                    k::attention_backward(dqkv.data(), datt.data(), qkv.data(), att.data(), lse.data(),
                                          nullptr, B, T, shape);
                  }),
                  L});
  if (rotary) {
    rows.push_back({"rope fwd", forge::bench::best_seconds([&] {
                      k::rope(qkv.data(), nullptr, rope.inv_freq.data(), rope.magnitude, N, T, shape, false);
                    }),
                    L});
    rows.push_back({"rope bwd", forge::bench::best_seconds([&] {
                      k::rope(dqkv.data(), nullptr, rope.inv_freq.data(), rope.magnitude, N, T, shape, true);
                    }),
                    L});
  }
  if (rms) {
    rows.push_back({"rmsnorm fwd", forge::bench::best_seconds([&] {
                      k::rmsnorm_forward(y.data(), stats.data(), x.data(), bias.data(), m.norm_eps, N, C);
                    }),
                    1});
    rows.push_back({"residual+rmsnorm fwd", forge::bench::best_seconds([&] {
                      k::residual_rmsnorm_forward(dx.data(), y.data(), stats.data(), x.data(), y.data(),
                                                  lin_bias, bias.data(), m.norm_eps, N, C);
                    }),
                    2 * L});
    rows.push_back({"rmsnorm bwd", forge::bench::best_seconds([&] {
                      k::rmsnorm_backward(dx.data(), dw.data(), y.data(), x.data(), bias.data(), stats.data(),
                                          N, C);
                    }),
                    2 * L + 1});
  } else {
    rows.push_back({"layernorm fwd", forge::bench::best_seconds([&] {
                      k::layernorm_forward(y.data(), stats.data(), stats.data() + N, x.data(), bias.data(),
                                           bias.data(), 1e-5f, N, C);
                    }),
                    1});
    rows.push_back({"residual+layernorm fwd", forge::bench::best_seconds([&] {
                      k::residual_layernorm_forward(dx.data(), y.data(), stats.data(), stats.data() + N,
                                                    x.data(), y.data(), lin_bias, bias.data(), bias.data(),
                                                    1e-5f, N, C);
                    }),
                    2 * L});
    rows.push_back({"layernorm bwd", forge::bench::best_seconds([&] {
                      k::layernorm_backward(dx.data(), dw.data(), dw.data() + C, y.data(), x.data(),
                                            bias.data(), stats.data(), stats.data() + N, N, C);
                    }),
                    2 * L + 1});
  }
  if (swiglu) {
    rows.push_back({"swiglu fwd",
                    forge::bench::best_seconds([&] { k::swiglu_forward(act.data(), pre.data(), N, H); }), L});
    rows.push_back({"swiglu bwd", forge::bench::best_seconds([&] {
                      k::swiglu_backward(dpre.data(), dact.data(), pre.data(), N, H);
                    }),
                    L});
  } else {
    rows.push_back({"bias+gelu fwd", forge::bench::best_seconds([&] {
                      k::bias_gelu_forward(act.data(), pre.data(), bias.data(), N, H);
                    }),
                    L});
    rows.push_back({"gelu bwd",
                    forge::bench::best_seconds([&] { k::gelu_backward(dpre.data(), pre.data(), N, H); }), L});
  }
  rows.push_back(
      {"classifier fwd+bwd",
       forge::bench::best_seconds(
           [&] { classifier.forward_backward(dx.data(), x.data(), batch, N, loss, 1.0f / N, nullptr); }, 1),
       1});
  const bool wpe = !rotary;  // the learned position table
  rows.push_back({"embedding fwd", forge::bench::best_seconds([&] {
                    k::embedding_forward(x.data(), tok.data(), nullptr, wte.data(),
                                         wpe ? wte.data() : nullptr, B, T, C);
                  }),
                  1});
  rows.push_back({"embedding bwd", forge::bench::best_seconds([&] {
                    k::embedding_backward(dwte.data(), wpe ? dw.data() : nullptr, dx.data(), tok.data(),
                                          nullptr, B, T, C);
                  }),
                  1});
  const size_t n_params = parameter_table(m).back().offset + parameter_table(m).back().numel;
  std::vector<float> pw(n_params, 0.01f), pg(n_params, 0.001f);
  OptimConfig oc;
  AdamW opt(oc, parameter_table(m), n_params);
  rows.push_back({"adamw + grad norm", forge::bench::best_seconds([&] {
                    clip_grad_norm(pg, 1.0);
                    opt.step(pw, pg, 1e-4);
                  }),
                  1});
  double sum = 0;
  std::printf("\nper-op profile (kernel timed alone at the step's shapes, x count per step):\n");
  std::printf("  %-26s %9s %6s %9s %6s\n", "op", "ms/call", "calls", "ms/step", "share");
  for (const auto& r : rows) sum += r.seconds * r.per_step;
  for (const auto& r : rows)
    std::printf("  %-26s %9.2f %6d %9.1f %5.1f%%\n", r.name.c_str(), r.seconds * 1e3, r.per_step,
                r.seconds * r.per_step * 1e3, 100.0 * r.seconds * r.per_step / step_s);
  std::printf("  %-26s %9s %6s %9.1f %5.1f%%  (rest: zeroing, copies, thread hand-offs)\n", "sum of ops", "",
              "", sum * 1e3, 100.0 * sum / step_s);

  // The matrix products against the sgemm peak: the blocks' Linear layers (forward and backward, timed
  // above), and the classifier's three products alone (its chunks of 256 rows x vocab, as layers.cpp runs
  // them, without the cross-entropy between them).
  double block_f = 0, block_s = 0;
  for (size_t i = 0; i < block_products; ++i) {
    block_f += rows[i].flops * rows[i].per_step;
    block_s += rows[i].seconds * rows[i].per_step;
  }
  const int chunk = std::min(N, 256), chunks = (N + chunk - 1) / chunk;
  const double cls_s =
      chunks * (forge::bench::best_seconds(
                    [&] { k::matmul_forward(logits.data(), x.data(), wte.data(), nullptr, chunk, C, V); }) +
                forge::bench::best_seconds([&] {
                  k::matmul_backward(dx.data(), dwte.data(), nullptr, logits.data(), x.data(), wte.data(),
                                     chunk, C, V);
                }));
  const double cls_f = 6.0 * N * C * V;
  const auto gf = [](double f, double s) { return f / s / 1e9; };
  // The peak once more, next to the products: on a shared machine one measurement may be disturbed, and
  // the products are put against the higher of the two (the conservative share).
  const double peak_again = measure_sgemm_gflops(2048, 3);
  std::printf("sgemm peak again: %.1f GFLOP/s (at start %.1f); products against %.1f\n", peak_again,
              peak_gflops, std::max(peak_again, peak_gflops));
  peak_gflops = std::max(peak_again, peak_gflops);
  std::printf(
      "products: blocks %.1f GFLOP/s (%.1f%% of peak, %.0f ms/step), classifier %.1f GFLOP/s (%.1f%%, %.0f "
      "ms/step), all %.1f GFLOP/s\n",
      gf(block_f, block_s), 100.0 * gf(block_f, block_s) / peak_gflops, block_s * 1e3, gf(cls_f, cls_s),
      100.0 * gf(cls_f, cls_s) / peak_gflops, cls_s * 1e3, gf(block_f + cls_f, block_s + cls_s));
  std::printf("products_of_peak=%.1f%% (all matrix products, timed alone: %.0f ms of the %.0f ms step)\n",
              100.0 * gf(block_f + cls_f, block_s + cls_s) / peak_gflops, (block_s + cls_s) * 1e3,
              step_s * 1e3);
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
  // A key given again replaces the earlier value (the config reader rejects a key given twice).
  const auto set_model = [&model](const std::string& arg) {
    const std::string key = arg.substr(0, arg.find('=') + 1);
    std::erase_if(model, [&](const std::string& m) { return m.starts_with(key); });
    model.push_back(arg);
  };
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
      set_model("--model.layers=" + std::to_string(next()));
    else if (a == "--dmodel")
      set_model("--model.d_model=" + std::to_string(next()));
    else if (a == "--heads")
      set_model("--model.heads=" + std::to_string(next()));
    else if (a == "--vocab")
      set_model("--model.vocab=" + std::to_string(next()));
    else if (a == "--seq")
      set_model("--model.seq_len=" + std::to_string(next()));
    else if (a.starts_with("--model."))
      set_model(a);
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
  const ModelSpec& mo = s.model;
  const double fpt = flops_per_token(mo);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const auto& params = trainer.model().params();
  const double n_all = double(params.back().offset + params.back().numel);
  // Analytic minimum: weights, grads, Adam m and v (4 x N floats) + what backward reads per token and
  // layer (residual in, norm 1, q | k | v, attention out, residual mid, norm 2, the FFN's first product and
  // its activation: 16 C for GPT-2) + the final residual and norm (2 C); norm statistics and lse are
  // negligible.
  const AttentionShape ash = mo.attention();
  const double ffn_in = mo.activation == Activation::kSwiglu ? 2.0 * mo.ffn_hidden : mo.ffn_hidden;
  const double per_layer = 4.0 * mo.d_model + ash.qkv_width() + ash.q_width() + ffn_in + mo.ffn_hidden;
  const double tokens_mb = double(s.batch) * mo.seq_len;
  const double act = tokens_mb * (per_layer * mo.layers + 2.0 * mo.d_model) * 4;
  const double analytic = 16.0 * n_all + act;
  std::printf(
      "config: family=%s layers=%d d_model=%d heads=%d kv_heads=%d head_dim=%d ffn_hidden=%d vocab=%d seq=%d "
      "batch=%d dtype=%s threads=%d params=%.2fM\n",
      family_name(mo.family).data(), mo.layers, mo.d_model, mo.heads, mo.kv_heads, mo.head_dim, mo.ffn_hidden,
      mo.vocab, mo.seq_len, s.batch, dtype_name(s.dtype).data(), s.threads, n_all / 1e6);
  std::printf("sgemm_peak_gflops=%.1f\n", peak);
  std::printf("forge step_median_ms=%.0f tokens_per_s=%.0f model_gflops=%.1f mfu=%.1f%%\n", step_s * 1e3, tps,
              tps * fpt / 1e9, 100.0 * tps * fpt / (peak * 1e9));
  std::printf("peak_rss_mib=%.0f analytic_min_mib=%.0f (weights+grads+adam %.0f, activations %.0f)\n",
              double(ru.ru_maxrss) / 1024.0, analytic / 1048576.0, 16.0 * n_all / 1048576.0, act / 1048576.0);
  if (do_profile && mo.ffn == Ffn::kMoe) {
    std::printf("(no per-op profile: it covers the dense FFN; bench/moe.sh measures MoE models)\n");
    do_profile = false;
  }
  if (do_profile) profile(s.model, s.batch, step_s, peak);
  if (trace_rounds > 0) trace_overhead(trainer, batches, trace_rounds);
  return 0;
}
