// Decoding benchmark: greedy generation on the trainer benchmark's model (configs/bench-cpu.ini: 6 layers,
// d_model 384, 6 heads, vocab 8192, 256 positions, FP32, random weights) with the key/value cache
// (GPT::decode one token a step) against recomputing the whole prefix every step (GPT::decode from
// position 0 of the cache over the prefix, the logits of its last row: the same kernels without the
// cache), from a 1-token and from a 64-token prompt up to the last position; both must produce the same
// tokens. Also forge::gate::Generator at batch 1 and batch 8 (and the batch of 8 recomputed), and the
// machine's memory read bandwidth measured in the same process on the same threads: batch-1 decoding
// reads every weight once per token, so weight bytes x tokens/s against it is how close decoding is to
// its limit. Then (issue 39) a Llama-family model with multi-head against the same with grouped-query
// attention (kv_heads = heads / 4), decoding --batch sequences from a long prompt (gqa_bench below).
// bench/decode.sh runs this and the PyTorch peer in one invocation.
//
// Usage: bench_decode [--threads N] [--reps N] [--long-prompt N] [--batch N] [--seed N] [--bw-mib N]
//                     [--no-generator] [--no-profile] [--no-gqa | --gqa-only] [--gqa-prompt N] [--gqa-new N]
// --reps: repetitions of the cached runs, the Generator runs, the GQA decodes and the bandwidth passes (the
// best is kept; the recompute runs, ~30x longer, are run min(reps, 2) times). --gqa-only: the bandwidth
// and the GQA comparison alone; --gqa-prompt / --gqa-new: its prompt length (1024) and new tokens per
// sequence (128), within its 2048 positions. Prints key=value lines the script summarises; exits 1 if the
// cached and the recomputed tokens differ (or a GQA model's reps do).
#include "cpu/kernels.h"
#include "forge/common/batch.h"
#include "forge/common/huge_buffer.h"
#include "forge/eval_gate/generate.h"
#include "forge/trainer/model.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/spec.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace forge::trainer;
using forge::gate::GenerationStats;
using forge::gate::Generator;
using forge::gate::Request;
using forge::gate::Sampling;

namespace {

using Clock = std::chrono::steady_clock;

volatile double g_sink = 0;  // what the bandwidth passes summed, so their reads cannot be dropped

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int32_t argmax(std::span<const float> logits) {  // greedy: the lowest id among equals (pick_token's rule)
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct Run {
  std::vector<int32_t> tokens;  // the new tokens
  double seconds = 0;           // all of it, prefill included
  double prefill_s = 0;         // the first call (the prompt's rows; its logits give the first new token)
  std::vector<double> step_s;   // each call after the first (one row: the previous token)
};

// Greedy with the cache: the prompt in one call, then one row a step.
Run run_cached(GPT& model, KvCache& cache, const std::vector<int32_t>& prompt, int n_new) {
  const int V = model.config().vocab, P = int(prompt.size());
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<DecodeRow> rows;
  Run run;
  run.tokens.reserve(size_t(n_new));
  run.step_s.reserve(size_t(n_new));
  const auto t0 = Clock::now();
  for (int i = 0; i < P; ++i) rows.push_back({0, i, prompt[size_t(i)]});
  const int last = P - 1;
  model.decode(cache, rows, std::span<const int>(&last, 1), logits);
  run.tokens.push_back(argmax(logits));
  run.prefill_s = since(t0);
  for (int pos = P; int(run.tokens.size()) < n_new; ++pos) {
    const auto t1 = Clock::now();
    const DecodeRow row{0, pos, run.tokens.back()};
    const int zero = 0;
    model.decode(cache, std::span<const DecodeRow>(&row, 1), std::span<const int>(&zero, 1), logits);
    run.tokens.push_back(argmax(logits));
    run.step_s.push_back(since(t1));
  }
  run.seconds = since(t0);
  return run;
}

// Greedy without the cache: every step runs the whole prefix from position 0 (the cache is only the
// call's scratch for keys and values) and keeps the logits of its last row, or of every row with
// `all_logits` (what a model without a cache API hands back).
Run run_recompute(GPT& model, KvCache& cache, const std::vector<int32_t>& prompt, int n_new,
                  bool all_logits) {
  const int V = model.config().vocab;
  std::vector<int32_t> seq = prompt;
  std::vector<float> logits;
  std::vector<DecodeRow> rows;
  std::vector<int> logit_rows;
  Run run;
  const auto t0 = Clock::now();
  for (int i = 0; i < n_new; ++i) {
    const auto t1 = Clock::now();
    const int L = int(seq.size());
    rows.clear();
    for (int p = 0; p < L; ++p) rows.push_back({0, p, seq[size_t(p)]});
    logit_rows.clear();
    for (int p = all_logits ? 0 : L - 1; p < L; ++p) logit_rows.push_back(p);
    logits.resize(logit_rows.size() * size_t(V));
    model.decode(cache, rows, logit_rows, logits);
    seq.push_back(argmax(std::span<const float>(logits).last(size_t(V))));
    if (i == 0) run.prefill_s = since(t1);
  }
  run.seconds = since(t0);
  run.tokens.assign(seq.begin() + ptrdiff_t(prompt.size()), seq.end());
  return run;
}

// The same without the cache for `prompts.size()` sequences at once, as a batched generator without a
// cache would run: each step one call over every sequence's whole prefix (each in its own slot), keeping
// each prefix's last logits. Returns sequence 0's tokens.
Run run_recompute_batch(GPT& model, KvCache& cache, const std::vector<std::vector<int32_t>>& prompts,
                        int n_new) {
  const int V = model.config().vocab, B = int(prompts.size());
  std::vector<std::vector<int32_t>> seqs = prompts;
  std::vector<float> logits(size_t(B) * size_t(V));
  std::vector<DecodeRow> rows;
  std::vector<int> last(static_cast<size_t>(B));
  Run run;
  const auto t0 = Clock::now();
  for (int i = 0; i < n_new; ++i) {
    rows.clear();
    for (int b = 0; b < B; ++b) {
      for (size_t p = 0; p < seqs[size_t(b)].size(); ++p) rows.push_back({b, int32_t(p), seqs[size_t(b)][p]});
      last[size_t(b)] = int(rows.size()) - 1;
    }
    model.decode(cache, rows, last, logits);
    for (int b = 0; b < B; ++b)
      seqs[size_t(b)].push_back(argmax(std::span<const float>(logits).subspan(size_t(b) * V, size_t(V))));
  }
  run.seconds = since(t0);
  run.tokens.assign(seqs[0].begin() + ptrdiff_t(prompts[0].size()), seqs[0].end());
  return run;
}

Run best_of(int reps, const std::function<Run()>& f) {
  Run best = f();
  for (int r = 1; r < reps; ++r) {
    Run next = f();
    if (next.seconds < best.seconds) best = std::move(next);
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Read bandwidth: `threads` threads each summing its share of `buf` (best of `reps` passes after a
// warm-up pass), in bytes/s.
double read_bandwidth(const float* buf, size_t n, int threads, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    std::vector<double> part(static_cast<size_t>(threads));
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t per = (n / size_t(threads) + 15) / 16 * 16;
        const size_t b = std::min(n, size_t(t) * per), e = std::min(n, b + per);
        float acc[16] = {};
        size_t i = b;
        for (; i + 16 <= e; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += buf[i + size_t(j)];
        for (; i < e; ++i) acc[0] += buf[i];
        double s = 0;
        for (float a : acc) s += a;
        part[size_t(t)] = s;
      });
    for (auto& th : pool) th.join();
    const double s = since(t0);
    for (double p : part) g_sink = g_sink + p;
    if (r > 0) best = std::min(best, s);
  }
  return double(n) * sizeof(float) / best;
}

// STREAM triad a = b + s c over three arrays, counted as STREAM counts it (3 x 4 bytes per element).
double triad_bandwidth(float* a, const float* b, const float* c, size_t n, int threads, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t per = (n / size_t(threads) + 15) / 16 * 16;
        const size_t lo = std::min(n, size_t(t) * per), hi = std::min(n, lo + per);
        for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
      });
    for (auto& th : pool) th.join();
    const double s = since(t0);
    if (r > 0) best = std::min(best, s);
  }
  return 3.0 * double(n) * sizeof(float) / best;
}

void fill(float* p, size_t n, int threads) {  // first touch on the threads that read it
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      const size_t per = (n + size_t(threads) - 1) / size_t(threads);
      for (size_t i = size_t(t) * per; i < std::min(n, size_t(t + 1) * per); ++i)
        p[i] = float(i & 1023) * 1e-3f;
    });
  for (auto& th : pool) th.join();
}

std::vector<int32_t> prompt_of(int n, int vocab, uint64_t salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1);
  for (auto& t : p) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    t = int32_t(x % uint64_t(vocab));
  }
  return p;
}

// One decoding step's matrix products at batch 1, replayed over the model's own weights in the model's
// order (so they stream the same ~55 MB a real step reads), timed per product through the kernel decode
// uses (cpu::matmul_forward: one row goes to sgemv over each thread's output rows); and the attention over
// a cache at position T / 2. What is left of the measured step is the rest of the step.
void profile_step(GPT& model, double step_s, int steps) {
  namespace k = forge::trainer::cpu;
  const ModelSpec& m = model.config();
  const int C = m.d_model, V = m.vocab, L = m.layers, NH = m.heads, T = m.max_positions;
  struct Op {
    const char* name;
    int in, out;  // C and OC of the product
    std::string weight, bias;
  };
  std::vector<Op> ops;
  for (int l = 0; l < L; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    ops.push_back({"qkv", C, 3 * C, b + "attn.qkv.weight", b + "attn.qkv.bias"});
    ops.push_back({"attn.proj", C, C, b + "attn.proj.weight", b + "attn.proj.bias"});
    ops.push_back({"mlp.fc", C, 4 * C, b + "mlp.fc.weight", b + "mlp.fc.bias"});
    ops.push_back({"mlp.proj", 4 * C, C, b + "mlp.proj.weight", b + "mlp.proj.bias"});
  }
  ops.push_back({"classifier", C, V, "wte.weight", ""});
  std::vector<float> x(static_cast<size_t>(4 * C), 0.01f), y(static_cast<size_t>(V));
  const char* names[] = {"qkv", "attn.proj", "mlp.fc", "mlp.proj", "classifier"};
  double best[5];
  std::fill_n(best, 5, 1e30);
  for (int rep = 0; rep <= steps; ++rep) {  // rep 0 warms up
    double sum[5] = {};
    for (const Op& op : ops) {
      const float* w = model.weight(op.weight).data();
      const float* bias = op.bias.empty() ? nullptr : model.weight(op.bias).data();
      const auto t0 = Clock::now();
      k::matmul_forward(y.data(), x.data(), w, bias, 1, op.in, op.out);
      const int i = int(
          std::find_if(names, names + 5, [&](const char* n) { return std::string(n) == op.name; }) - names);
      sum[i] += since(t0);
    }
    if (rep > 0)
      for (int i = 0; i < 5; ++i) best[i] = std::min(best[i], sum[i]);
  }
  // Attention of one row at position T / 2 over a cache of T positions, once per layer.
  std::vector<float> kc(static_cast<size_t>(T) * C * L, 0.01f), vc(kc.size(), 0.01f),
      qkv(static_cast<size_t>(3 * C), 0.02f), att(static_cast<size_t>(C));
  const int32_t seq0 = 0, pos = T / 2;
  double best_att = 1e30;
  for (int rep = 0; rep <= steps; ++rep) {
    const auto t0 = Clock::now();
    for (int l = 0; l < L; ++l)
      k::attention_decode(att.data(), qkv.data(), kc.data() + size_t(l) * T * C,
                          vc.data() + size_t(l) * T * C, &seq0, &pos, 1, T, {NH, NH, C / NH, 0});
    if (rep > 0) best_att = std::min(best_att, since(t0));
  }
  double total = 0, bytes_total = 0;
  std::printf(
      "\nper-step profile at batch 1 (best of %d replays over the model's weights; attention at "
      "position %d):\n",
      steps, pos);
  std::printf("  %-12s %10s %12s %9s\n", "op", "weight MB", "ms", "GB/s");
  for (int i = 0; i < 5; ++i) {
    double bytes = 0;
    for (const Op& op : ops)
      if (std::string(op.name) == names[i]) bytes += double(op.in) * op.out * sizeof(float);
    bytes_total += bytes;
    total += best[i];
    std::printf("  %-12s %10.1f %12.3f %9.1f\n", names[i], bytes / 1e6, best[i] * 1e3, bytes / best[i] / 1e9);
  }
  std::printf("  %-12s %10.1f %12.3f %9.1f\n", "products", bytes_total / 1e6, total * 1e3,
              bytes_total / total / 1e9);
  std::printf("  %-12s %10s %12.3f\n", "attention", "", best_att * 1e3);
  std::printf(
      "  %-12s %10s %12.3f   (measured median step; the rest: LayerNorms, GELU, residuals, "
      "embedding, hand-offs)\n",
      "step", "", step_s * 1e3);
  std::printf("profile products_ms=%.3f attention_ms=%.3f step_ms=%.3f\n", total * 1e3, best_att * 1e3,
              step_s * 1e3);
}

// ---- Grouped-query decoding (issue 39): the same-width Llama-family model with multi-head attention
// (kv_heads = heads) and with grouped-query attention (kv_heads = heads / 4), `batch` sequences decoded
// together: a prompt per sequence (prefilled, one call each), then one token per sequence a step (one
// call over the batch's rows), greedy.
//
// Why this shape (4 layers, d_model 512, 8 heads of 64, vocab 8192, untied head, a 2048-position
// context, batch 8, decoding positions 1024-1151): at batch 8 the weights are read once a step for the
// 8 rows, but every sequence reads its own keys and values, 2 x layers x positions x kv_heads x head_dim
// floats. At ~1088 positions that is 142 MB a step for the multi-head model against 68 MB of weights:
// the step streams the KV cache, which is what grouped-query attention shrinks (to 36 MB; weights 62 MB,
// the k and v products being 4x narrower). The GPT-2 comparison above (256 positions, batch 1: 2.4 MB of
// keys and values against 55 MB of weights) is weight-bound, where GQA would change almost nothing. Each
// rep re-decodes the same positions from the same prefilled prompt (decoding overwrites a position before
// any row reads it), so the reps are the same computation; MHA and GQA alternate, the best of each kept.
struct GqaShape {
  int layers = 4, d_model = 512, heads = 8, vocab = 8192, context = 2048, prompt = 1024, new_tokens = 128;
};

ModelSpec gqa_spec(const GqaShape& g, int kv_heads) {
  const auto kv = [](const char* key, int v) {
    return std::string("--model.") + key + "=" + std::to_string(v);
  };
  return model_spec({"--model.family=llama", kv("layers", g.layers), kv("d_model", g.d_model),
                     kv("heads", g.heads), kv("kv_heads", kv_heads), kv("vocab", g.vocab),
                     kv("seq_len", g.context)});
}

struct GqaModel {
  const char* name = "";
  std::unique_ptr<GPT> model;  // batch 1 x context rows: a whole prompt in one call
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> first;    // each sequence's token from its prompt's logits
  std::vector<int32_t> tokens0;  // sequence 0's new tokens (of the last rep)
  double prefill_s = 0, decode_s = 1e30, step_s_median = 0;
  double weight_bytes = 0, kv_read_bytes = 0;  // read per decoding step (mean over the steps)
  bool reps_agree = true;
};

void gqa_prefill(GqaModel& m, const std::vector<std::vector<int32_t>>& prompts) {
  const int V = m.model->config().vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<DecodeRow> rows;
  m.first.clear();
  const auto t0 = Clock::now();
  for (int b = 0; b < int(prompts.size()); ++b) {
    rows.clear();
    for (int i = 0; i < int(prompts[size_t(b)].size()); ++i)
      rows.push_back({b, i, prompts[size_t(b)][size_t(i)]});
    const int last = int(rows.size()) - 1;
    m.model->decode(*m.cache, rows, std::span<const int>(&last, 1), logits);
    m.first.push_back(argmax(logits));
  }
  m.prefill_s = since(t0);
}

// new_tokens - 1 steps of one row per sequence from position `prompt` (the first new token came from the
// prefill); keeps the best time.
void gqa_decode(GqaModel& m, int prompt, int new_tokens) {
  const int V = m.model->config().vocab, B = int(m.first.size());
  std::vector<float> logits(size_t(B) * size_t(V));
  std::vector<DecodeRow> rows(static_cast<size_t>(B));
  std::vector<int> all(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) all[size_t(b)] = b;
  std::vector<int32_t> last = m.first, seq0{m.first[0]};
  std::vector<double> step_s;
  const auto t0 = Clock::now();
  for (int pos = prompt; pos < prompt + new_tokens - 1; ++pos) {
    const auto t1 = Clock::now();
    for (int b = 0; b < B; ++b) rows[size_t(b)] = {b, pos, last[size_t(b)]};
    m.model->decode(*m.cache, rows, all, logits);
    for (int b = 0; b < B; ++b)
      last[size_t(b)] = argmax(std::span<const float>(logits).subspan(size_t(b) * V, size_t(V)));
    seq0.push_back(last[0]);
    step_s.push_back(since(t1));
  }
  const double s = since(t0);
  if (!m.tokens0.empty() && m.tokens0 != seq0) m.reps_agree = false;
  m.tokens0 = seq0;
  if (s < m.decode_s) {
    m.decode_s = s;
    m.step_s_median = median(step_s);
  }
}

// One batch-`B` step's parts, timed alone as profile_step does: every product of the blocks and the head
// with B rows over the model's own weights (in order), and attention_decode of B rows at position `pos`
// over caches of the model's shape (one per layer, so they stream as the real ones do). Milliseconds.
struct GqaOps {
  double qkv = 0, proj = 0, ffn = 0, head = 0, attention = 0;
  double products() const { return qkv + proj + ffn + head; }
};

GqaOps gqa_profile(GPT& model, int B, int pos, int max_len, int steps) {
  namespace k = forge::trainer::cpu;
  const ModelSpec& m = model.config();
  GqaOps best{1e30, 1e30, 1e30, 1e30, 1e30};
  std::vector<float> x(static_cast<size_t>(B) * 4 * std::max(m.ffn_hidden, m.d_model), 0.01f),
      y(static_cast<size_t>(B) * std::max(m.vocab, 2 * m.ffn_hidden));
  for (int rep = 0; rep <= steps; ++rep) {  // rep 0 warms up
    GqaOps t;
    for (const ParamInfo& p : model.params()) {
      if (p.shape.size() != 2 || p.name == "wte.weight") continue;  // norms, biases; the lookup
      const int out = int(p.shape[0]), in = int(p.shape[1]);
      const auto t0 = Clock::now();
      k::matmul_forward(y.data(), x.data(), model.weight(p.name).data(), nullptr, B, in, out);
      const double ms = since(t0) * 1e3;
      const auto has = [&](const char* s) { return p.name.find(s) != std::string::npos; };
      (has("attn.q.") || has("attn.k.") || has("attn.v.") ? t.qkv
       : has("attn.")                                     ? t.proj
       : has("head.")                                     ? t.head
                                                          : t.ffn) += ms;
    }
    if (rep > 0) {
      best.qkv = std::min(best.qkv, t.qkv);
      best.proj = std::min(best.proj, t.proj);
      best.ffn = std::min(best.ffn, t.ffn);
      best.head = std::min(best.head, t.head);
    }
  }
  const AttentionShape a = m.attention();
  const size_t per_layer = size_t(B) * size_t(max_len) * size_t(a.kv_width());
  std::vector<float> kc(per_layer * size_t(m.layers), 0.01f), vc(kc.size(), 0.01f),
      qkv(size_t(B) * size_t(a.qkv_width()), 0.02f), att(size_t(B) * size_t(a.q_width()));
  std::vector<int32_t> seq(static_cast<size_t>(B)), at(static_cast<size_t>(B), pos);
  for (int b = 0; b < B; ++b) seq[size_t(b)] = b;
  for (int rep = 0; rep <= steps; ++rep) {
    const auto t0 = Clock::now();
    for (int l = 0; l < m.layers; ++l)
      k::attention_decode(att.data(), qkv.data(), kc.data() + size_t(l) * per_layer,
                          vc.data() + size_t(l) * per_layer, seq.data(), at.data(), B, max_len, a);
    if (rep > 0) best.attention = std::min(best.attention, since(t0) * 1e3);
  }
  return best;
}

// Runs the comparison and prints its lines; dram_read (bytes/s, 0: not measured) puts the bytes a step
// reads against the machine's read bandwidth. Returns false when a model's reps disagreed.
bool gqa_bench(const GqaShape& g, int batch, int reps, uint64_t seed, double dram_read, bool profile) {
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < batch; ++b) prompts.push_back(prompt_of(g.prompt, g.vocab, 100 + uint64_t(b)));
  GqaModel models[2];
  for (int i = 0; i < 2; ++i) {
    GqaModel& m = models[i];
    m.name = i == 0 ? "mha" : "gqa";
    const ModelSpec cfg = gqa_spec(g, i == 0 ? g.heads : g.heads / 4);
    m.model = std::make_unique<GPT>(cfg, ModelSetup{});
    m.model->init(seed);
    m.cache = std::make_unique<KvCache>(*m.model, batch, g.context);
    size_t numel = 0, all = 0;
    for (const ParamInfo& p : m.model->params()) {
      all += p.numel;
      if (p.name != "wte.weight") numel += p.numel;  // decoding looks up B rows of the token embedding
    }
    m.weight_bytes = double(numel) * sizeof(float);
    const AttentionShape a = cfg.attention();
    for (int pos = g.prompt; pos < g.prompt + g.new_tokens - 1; ++pos)
      m.kv_read_bytes += 2.0 * cfg.layers * batch * (pos + 1) * a.kv_width() * sizeof(float);
    m.kv_read_bytes /= double(g.new_tokens - 1);
    std::printf(
        "gqa_config model=%s family=llama layers=%d d_model=%d heads=%d kv_heads=%d head_dim=%d "
        "ffn_hidden=%d vocab=%d context=%d batch=%d prompt=%d new_tokens=%d params=%.2fM "
        "kv_cache_bytes=%zu\n",
        m.name, cfg.layers, cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_hidden, cfg.vocab,
        g.context, batch, g.prompt, g.new_tokens, double(all) / 1e6, m.cache->bytes());
    gqa_prefill(m, prompts);
    gqa_decode(m, g.prompt, std::min(g.new_tokens, 9));  // warm-up
    m.decode_s = 1e30;
    m.tokens0.clear();
  }
  for (int r = 0; r < reps; ++r)
    for (GqaModel& m : models) gqa_decode(m, g.prompt, g.new_tokens);
  const int steps = g.new_tokens - 1;
  double tps[2];
  for (int i = 0; i < 2; ++i) {
    const GqaModel& m = models[i];
    tps[i] = double(batch) * steps / m.decode_s;
    const double bytes = m.weight_bytes + m.kv_read_bytes, gbs = bytes * steps / m.decode_s / 1e9;
    std::printf(
        "gqa_decode model=%s batch=%d steps=%d seconds=%.3f tokens_per_s=%.1f step_ms_median=%.3f "
        "prefill_s=%.2f weight_mb_per_step=%.1f kv_read_mb_per_step=%.1f achieved_gbs=%.2f",
        m.name, batch, steps, m.decode_s, tps[i], 1e3 * m.step_s_median, m.prefill_s, m.weight_bytes / 1e6,
        m.kv_read_bytes / 1e6, gbs);
    if (dram_read > 0) std::printf(" of_read_bandwidth=%.1f%%", 100 * gbs * 1e9 / dram_read);
    std::printf(" reps_agree=%s\n", m.reps_agree ? "yes" : "NO");
  }
  if (profile) {
    std::printf("\ngrouped-query step at batch %d, position %d (each part alone, best of 10; ms):\n", batch,
                g.prompt + g.new_tokens / 2);
    std::printf("  %-6s %9s %9s %9s %9s %9s %10s %9s\n", "model", "q,k,v", "attn.out", "ffn", "head",
                "products", "attention", "step");
    for (GqaModel& m : models) {
      const GqaOps o = gqa_profile(*m.model, batch, g.prompt + g.new_tokens / 2, g.context, 10);
      std::printf("  %-6s %9.3f %9.3f %9.3f %9.3f %9.3f %10.3f %9.3f\n", m.name, o.qkv, o.proj, o.ffn, o.head,
                  o.products(), o.attention, 1e3 * m.step_s_median);
      std::printf("gqa_profile model=%s products_ms=%.3f attention_ms=%.3f step_ms=%.3f\n", m.name,
                  o.products(), o.attention, 1e3 * m.step_s_median);
    }
  }
  const double kv_ratio = double(models[1].cache->bytes()) / double(models[0].cache->bytes());
  std::printf(
      "gqa_summary batch=%d mha_tokens_per_s=%.1f gqa_tokens_per_s=%.1f ratio=%.2f (goal >= 1.3) "
      "mha_kv_bytes=%zu gqa_kv_bytes=%zu kv_bytes_ratio=%.4f (goal 0.25)\n",
      batch, tps[0], tps[1], tps[1] / tps[0], models[0].cache->bytes(), models[1].cache->bytes(), kv_ratio);
  return models[0].reps_agree && models[1].reps_agree;
}

void print_run(const char* name, int prompt, const Run& r) {
  const double n = double(r.tokens.size());
  std::printf("%s prompt=%d new_tokens=%zu seconds=%.3f tokens_per_s=%.1f ms_per_token=%.3f prefill_ms=%.2f",
              name, prompt, r.tokens.size(), r.seconds, n / r.seconds, 1e3 * r.seconds / n,
              1e3 * r.prefill_s);
  if (!r.step_s.empty())
    std::printf(" step_ms_median=%.3f step_ms_first=%.3f step_ms_last=%.3f", 1e3 * median(r.step_s),
                1e3 * r.step_s.front(), 1e3 * r.step_s.back());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  ModelSpec cfg = gpt2_spec(6, 384, 6, 8192, 256, 256);
  int threads = 2, reps = 3, long_prompt = 64, batch = 8, bw_mib = 1024;
  uint64_t seed = 1234;
  bool generator = true, profile = true, gqa = true, gqa_only = false;
  GqaShape gqa_shape;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_decode: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--threads")
      threads = next();
    else if (a == "--reps")
      reps = next();
    else if (a == "--long-prompt")
      long_prompt = next();
    else if (a == "--batch")
      batch = next();
    else if (a == "--seed")
      seed = uint64_t(next());
    else if (a == "--bw-mib")
      bw_mib = next();
    else if (a == "--no-generator")
      generator = false;
    else if (a == "--no-profile")
      profile = false;
    else if (a == "--no-gqa")
      gqa = false;
    else if (a == "--gqa-only")
      gqa_only = true;
    else if (a == "--gqa-prompt")
      gqa_shape.prompt = next();
    else if (a == "--gqa-new")
      gqa_shape.new_tokens = next();
    else {
      std::fprintf(stderr, "bench_decode: unknown option %s (see the usage comment in bench/decode.cpp)\n",
                   a.c_str());
      return 64;
    }
  }
  if (threads < 1 || reps < 1 || long_prompt < 1 || long_prompt >= cfg.max_positions || batch < 1 ||
      bw_mib < 1 || gqa_shape.prompt < 1 || gqa_shape.new_tokens < 2 ||
      gqa_shape.prompt + gqa_shape.new_tokens > gqa_shape.context || (gqa_only && !gqa)) {
    std::fprintf(stderr, "bench_decode: an option out of range\n");
    return 64;
  }
  use_threads(threads);
  if (gqa_only) {  // the machine's read bandwidth (as below), then the comparison alone
    const size_t big = size_t(bw_mib) * 1048576 / sizeof(float);
    forge::HugeBuffer<float> a(big);
    fill(a.data(), big, threads);
    const double dram_read = read_bandwidth(a.data(), big, threads, reps);
    std::printf("config: threads=%d\nmachine: cpus=%ld\nbandwidth: read_%dmib_gbs=%.2f\n", threads,
                sysconf(_SC_NPROCESSORS_ONLN), bw_mib, dram_read / 1e9);
    return gqa_bench(gqa_shape, batch, reps, seed, dram_read, profile) ? 0 : 1;
  }
  const int T = cfg.max_positions, V = cfg.vocab;

  GPT model(cfg, {.batch = 1});  // rows() = 256: one call can run a whole 256-token prefix
  model.init(seed);
  KvCache cache(model, 1, T);
  size_t weight_numel = 0, all_numel = 0;
  for (const ParamInfo& p : model.params()) {
    all_numel += p.numel;
    if (p.name != "wpe.weight") weight_numel += p.numel;  // decoding reads one row of the positions
  }
  const double weight_bytes = double(weight_numel) * sizeof(float);
  std::printf(
      "config: layers=%d d_model=%d heads=%d vocab=%d positions=%d dtype=fp32 threads=%d params=%.2fM\n",
      cfg.layers, cfg.d_model, cfg.heads, V, T, threads, double(all_numel) / 1e6);
  std::printf("machine: cpus=%ld l3_reported_mib=%.0f\n", sysconf(_SC_NPROCESSORS_ONLN),
              double(sysconf(_SC_LEVEL3_CACHE_SIZE)) / 1048576.0);

  // Warm-up: fault the weights, activations and cache in.
  run_cached(model, cache, prompt_of(1, V, 0), 32);
  run_recompute(model, cache, prompt_of(128, V, 0), 2, false);

  bool same = true;
  double kv1_tps = 0, re1_tps = 0, kv_mean_kv_bytes = 0;
  std::vector<int32_t> kv1_tokens;
  double kv1_step_s = 0;
  for (const int P : {1, long_prompt}) {
    const std::vector<int32_t> prompt = prompt_of(P, V, 0);
    const int n_new = T - P;  // up to the last position
    const Run kv = best_of(reps, [&] { return run_cached(model, cache, prompt, n_new); });
    const Run re =
        best_of(std::min(reps, 2), [&] { return run_recompute(model, cache, prompt, n_new, false); });
    print_run("kv_cache", P, kv);
    print_run("recompute", P, re);
    const bool match = kv.tokens == re.tokens;
    size_t first_diff = 0;
    while (first_diff < kv.tokens.size() && first_diff < re.tokens.size() &&
           kv.tokens[first_diff] == re.tokens[first_diff])
      ++first_diff;
    std::printf("tokens prompt=%d: cached and recomputed sequences %s (%zu new tokens%s)\n", P,
                match ? "identical" : "DIFFER", kv.tokens.size(),
                match ? "" : (", first difference at new token " + std::to_string(first_diff)).c_str());
    same = same && match;
    std::printf("ratio prompt=%d kv_over_recompute=%.2f\n", P, re.seconds / kv.seconds);
    if (P == 1) {
      kv1_tps = double(kv.tokens.size()) / kv.seconds;
      kv1_tokens = kv.tokens;
      kv1_step_s = median(kv.step_s);
      re1_tps = double(re.tokens.size()) / re.seconds;
      // K and V bytes the attention reads per step, on average over the steps: 2 x layers x (pos + 1) x C.
      for (int pos = P; pos < T; ++pos) kv_mean_kv_bytes += 2.0 * cfg.layers * (pos + 1) * cfg.d_model * 4;
      kv_mean_kv_bytes /= double(T - P);
    }
  }
  {  // A training-shaped forward instead: all 256 positions and all their logits every step (its cost
     // does not depend on the step, so a few calls give its rate).
    forge::MicroBatch mb;
    mb.resize(1, T);
    const std::vector<int32_t> window = prompt_of(T + 1, V, 7);
    mb.set_window(0, window.data(), 0, 0);
    std::vector<float> all(static_cast<size_t>(T) * V);
    model.forward_logits(mb, all);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      model.forward_logits(mb, all);
      best = std::min(best, since(t0));
    }
    std::printf(
        "fixed_window_forward positions=%d ms_per_token=%.3f tokens_per_s=%.1f ratio_kv_over_it=%.2f\n", T,
        best * 1e3, 1.0 / best, kv1_tps * best);
  }
  {  // What a model without a cache API does: the logits of every row of the prefix, every step.
    const std::vector<int32_t> prompt = prompt_of(1, V, 0);
    const Run re = run_recompute(model, cache, prompt, T - 1, true);
    print_run("recompute_all_logits", 1, re);
    std::printf("ratio prompt=1 kv_over_recompute_all_logits=%.2f\n", re.seconds / (double(T - 1) / kv1_tps));
  }

  if (generator) {
    Sampling s;
    s.temperature = 0;
    s.max_new_tokens = T - 1;
    GenerationStats one{}, many{};
    std::vector<int32_t> first_of_one, first_of_many;
    const std::vector<Request> req{{prompt_of(1, V, 0), 0}};
    for (int r = 0; r < reps; ++r) {
      Generator gen(model, 1);
      const auto out = gen.run(req, s);
      if (r == 0 || gen.stats().seconds < one.seconds) one = gen.stats();
      first_of_one = out[0].tokens;
    }
    GPT model_b(cfg, {.batch = batch});  // rows() = batch x 256
    model_b.init(seed);
    std::vector<Request> reqs;
    for (int b = 0; b < batch; ++b) reqs.push_back({prompt_of(1, V, uint64_t(b)), uint64_t(b)});
    for (int r = 0; r < reps; ++r) {
      Generator gen(model_b, batch);
      const auto out = gen.run(reqs, s);
      if (r == 0 || gen.stats().seconds < many.seconds) many = gen.stats();
      first_of_many = out[0].tokens;
    }
    std::printf("generator batch=1 sequences=%lld new_tokens=%lld seconds=%.3f tokens_per_s=%.1f\n",
                (long long)one.sequences, (long long)one.new_tokens, one.seconds, one.tokens_per_second());
    std::printf(
        "generator batch=%d sequences=%lld new_tokens=%lld seconds=%.3f tokens_per_s=%.1f "
        "per_sequence_tokens_per_s=%.1f\n",
        batch, (long long)many.sequences, (long long)many.new_tokens, many.seconds, many.tokens_per_second(),
        many.tokens_per_second() / batch);
    std::printf("generator: batch-1 tokens %s the kv_cache run's; batch-%d sequence 0 %s batch 1's\n",
                first_of_one == kv1_tokens ? "equal" : "DIFFER from", batch,
                first_of_many == first_of_one ? "equals" : "DIFFERS from");
    // The batch without the cache (once: it is the long one), and the ratio at the gate's batch size.
    std::vector<std::vector<int32_t>> prompts;
    for (const Request& r : reqs) prompts.push_back(r.prompt);
    KvCache scratch(model_b, batch, T);
    const Run re = run_recompute_batch(model_b, scratch, prompts, T - 1);
    const double re_tps = double(batch) * double(T - 1) / re.seconds;
    std::printf(
        "recompute batch=%d new_tokens=%d seconds=%.3f tokens_per_s=%.1f sequence 0 %s the generator's\n",
        batch, batch * (T - 1), re.seconds, re_tps, re.tokens == first_of_many ? "equals" : "DIFFERS from");
    std::printf("ratio batch=%d kv_over_recompute=%.2f\n", batch, many.tokens_per_second() / re_tps);
    same = same && re.tokens == first_of_many;
  }

  // The machine's limit: read bandwidth over a buffer far larger than any cache, and over a buffer the
  // size of the weights (what decoding reads; a cache of that size would hold part of it), and a triad.
  const size_t big = size_t(bw_mib) * 1048576 / sizeof(float);
  double dram_read = 0, triad = 0;
  {
    forge::HugeBuffer<float> a(big);
    fill(a.data(), big, threads);
    dram_read = read_bandwidth(a.data(), big, threads, reps);
    const size_t third = big / 3;
    triad = triad_bandwidth(a.data(), a.data() + third, a.data() + 2 * third, third, threads, reps);
  }
  forge::HugeBuffer<float> w(weight_numel);
  fill(w.data(), weight_numel, threads);
  const double weights_read = read_bandwidth(w.data(), weight_numel, threads, reps * 4);
  std::printf("bandwidth: read_%dmib_gbs=%.2f triad_gbs=%.2f read_weight_sized_gbs=%.2f\n", bw_mib,
              dram_read / 1e9, triad / 1e9, weights_read / 1e9);
  const double bytes_per_token = weight_bytes + kv_mean_kv_bytes;
  const double achieved = bytes_per_token * kv1_tps;
  std::printf(
      "limit: weight_mb_per_token=%.1f kv_mb_per_token_mean=%.2f achieved_gbs=%.2f "
      "of_read_bandwidth=%.1f%% of_weight_sized_read=%.1f%% bound_tokens_per_s=%.1f\n",
      weight_bytes / 1e6, kv_mean_kv_bytes / 1e6, achieved / 1e9, 100 * achieved / dram_read,
      100 * achieved / weights_read, dram_read / bytes_per_token);
  if (profile) profile_step(model, kv1_step_s, 20);
  if (gqa) {
    std::printf("\n");
    same = gqa_bench(gqa_shape, batch, reps, seed, dram_read, profile) && same;
  }
  std::printf("summary kv_tokens_per_s=%.1f recompute_tokens_per_s=%.1f ratio=%.2f (goal >= 20)\n", kv1_tps,
              re1_tps, kv1_tps / re1_tps);
  if (!same) {
    std::fprintf(stderr, "bench_decode: the cached and the recomputed tokens differ\n");
    return 1;
  }
  return 0;
}
