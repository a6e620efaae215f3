// forge-cuda-check backend: the CUDA backend (forge/trainer/cuda/backend.h) against the CPU backend through
// the seam itself (forge/trainer/backend.h), op by op. Every op runs on both with the same random inputs of
// small sizes, mostly not multiples of 4 or 32 (the kernels' tails), including what the model passes
// only sometimes: position ids, a vocabulary range, document starts, kIgnore targets, loss weights, null
// optional pointers, a vocabulary group. Inputs reach the device with copy_from_host, outputs come back with
// copy_to_host, so the memory ops are exercised by every row too.
//
// Error: max |cuda - cpu| over an output, and that over max |cpu| (floored at 1e-6, so an output that is 0
// on the CPU is compared absolutely). Tolerances on the relative error: 1e-5 for element-wise ops (RMSNorm's
// and rotary positions' outputs among them), 1e-4 for ops that sum (matrix products, attention, softmax and
// loss sums, LayerNorm's and RMSNorm's gradients, embedding gradients summed by atomics), 1e-12 for the
// double sum of squares, exact bits for BF16 and the memory ops; 1e-2 (2e-2 for the attention's gradient)
// where the BF16 products round a gradient or probabilities, or an output is stored as BF16.
#include "check.h"
#include "forge/common/batch.h"
#include "forge/common/hash.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/cuda/backend.h"
#include "forge/trainer/rope.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer::cuda::check {

namespace {

constexpr double kExact = 0, kElementwise = 1e-5, kSums = 1e-4, kBf16 = 1e-2, kDouble = 1e-12;

using Floats = std::vector<float>;
using Halves = std::vector<uint16_t>;  // BF16 bit patterns
using Ints = std::vector<int32_t>;

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_++); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(double(next() >> 11) * 0x1.0p-53); }
  Floats floats(size_t n, float lo = -1.0f, float hi = 1.0f) {
    Floats v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  int32_t below(int32_t bound) { return int32_t(next() % uint64_t(bound)); }
  Ints ints(size_t n, int32_t bound) {
    Ints v(n);
    for (auto& x : v) x = below(bound);
    return v;
  }

 private:
  uint64_t state_;
};

struct Line {
  std::string op;
  double abs = 0, rel = 0, tol = 0;
  bool pass = false;
};

class Report {
 public:
  void floats(const std::string& op, std::span<const float> got, std::span<const float> want, double tol) {
    double diff = 0, scale = 0;
    bool finite = got.size() == want.size();
    for (size_t i = 0; finite && i < want.size(); ++i) {
      finite = std::isfinite(got[i]);
      diff = std::max(diff, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    add(op, finite ? diff : std::numeric_limits<double>::quiet_NaN(), scale, tol);
  }
  void number(const std::string& op, double got, double want, double tol) {
    add(op, std::isfinite(got) ? std::fabs(got - want) : std::numeric_limits<double>::quiet_NaN(),
        std::fabs(want), tol);
  }
  // Exact comparison of bit patterns; the error is the number of elements that differ.
  template <class T>
  void bits(const std::string& op, std::span<const T> got, std::span<const T> want) {
    size_t differ = got.size() == want.size() ? 0 : want.size() + 1;  // a size mismatch fails whatever
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      differ += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    lines_.push_back({op + " (bits differing)", double(differ), double(differ), kExact, differ == 0});
  }
  void flag(const std::string& op, bool ok) { lines_.push_back({op, ok ? 0.0 : 1.0, ok ? 0.0 : 1.0, 0, ok}); }
  void error(const std::string& op, const std::string& what) {
    fmt::print("{}: {}\n", op, what);
    lines_.push_back({op + " (error)", std::numeric_limits<double>::quiet_NaN(),
                      std::numeric_limits<double>::quiet_NaN(), 0, false});
  }

  bool print() const {
    fmt::print("\nThe CUDA backend against the CPU backend (max |cuda - cpu|, and over max |cpu|)\n");
    fmt::print("{:<58} {:>11} {:>11} {:>9}  {}\n", "op", "max abs err", "max rel err", "tolerance", "result");
    bool ok = !lines_.empty();
    for (const auto& l : lines_) {
      fmt::print("{:<58} {:>11.3e} {:>11.3e} {:>9.0e}  {}\n", l.op, l.abs, l.rel, l.tol,
                 l.pass ? "PASS" : "FAIL");
      ok = ok && l.pass;
    }
    std::fflush(stdout);
    return ok;
  }

 private:
  void add(const std::string& op, double diff, double scale, double tol) {
    const double rel = diff / std::max(scale, 1e-6);
    lines_.push_back({op, diff, rel, tol, std::isfinite(rel) && rel <= tol});
  }
  std::vector<Line> lines_;
};

// A VocabGroup stand-in: combines with a fixed "other rank" (a function of the index), and logs its calls
// so that both backends can be seen to call it alike.
class FakeGroup final : public VocabGroup {
 public:
  void max(float* values, int n) override {
    calls += fmt::format("max {};", n);
    for (int i = 0; i < n; ++i) values[i] = std::max(values[i], 0.25f * float(i % 5));
  }
  void sum(float* values, int n) override {
    calls += fmt::format("sum {};", n);
    for (int i = 0; i < n; ++i) values[i] += 0.5f + 0.125f * float(i % 7);
  }
  std::string calls;
};

// Documents of one batch row: starts at 0 and at `cuts` more random positions; doc_start[t] = the start of
// t's document.
Ints doc_starts(Rng& rng, int B, int T, int cuts) {
  Ints starts(size_t(B) * size_t(T));
  for (int b = 0; b < B; ++b) {
    std::vector<bool> cut(size_t(T), false);
    for (int c = 0; c < cuts; ++c) cut[size_t(1 + rng.below(T - 1))] = true;
    int start = 0;
    for (int t = 0; t < T; ++t) {
      if (cut[size_t(t)]) start = t;
      starts[size_t(b) * size_t(T) + size_t(t)] = start;
    }
  }
  return starts;
}

struct Checker {
  Backend& cpu;
  Backend& gpu;
  Rng& rng;
  Report& report;

  // A device copy of host data, and back.
  template <class T>
  Buffer<T> up(const std::vector<T>& host) {
    Buffer<T> b = gpu.alloc<T>(host.size());
    gpu.copy_from_host(b.data(), host.data(), host.size() * sizeof(T));
    return b;
  }
  template <class T>
  std::vector<T> down(const Buffer<T>& b) {
    std::vector<T> host(b.size());
    gpu.copy_to_host(host.data(), b.data(), b.size() * sizeof(T));
    return host;
  }
  // An optional argument: the data, or null.
  template <class T>
  static T* opt(std::vector<T>& v, bool on) {
    return on ? v.data() : nullptr;
  }
  template <class T>
  static const T* opt(const std::vector<T>& v, bool on) {
    return on ? v.data() : nullptr;
  }
  template <class T>
  static T* opt(Buffer<T>& b, bool on) {
    return on ? b.data() : nullptr;
  }
  void cmp(const std::string& op, const Buffer<float>& got, const Floats& want, double tol) {
    report.floats(op, down(got), want, tol);
  }

  void memory() {
    report.flag("name() is \"cuda\", host_memory() is false", gpu.name() == "cuda" && !gpu.host_memory());
    Buffer<float> a = gpu.alloc<float>(1001);
    report.bits<float>("allocate (zero-filled)", down(a), Floats(1001, 0.0f));
    const Floats x = rng.floats(1001);
    Buffer<float> b = up(x);
    report.bits<float>("copy_from_host, copy_to_host", down(b), x);
    Floats want = x;
    std::fill(want.begin() + 3, want.begin() + 998, 2.5f);
    gpu.fill(b.data() + 3, 2.5f, 995);
    report.bits<float>("fill", down(b), want);
    gpu.copy(a.data() + 1, b.data() + 500, 400 * sizeof(float));
    Floats want_a(1001, 0.0f);
    std::copy_n(want.begin() + 500, 400, want_a.begin() + 1);
    report.bits<float>("copy", down(a), want_a);
  }

  // ZeRO-2/3's release and acquire (mapped_memory.h) on 8 granules of FP32 values: a range that starts and
  // ends inside granules (4 wholly inside leave the device); one taken back before the device got to
  // unmap it; a working copy whose BF16 copy goes and comes back with it.
  void release() {
    const size_t unit = gpu.release_floats(), G = unit / 2;  // FP32 values in a granule
    report.flag("release_floats() is a 2 MiB granule of BF16 values", unit == kDeviceReleaseFloats);
    const size_t n = 8 * G, granule_bytes = G * sizeof(float);
    const Floats x = rng.floats(n);
    Buffer<float> b = up(x);
    const size_t lo = G / 2 + 3, len = 5 * G;
    const size_t used = gpu.device_bytes_in_use();
    gpu.mark_step_start();
    gpu.release(b.data() + lo, len);
    gpu.step_seconds();  // waits for the device: what it released is unmapped
    report.flag("release: the 4 granules wholly inside leave the device",
                gpu.resident_bytes(b.data(), n) == (n - 4 * G) * sizeof(float) &&
                    used >= gpu.device_bytes_in_use() + 4 * granule_bytes);
    gpu.acquire(b.data() + lo, len);
    Floats want = x;
    std::fill(want.begin() + ptrdiff_t(lo), want.begin() + ptrdiff_t(lo + len), 0.0f);
    report.bits<float>("acquire: the released range reads zeros, the rest as it was", down(b), want);
    report.flag("acquire: mapped again", gpu.resident_bytes(b.data(), n) == n * sizeof(float));
    gpu.release(b.data(), n);
    gpu.acquire(b.data(), n);  // before the device got to it: the granules are kept, zeroed
    report.bits<float>("release, acquire at once: zeros", down(b), Floats(n, 0.0f));

    gpu.set_bf16_products(true);
    const int N = 16, C = 2048, OC = int(n) / C;
    const Floats w = bf16_values(n, -0.2f, 0.2f), in = bf16_values(size_t(N) * C, -1, 1);
    Buffer<float> work = up(w), plain = up(w), gin = up(in), out = gpu.alloc<float>(size_t(N) * OC),
                  want_out = gpu.alloc<float>(size_t(N) * OC);
    gpu.bf16_working_copy(work.data(), n);  // its BF16 copy: 4 granules
    const size_t before = gpu.device_bytes_in_use();
    gpu.mark_step_start();
    gpu.release(work.data() + 2 * G, 4 * G);  // FP32 granules 2-5, the BF16 copy's 1-2
    gpu.step_seconds();
    report.flag("release of a working copy: its BF16 copy's granules go too",
                before >= gpu.device_bytes_in_use() + 6 * granule_bytes);
    gpu.acquire(work.data() + 2 * G, 4 * G);
    gpu.copy_from_host(work.data() + 2 * G, w.data() + 2 * G, 4 * G * sizeof(float));
    gpu.bf16_working_copy(work.data() + 2 * G, 4 * G);
    gpu.matmul_forward(out.data(), gin.data(), work.data(), nullptr, N, C, OC);
    gpu.matmul_forward(want_out.data(), gin.data(), plain.data(), nullptr, N, C, OC);  // converted per call
    report.bits<float>("acquire of a working copy: the products read its BF16 copy again", down(out),
                       down(want_out));
    gpu.set_bf16_products(false);
  }

  // Vocabulary shard [5, 23) of 31 tokens; 11 position rows.
  void embedding(bool with_positions, bool with_wpe) {
    const int B = 3, T = 7, C = 37, vocab = 31, vb = 5, ve = 23, P = 11;
    const std::string tag = fmt::format(" (positions {}, wpe {})", with_positions ? "given" : "null",
                                        with_wpe ? "given" : "null");
    Ints tokens = rng.ints(size_t(B) * T, vocab), positions = rng.ints(tokens.size(), P);
    Floats wte = rng.floats(size_t(ve - vb) * C), wpe = rng.floats(size_t(P) * C);
    Floats out(size_t(B) * T * C, 7.0f);
    auto gt = up(tokens), gp = up(positions);
    auto gwte = up(wte), gwpe = up(wpe), gout = up(out);
    cpu.embedding_forward(out.data(), tokens.data(), opt(positions, with_positions), wte.data(),
                          opt(wpe, with_wpe), B, T, C, vb, ve);
    gpu.embedding_forward(gout.data(), gt.data(), opt(gp, with_positions), gwte.data(), opt(gwpe, with_wpe),
                          B, T, C, vb, ve);
    cmp("embedding_forward" + tag, gout, out, kElementwise);
    // Backward into gradients that start non-zero (+=).
    const Floats dout = rng.floats(out.size());
    Floats dwte = rng.floats(wte.size()), dwpe = rng.floats(wpe.size());
    auto gdout = up(dout), gdwte = up(dwte), gdwpe = up(dwpe);
    cpu.embedding_backward(dwte.data(), opt(dwpe, with_wpe), dout.data(), tokens.data(),
                           opt(positions, with_positions), B, T, C, vb, ve);
    gpu.embedding_backward(gdwte.data(), opt(gdwpe, with_wpe), gdout.data(), gt.data(),
                           opt(gp, with_positions), B, T, C, vb, ve);
    cmp("embedding_backward dwte" + tag, gdwte, dwte, kSums);
    cmp("embedding_backward dwpe" + tag, gdwpe, dwpe, kSums);
  }

  // C = 45: the scalar LayerNorm kernels; C = 48: the 4-wide backward.
  void layernorm(int C) {
    const int N = 29;
    const std::string tag = fmt::format(" (C {})", C);
    const Floats x = rng.floats(size_t(N) * C, -2, 2), w = rng.floats(size_t(C), 0.5f, 1.5f),
                 b = rng.floats(size_t(C));
    Floats out(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    auto gx = up(x), gw = up(w), gb = up(b), gout = up(out), gmean = up(mean), grstd = up(rstd);
    // An epsilon far from the 1e-5 both kernels once held as a constant: one that ignored it would differ.
    constexpr float eps = 0.25f;
    cpu.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), eps, N, C);
    gpu.layernorm_forward(gout.data(), gmean.data(), grstd.data(), gx.data(), gw.data(), gb.data(), eps, N,
                          C);
    cmp("layernorm_forward out" + tag, gout, out, kElementwise);
    cmp("layernorm_forward mean" + tag, gmean, mean, kElementwise);
    cmp("layernorm_forward rstd" + tag, grstd, rstd, kElementwise);
    // Backward from the CPU's statistics on both sides; din, dweight and dbias start non-zero (+=).
    const Floats dout = rng.floats(x.size());
    Floats din = rng.floats(x.size()), dw = rng.floats(size_t(C)), db = rng.floats(size_t(C));
    auto gdout = up(dout), gdin = up(din), gdw = up(dw), gdb = up(db), cmean = up(mean), crstd = up(rstd);
    auto gfrozen = up(din);
    cpu.layernorm_backward(din.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                           rstd.data(), N, C);
    gpu.layernorm_backward(gdin.data(), gdw.data(), gdb.data(), gdout.data(), gx.data(), gw.data(),
                           cmean.data(), crstd.data(), N, C);
    cmp("layernorm_backward din" + tag, gdin, din, kSums);
    cmp("layernorm_backward dweight" + tag, gdw, dw, kSums);
    cmp("layernorm_backward dbias" + tag, gdb, db, kSums);
    // A frozen norm (train.freeze): no weight gradients formed, din the same bits.
    gpu.layernorm_backward(gfrozen.data(), nullptr, nullptr, gdout.data(), gx.data(), gw.data(), cmean.data(),
                           crstd.data(), N, C);
    report.bits<float>("layernorm_backward din, weights frozen" + tag, down(gfrozen), down(gdin));
  }

  void residual() {
    const int N = 29, C = 45;
    const Floats r = rng.floats(size_t(N) * C), d = rng.floats(r.size()), db = rng.floats(size_t(C)),
                 w = rng.floats(size_t(C), 0.5f, 1.5f), b = rng.floats(size_t(C));
    Floats res(r.size()), ln(r.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    auto gr = up(r), gd = up(d), gdb = up(db), gw = up(w), gb = up(b);
    auto gres = up(res), gln = up(ln), gmean = up(mean), grstd = up(rstd);
    cpu.residual_layernorm_forward(res.data(), ln.data(), mean.data(), rstd.data(), r.data(), d.data(),
                                   db.data(), w.data(), b.data(), 0.25f, N, C);
    gpu.residual_layernorm_forward(gres.data(), gln.data(), gmean.data(), grstd.data(), gr.data(), gd.data(),
                                   gdb.data(), gw.data(), gb.data(), 0.25f, N, C);
    cmp("residual_layernorm_forward res_out", gres, res, kElementwise);
    cmp("residual_layernorm_forward ln_out", gln, ln, kElementwise);
    cmp("residual_layernorm_forward mean", gmean, mean, kElementwise);
    cmp("residual_layernorm_forward rstd", grstd, rstd, kElementwise);
    Floats res2(r.size());
    auto gres2 = up(res2);
    cpu.residual_forward(res2.data(), r.data(), d.data(), db.data(), N, C);
    gpu.residual_forward(gres2.data(), gr.data(), gd.data(), gdb.data(), N, C);
    cmp("residual_forward", gres2, res2, kElementwise);
    Floats out = rng.floats(r.size());
    auto gout = up(out);
    cpu.add_bias(out.data(), db.data(), N, C);
    gpu.add_bias(gout.data(), gdb.data(), N, C);
    cmp("add_bias", gout, out, kElementwise);
  }

  // N = 1 is the CPU's matrix-vector path. Without bias, the backward's din is null too.
  void matmul(int N, bool with_bias) {
    const int C = 45, OC = 27;
    const std::string tag = fmt::format(" (N {}, {})", N, with_bias ? "bias" : "bias and din null");
    const Floats x = rng.floats(size_t(N) * C), w = rng.floats(size_t(OC) * C, -0.2f, 0.2f),
                 b = rng.floats(size_t(OC));
    Floats out = rng.floats(size_t(N) * OC);  // garbage: the forward overwrites it
    auto gx = up(x), gw = up(w), gb = up(b), gout = up(out);
    cpu.matmul_forward(out.data(), x.data(), w.data(), opt(b, with_bias), N, C, OC);
    gpu.matmul_forward(gout.data(), gx.data(), gw.data(), opt(gb, with_bias), N, C, OC);
    cmp("matmul_forward" + tag, gout, out, kSums);
    // Backward: din overwritten (from garbage), dw and dbias += (from non-zero); without bias also din null.
    const Floats dout = rng.floats(out.size());
    Floats din = rng.floats(x.size()), dw = rng.floats(w.size()), db = rng.floats(b.size());
    auto gdout = up(dout), gdin = up(din), gdw = up(dw), gdb = up(db);
    cpu.matmul_backward(opt(din, with_bias), dw.data(), opt(db, with_bias), dout.data(), x.data(), w.data(),
                        N, C, OC);
    gpu.matmul_backward(opt(gdin, with_bias), gdw.data(), opt(gdb, with_bias), gdout.data(), gx.data(),
                        gw.data(), N, C, OC);
    cmp("matmul_backward din" + tag, gdin, din, kSums);
    cmp("matmul_backward dweight" + tag, gdw, dw, kSums);
    cmp("matmul_backward dbias" + tag, gdb, db, kSums);
    if (with_bias) {  // a frozen weight (train.freeze): din the same bits, the input not read
      auto gfrozen = up(Floats(x.size()));
      gpu.matmul_backward(gfrozen.data(), nullptr, nullptr, gdout.data(), static_cast<const float*>(nullptr),
                          gw.data(), N, C, OC);
      report.bits<float>("matmul_backward din, weight frozen" + tag, down(gfrozen), down(gdin));
    }
  }

  static std::string shape_tag(const AttentionShape& shape) {
    std::string tag = fmt::format("hd {}", shape.head_dim);
    if (shape.kv_heads != shape.heads) tag += fmt::format(", {}/{} heads", shape.heads, shape.kv_heads);
    if (shape.window > 0) tag += fmt::format(", window {}", shape.window);
    return tag;
  }

  // T = 23; head dims 12 (lanes idle) and 40 (two per lane); grouped-query heads (8 query heads on 2
  // key/value heads: the dK/dV sums over a group), a head dim that is not any model width / heads, and a
  // window shorter than the documents; documents or plain causal.
  void attention(const AttentionShape& shape, bool documents) {
    const int B = 2, T = 23;
    const size_t rows = size_t(B) * T;
    const std::string tag = fmt::format(" ({}, {})", shape_tag(shape), documents ? "documents" : "causal");
    const Floats qkv = rng.floats(rows * size_t(shape.qkv_width()), -2, 2);
    Ints starts = doc_starts(rng, B, T, 3);
    Floats out = rng.floats(rows * size_t(shape.q_width())), lse = rng.floats(size_t(B) * shape.heads * T);
    auto gqkv = up(qkv), gout = up(out), glse = up(lse);
    auto gstarts = up(starts);
    cpu.attention_forward(out.data(), lse.data(), qkv.data(), opt(starts, documents), B, T, shape);
    gpu.attention_forward(gout.data(), glse.data(), gqkv.data(), opt(gstarts, documents), B, T, shape);
    cmp("attention_forward out" + tag, gout, out, kSums);
    cmp("attention_forward lse" + tag, glse, lse, kSums);
    // Backward from the CPU forward's out and lse on both sides; dqkv starts as garbage (overwritten).
    const Floats dout = rng.floats(out.size());
    Floats dqkv = rng.floats(qkv.size());
    auto gdout = up(dout), gdqkv = up(dqkv), cpu_out = up(out), cpu_lse = up(lse);
    cpu.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                           opt(starts, documents), B, T, shape);
    gpu.attention_backward(gdqkv.data(), gdout.data(), gqkv.data(), cpu_out.data(), cpu_lse.data(),
                           opt(gstarts, documents), B, T, shape);
    cmp("attention_backward dqkv" + tag, gdqkv, dqkv, kSums);
  }

  // Three cached sequences; two new rows of sequence 2 in one call (the second sees the first's key) and two
  // of sequence 0 at positions apart. With a window of 4 the rows at positions 7 to 9 see only their last 4.
  void attention_decode(const AttentionShape& shape) {
    const int S = 3, max_len = 13, kvw = shape.kv_width();
    const std::string tag = " (" + shape_tag(shape) + ")";
    const Ints seq{0, 2, 2, 1, 0}, pos{4, 7, 8, 0, 9};
    const int rows = int(seq.size());
    const Floats qkv = rng.floats(size_t(rows) * shape.qkv_width(), -2, 2);
    Floats k = rng.floats(size_t(S) * max_len * kvw), v = rng.floats(k.size()),
           out = rng.floats(size_t(rows) * shape.q_width());
    auto gqkv = up(qkv), gk = up(k), gv = up(v), gout = up(out);
    auto gseq = up(seq), gpos = up(pos);
    cpu.attention_decode(out.data(), qkv.data(), k.data(), v.data(), seq.data(), pos.data(), rows, max_len,
                         shape);
    gpu.attention_decode(gout.data(), gqkv.data(), gk.data(), gv.data(), gseq.data(), gpos.data(), rows,
                         max_len, shape);
    cmp("attention_decode out" + tag, gout, out, kSums);
    cmp("attention_decode k_cache" + tag, gk, k, kExact);
    cmp("attention_decode v_cache" + tag, gv, v, kExact);
  }

  // Context parallelism's chunk attention (AttentionChunks) on B = 2 sequences of 4 chunks of n rows in the
  // fused qkv layout (row stride qkv_width, as the ring's chunks), the query chunk being chunk 2 (q_first =
  // 2n); lse and delta in the [B, heads, 4n] layout (stats_seq = 4n). The forward merges key chunks 3 (in
  // the future: nothing seen, out and lse untouched), 2 (the diagonal, into out = 0 and lse = -inf), 0 (far
  // in the past) and 1 (adjacent) into the same out and lse, each side from its own; the backward adds every
  // pair's share into dq, dk and dv (one fused buffer that starts random: the op adds), from the CPU's
  // merged out, lse and delta on both sides. Documents: ids that rise at random cuts inside the chunks (a
  // row whose document starts in the query chunk sees nothing of the past chunks); a window: rows that see
  // part of a past chunk, rows that see none of it.
  void chunk_attention(const AttentionShape& shape, int n, bool documents) {
    const int B = 2, L = 4 * n, W = shape.qkv_width(), QW = shape.q_width(), KV = shape.kv_width();
    const int q_first = 2 * n;
    const std::string tag =
        fmt::format(" (n {}, {}, {})", n, shape_tag(shape), documents ? "documents" : "causal");
    const size_t rows = size_t(B) * size_t(L);
    const Floats qkv = rng.floats(rows * size_t(W), -2, 2);
    Ints ids(rows);
    for (int b = 0; b < B; ++b)
      for (int t = 0, id = 0; t < L; ++t) {
        if (t > 0 && rng.below(std::max(n / 3, 1)) == 0) ++id;  // about 3 cuts a chunk
        ids[size_t(b) * size_t(L) + size_t(t)] = id;
      }
    auto gqkv = up(qkv);
    auto gids = up(ids);
    // The pair (query chunk 2, key chunk kc) over `fused` (the qkv rows) and `seg` (the ids).
    const auto chunk = [&](const float* fused, const int32_t* seg, int kc) {
      AttentionChunks c;
      c.B = B, c.n = n, c.shape = shape;
      c.q_first = q_first, c.k_first = kc * n;
      float* base = const_cast<float*>(fused);
      c.q = {base + int64_t(c.q_first) * W, int64_t(L) * W, W};
      c.k = {base + int64_t(c.k_first) * W + QW, int64_t(L) * W, W};
      c.v = {c.k.base + KV, c.k.seq, W};
      if (documents) c.q_seg = seg + c.q_first, c.k_seg = seg + c.k_first, c.seg_seq = L;
      c.stats_seq = L;
      return c;
    };
    const auto out_rows = [&](const float* o) {
      return ChunkRows{const_cast<float*>(o) + int64_t(q_first) * QW, int64_t(L) * QW, QW};
    };
    // The query chunk's lse values (the rest stay -inf, which a comparison of floats would fail).
    const auto chunk_stats = [&](const Floats& all) {
      Floats part;
      for (int bh = 0; bh < B * shape.heads; ++bh)
        for (int t = 0; t < n; ++t) part.push_back(all[size_t(bh) * size_t(L) + size_t(q_first + t)]);
      return part;
    };

    Floats out(rows * size_t(QW), 0.0f),
        lse(size_t(B) * size_t(shape.heads) * size_t(L), -std::numeric_limits<float>::infinity());
    const Floats out0 = out, lse0 = lse;
    auto gout = up(out), glse = up(lse);
    const auto forward = [&](int kc) {
      cpu.attention_chunk_forward(chunk(qkv.data(), ids.data(), kc), out_rows(out.data()),
                                  lse.data() + q_first);
      gpu.attention_chunk_forward(chunk(gqkv.data(), gids.data(), kc), out_rows(gout.data()),
                                  glse.data() + q_first);
    };
    forward(3);
    Floats got = down(gout), want = out0;
    for (float x : down(glse)) got.push_back(x);
    for (float x : lse0) want.push_back(x);
    report.bits<float>("attention_chunk_forward, key chunk in the future: out and lse untouched" + tag, got,
                       want);
    forward(2);
    cmp("attention_chunk_forward out, diagonal chunk" + tag, gout, out, kSums);
    report.floats("attention_chunk_forward lse, diagonal chunk" + tag, chunk_stats(down(glse)),
                  chunk_stats(lse), kSums);
    forward(0);
    forward(1);
    cmp("attention_chunk_forward out, 4 key chunks merged" + tag, gout, out, kSums);
    report.floats("attention_chunk_forward lse, 4 key chunks merged" + tag, chunk_stats(down(glse)),
                  chunk_stats(lse), kSums);

    // Backward from the CPU's merged out and lse, and its delta, on both sides.
    const Floats dout = rng.floats(out.size());
    Floats delta(lse.size());
    cpu.attention_delta(delta.data(), out.data(), dout.data(), B, L, shape);
    const Floats dqkv0 = rng.floats(qkv.size());
    Floats dqkv = dqkv0;
    auto gdout = up(dout), gdelta = up(delta), clse = up(lse), gdqkv = up(dqkv0);
    const auto backward = [&](Backend& on, const float* fused, const int32_t* seg, const float* g,
                              const float* l, const float* d, float* grads) {
      for (int kc : {3, 2, 0, 1}) {
        const ChunkRows dq{grads + int64_t(q_first) * W, int64_t(L) * W, W};
        const ChunkRows dk{grads + int64_t(kc) * n * W + QW, int64_t(L) * W, W};
        on.attention_chunk_backward(chunk(fused, seg, kc), out_rows(g), l + q_first, d + q_first, dq, dk,
                                    {dk.base + KV, dk.seq, W});
      }
    };
    backward(cpu, qkv.data(), ids.data(), dout.data(), lse.data(), delta.data(), dqkv.data());
    backward(gpu, gqkv.data(), gids.data(), gdout.data(), clse.data(), gdelta.data(), gdqkv.data());
    const Floats first = down(gdqkv);
    report.floats("attention_chunk_backward dq" + tag, columns(first, W, 0, QW), columns(dqkv, W, 0, QW),
                  kSums);
    report.floats("attention_chunk_backward dk" + tag, columns(first, W, QW, KV), columns(dqkv, W, QW, KV),
                  kSums);
    report.floats("attention_chunk_backward dv" + tag, columns(first, W, QW + KV, KV),
                  columns(dqkv, W, QW + KV, KV), kSums);
    if (shape.kv_heads != shape.heads) {  // dK, dV summed over the group: the same bits when run again
      auto again = up(dqkv0);
      backward(gpu, gqkv.data(), gids.data(), gdout.data(), clse.data(), gdelta.data(), again.data());
      report.bits<float>("attention_chunk_backward dq, dk, dv run again" + tag, down(again), first);
    }
  }
  // Columns [from, from + count) of rows `width` wide.
  static Floats columns(const Floats& rows, int width, int from, int count) {
    Floats out;
    for (size_t r = 0; r + size_t(width) <= rows.size(); r += size_t(width))
      out.insert(out.end(), rows.begin() + int64_t(r) + from, rows.begin() + int64_t(r) + from + count);
    return out;
  }

  // The backward's delta of context parallelism: head dims 40 and 64, grouped-query heads (delta is per
  // query head); delta starts as garbage (overwritten).
  void attention_delta(const AttentionShape& shape) {
    const int B = 2, T = 45;
    const size_t n = size_t(B) * size_t(T) * size_t(shape.q_width());
    const Floats out = rng.floats(n, -2, 2), dout = rng.floats(n);
    Floats delta = rng.floats(size_t(B) * size_t(shape.heads) * size_t(T));
    auto gout = up(out), gdout = up(dout), gdelta = up(delta);
    cpu.attention_delta(delta.data(), out.data(), dout.data(), B, T, shape);
    gpu.attention_delta(gdelta.data(), gout.data(), gdout.data(), B, T, shape);
    cmp("attention_delta (T 45, " + shape_tag(shape) + ")", gdelta, delta, kSums);
  }

  // Context parallelism's copies: rows of one stride to another (wider and narrower, contiguous on one
  // side), one row (whose strides may be anything), none.
  void copy_rows() {
    const Floats src = rng.floats(300), dst0 = rng.floats(300);
    struct Case {
      int64_t dst_at, dst_ld, src_at, src_ld;
      int width;
      int64_t rows;
    };
    for (const Case& c : {Case{5, 29, 3, 37, 13, 7}, Case{2, 41, 7, 11, 11, 5}, Case{250, 0, 200, 0, 40, 1},
                          Case{0, 13, 0, 13, 13, 0}}) {
      Floats dst = dst0;
      auto gsrc = up(src), gdst = up(dst0);
      cpu.copy_rows(dst.data() + c.dst_at, c.dst_ld, src.data() + c.src_at, c.src_ld, c.width, c.rows);
      gpu.copy_rows(gdst.data() + c.dst_at, c.dst_ld, gsrc.data() + c.src_at, c.src_ld, c.width, c.rows);
      report.bits<float>(
          fmt::format("copy_rows ({} rows of {}, ld {} to {})", c.rows, c.width, c.src_ld, c.dst_ld),
          down(gdst), dst);
    }
  }

  // Activations between FP32 and BF16 (Backend::convert): rounding's edge cases and random values of every
  // magnitude (as bf16() below) to BF16, the input left as it is; every BF16 pattern to FP32; the copies
  // when both are alike.
  void convert() {
    std::vector<uint32_t> patterns{0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                   0x7f800001u, 0xffa00000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
                                   0x00008000u, 0x80018000u, 0x007fffffu, 0x3f808000u, 0x3f818000u,
                                   0x3f807fffu, 0x3f808001u, 0x3f80ffffu, 0xbf808000u, 0xbf818000u};
    for (int i = 0; i < 3001; ++i) {
      const uint64_t r = rng.next();
      patterns.push_back(i % 2 == 0 ? uint32_t(r) : (uint32_t(r) & 0xffff0000u) | 0x8000u);  // ties
    }
    Floats x(patterns.size());
    std::memcpy(x.data(), patterns.data(), x.size() * sizeof(float));
    Halves h(x.size());
    auto gx = up(x);
    auto gh = up(h);
    cpu.convert(h.data(), x.data(), x.size());
    gpu.convert(gh.data(), gx.data(), x.size());
    report.bits<uint16_t>("convert FP32 to BF16", down(gh), h);
    report.bits<float>("convert FP32 to BF16 leaves its input as it is", down(gx), x);
    Halves all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
    Floats wide(all.size());
    auto gall = up(all);
    auto gwide = up(wide);
    cpu.convert(wide.data(), all.data(), all.size());
    gpu.convert(gwide.data(), gall.data(), all.size());
    report.bits<float>("convert BF16 to FP32 (all 65536 patterns)", down(gwide), wide);
    auto gcopy = up(Floats(x.size()));
    gpu.convert(gcopy.data(), gx.data(), x.size());
    report.bits<float>("convert FP32 to FP32 (a copy)", down(gcopy), x);
    auto ghcopy = up(Halves(all.size()));
    gpu.convert(ghcopy.data(), gall.data(), all.size());
    report.bits<uint16_t>("convert BF16 to BF16 (a copy)", down(ghcopy), all);
  }

  // The MLP's first product with its bias and GELU fused (pre-activations over about [-4, 4]), then GELU's
  // backward.
  void gelu() {
    const int N = 29, C = 45, OC = 37;
    const Floats x = rng.floats(size_t(N) * C), w = rng.floats(size_t(OC) * C, -0.6f, 0.6f),
                 bias = rng.floats(size_t(OC));
    Floats pre(size_t(N) * OC), out(pre.size());
    auto gx = up(x), gw = up(w), gbias = up(bias), gpre = up(pre), gout = up(out);
    cpu.matmul_bias_gelu_forward(out.data(), pre.data(), x.data(), w.data(), bias.data(), N, C, OC);
    gpu.matmul_bias_gelu_forward(gout.data(), gpre.data(), gx.data(), gw.data(), gbias.data(), N, C, OC);
    cmp("matmul_bias_gelu_forward out", gout, out, kSums);
    cmp("matmul_bias_gelu_forward pre", gpre, pre, kSums);
    Floats d = rng.floats(pre.size());
    auto gd = up(d), cpre = up(pre);
    cpu.gelu_backward(d.data(), pre.data(), N, OC);
    gpu.gelu_backward(gd.data(), cpre.data(), N, OC);
    cmp("gelu_backward", gd, d, kElementwise);
  }

  // RMSNorm over rows of C: 45 (the kernels that loop over a row), 48, 520 and 2048 (the row in registers,
  // one to sixteen four-column chunks a lane; 2048's backward loops), 2100 rows (the backward's warps take
  // several rows each). Outputs FP32 and BF16; the residual add with the delta's bias and without; the
  // backward's din and dweight start non-zero (+=), and dweight's bits are the same when run again.
  void rmsnorm(int N, int C) {
    const float eps = 1e-6f;
    const std::string tag = fmt::format(" (N {}, C {})", N, C);
    const size_t n = size_t(N) * C;
    const Floats x = rng.floats(n, -2, 2), w = rng.floats(size_t(C), 0.5f, 1.5f), d = rng.floats(n),
                 db = rng.floats(size_t(C));
    Floats out(n), rstd(static_cast<size_t>(N));
    auto gx = up(x), gw = up(w), gd = up(d), gdb = up(db), gout = up(out), grstd = up(rstd);
    cpu.rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), eps, N, C);
    gpu.rmsnorm_forward(gout.data(), grstd.data(), gx.data(), gw.data(), eps, N, C);
    cmp("rmsnorm_forward out" + tag, gout, out, kElementwise);
    cmp("rmsnorm_forward rstd" + tag, grstd, rstd, kElementwise);
    Halves hout(n);
    Floats hrstd(rstd.size());
    auto ghout = up(hout);
    auto ghrstd = up(hrstd);
    cpu.rmsnorm_forward(hout.data(), hrstd.data(), x.data(), w.data(), eps, N, C);
    gpu.rmsnorm_forward(ghout.data(), ghrstd.data(), gx.data(), gw.data(), eps, N, C);
    cmp("rmsnorm_forward out (BF16)" + tag, ghout, hout, kBf16);
    for (bool bias : {true, false}) {
      const std::string rtag = tag.substr(0, tag.size() - 1) + (bias ? ", delta bias)" : ", no delta bias)");
      Floats res(n), rout(n), rrstd(rstd.size());
      Halves rhout(n);
      auto gres = up(res), grout = up(rout), grrstd = up(rrstd);
      auto grhout = up(rhout);
      cpu.residual_rmsnorm_forward(res.data(), rout.data(), rrstd.data(), x.data(), d.data(), opt(db, bias),
                                   w.data(), eps, N, C);
      gpu.residual_rmsnorm_forward(gres.data(), grout.data(), grrstd.data(), gx.data(), gd.data(),
                                   opt(gdb, bias), gw.data(), eps, N, C);
      cmp("residual_rmsnorm_forward res_out" + rtag, gres, res, kElementwise);
      cmp("residual_rmsnorm_forward out" + rtag, grout, rout, kElementwise);
      cmp("residual_rmsnorm_forward rstd" + rtag, grrstd, rrstd, kElementwise);
      cpu.residual_rmsnorm_forward(res.data(), rhout.data(), rrstd.data(), x.data(), d.data(), opt(db, bias),
                                   w.data(), eps, N, C);
      gpu.residual_rmsnorm_forward(gres.data(), grhout.data(), grrstd.data(), gx.data(), gd.data(),
                                   opt(gdb, bias), gw.data(), eps, N, C);
      cmp("residual_rmsnorm_forward out (BF16)" + rtag, grhout, rhout, kBf16);
    }
    // Backward from the CPU's rstd on both sides.
    const Floats dout = rng.floats(n), din0 = rng.floats(n), dw0 = rng.floats(size_t(C));
    Floats din = din0, dw = dw0;
    auto gdout = up(dout), gdin = up(din0), gdw = up(dw0), crstd = up(rstd);
    cpu.rmsnorm_backward(din.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    gpu.rmsnorm_backward(gdin.data(), gdw.data(), gdout.data(), gx.data(), gw.data(), crstd.data(), N, C);
    cmp("rmsnorm_backward din" + tag, gdin, din, kSums);
    cmp("rmsnorm_backward dweight" + tag, gdw, dw, kSums);
    auto gdin2 = up(din0), gdw2 = up(dw0);
    gpu.rmsnorm_backward(gdin2.data(), gdw2.data(), gdout.data(), gx.data(), gw.data(), crstd.data(), N, C);
    report.bits<float>("rmsnorm_backward dweight run again" + tag, down(gdw2), down(gdw));
    auto gfrozen = up(din0);  // a frozen norm (train.freeze): din the same bits
    gpu.rmsnorm_backward(gfrozen.data(), nullptr, gdout.data(), gx.data(), gw.data(), crstd.data(), N, C);
    report.bits<float>("rmsnorm_backward din, weight frozen" + tag, down(gfrozen), down(gdin));
  }

  // Sequence parallelism's norm backward (Backend::rmsnorm_backward_partials, layernorm_backward_partials):
  // N = 96 (whole chunks of kNormChunkRows) and 71 (a short last chunk of 7 rows); C = 96 (RMSNorm's
  // four-column kernel) and 4096 (its looping one). din starts non-zero (+=) and partial as garbage
  // (overwritten); din is the bits of the plain backward's (the same kernel); the partials added up
  // (add_chunk_sums, the LayerNorm's halves at row stride 2C) give the plain backward's weight gradients.
  void norm_partials(bool layernorm, int N, int C) {
    const std::string op = layernorm ? "layernorm_backward_partials" : "rmsnorm_backward_partials";
    const std::string tag = fmt::format(" (N {}, C {})", N, C);
    const size_t n = size_t(N) * size_t(C), chunks = (size_t(N) + kNormChunkRows - 1) / kNormChunkRows,
                 width = layernorm ? 2 * size_t(C) : size_t(C);
    const Floats x = rng.floats(n, -2, 2), w = rng.floats(size_t(C), 0.5f, 1.5f), b = rng.floats(size_t(C));
    // The CPU's statistics on both sides.
    Floats out(n), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    if (layernorm)
      cpu.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1e-5f, N, C);
    else
      cpu.rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1e-6f, N, C);
    const Floats dout = rng.floats(n), din0 = rng.floats(n), partial0 = rng.floats(chunks * width),
                 dw0 = rng.floats(size_t(C)), db0 = rng.floats(size_t(C));
    Floats din = din0, partial = partial0;
    auto gx = up(x), gw = up(w), gmean = up(mean), grstd = up(rstd), gdout = up(dout), gdin = up(din0),
         gpartial = up(partial0);
    if (layernorm) {
      cpu.layernorm_backward_partials(din.data(), partial.data(), dout.data(), x.data(), w.data(),
                                      mean.data(), rstd.data(), N, C);
      gpu.layernorm_backward_partials(gdin.data(), gpartial.data(), gdout.data(), gx.data(), gw.data(),
                                      gmean.data(), grstd.data(), N, C);
    } else {
      cpu.rmsnorm_backward_partials(din.data(), partial.data(), dout.data(), x.data(), w.data(), rstd.data(),
                                    N, C);
      gpu.rmsnorm_backward_partials(gdin.data(), gpartial.data(), gdout.data(), gx.data(), gw.data(),
                                    grstd.data(), N, C);
    }
    cmp(op + " din" + tag, gdin, din, kSums);
    cmp(op + " partial" + tag, gpartial, partial, kSums);
    // The plain backward on the GPU: din the same bits. On the CPU: the weight gradients to add up to.
    auto gplain = up(din0);
    Floats plain = din0, dw = dw0, db = db0;
    if (layernorm) {
      gpu.layernorm_backward(gplain.data(), nullptr, nullptr, gdout.data(), gx.data(), gw.data(),
                             gmean.data(), grstd.data(), N, C);
      cpu.layernorm_backward(plain.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                             rstd.data(), N, C);
    } else {
      gpu.rmsnorm_backward(gplain.data(), nullptr, gdout.data(), gx.data(), gw.data(), grstd.data(), N, C);
      cpu.rmsnorm_backward(plain.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    }
    report.bits<float>(op + " din as the plain backward's" + tag, down(gdin), down(gplain));
    auto gdw = up(dw0), gdb = up(db0);
    gpu.add_chunk_sums(gdw.data(), gpartial.data(), int64_t(chunks), C, int(width));
    cmp(op + " + add_chunk_sums dweight" + tag, gdw, dw, kSums);
    if (layernorm) {
      gpu.add_chunk_sums(gdb.data(), gpartial.data() + C, int64_t(chunks), C, int(width));
      cmp(op + " + add_chunk_sums dbias" + tag, gdb, db, kSums);
    }
  }

  // Backend::add_chunk_sums: `width` columns of `chunks` partial rows of `stride` (> width: a LayerNorm's
  // [chunks, 2C], its first half and its second), added to a gradient that starts non-zero; one chunk (the
  // ZeRO buckets' elementwise add); a null gradient adds nothing.
  void chunk_sums(int64_t chunks, int width, int stride) {
    const std::string tag = fmt::format(" (chunks {}, width {}, stride {})", chunks, width, stride);
    const Floats partial = rng.floats(size_t(chunks) * size_t(stride)), grad0 = rng.floats(size_t(width));
    auto gpartial = up(partial);
    for (int at = 0; at + width <= stride; at += width) {
      Floats grad = grad0;
      auto ggrad = up(grad0);
      cpu.add_chunk_sums(grad.data(), partial.data() + at, chunks, width, stride);
      gpu.add_chunk_sums(ggrad.data(), gpartial.data() + at, chunks, width, stride);
      cmp("add_chunk_sums" + tag.substr(0, tag.size() - 1) + fmt::format(", columns from {})", at), ggrad,
          grad, kSums);
    }
    gpu.add_chunk_sums(nullptr, gpartial.data(), chunks, width, stride);
    report.bits<float>("add_chunk_sums, grad null: nothing written" + tag, down(gpartial), partial);
  }

  // Qwen 3's qk-norm on the q and k heads of qkv rows (v untouched): head dims 12 and 128 (four columns a
  // lane access), 10 (one); 700 rows (the backward's warps take several heads each). The forward in place
  // on FP32 and BF16 rows; the backward in place on dqkv, dq_weight and dk_weight +=.
  void head_rmsnorm(int N, const AttentionShape& shape) {
    const float eps = 1e-6f;
    const int hd = shape.head_dim, normed = shape.heads + shape.kv_heads;
    const std::string tag = fmt::format(" (N {}, {}/{} heads, hd {})", N, shape.heads, shape.kv_heads, hd);
    const size_t n = size_t(N) * shape.qkv_width(), ns = size_t(N) * normed * hd;
    const Floats qkv0 = rng.floats(n, -2, 2), qw = rng.floats(size_t(hd), 0.5f, 1.5f),
                 kw = rng.floats(size_t(hd), 0.5f, 1.5f);
    Floats qkv = qkv0, saved(ns), rstd(size_t(N) * normed);
    auto gqkv = up(qkv0), gsaved = up(saved), grstd = up(rstd), gqw = up(qw), gkw = up(kw);
    cpu.head_rmsnorm_forward(qkv.data(), saved.data(), rstd.data(), qw.data(), kw.data(), eps, N, shape);
    gpu.head_rmsnorm_forward(gqkv.data(), gsaved.data(), grstd.data(), gqw.data(), gkw.data(), eps, N, shape);
    cmp("head_rmsnorm_forward qkv" + tag, gqkv, qkv, kElementwise);
    cmp("head_rmsnorm_forward saved" + tag, gsaved, saved, kExact);
    cmp("head_rmsnorm_forward rstd" + tag, grstd, rstd, kElementwise);
    Halves hqkv = halves(qkv0);
    Floats hsaved(ns), hrstd(rstd.size());
    auto ghqkv = up(hqkv);
    auto ghsaved = up(hsaved), ghrstd = up(hrstd);
    cpu.head_rmsnorm_forward(hqkv.data(), hsaved.data(), hrstd.data(), qw.data(), kw.data(), eps, N, shape);
    gpu.head_rmsnorm_forward(ghqkv.data(), ghsaved.data(), ghrstd.data(), gqw.data(), gkw.data(), eps, N,
                             shape);
    cmp("head_rmsnorm_forward qkv (BF16)" + tag, ghqkv, hqkv, kBf16);
    cmp("head_rmsnorm_forward saved (BF16)" + tag, ghsaved, hsaved, kExact);
    // Backward from the CPU's saved inputs and rstd.
    const Floats dqkv0 = rng.floats(n), dqw0 = rng.floats(size_t(hd)), dkw0 = rng.floats(size_t(hd));
    Floats dqkv = dqkv0, dqw = dqw0, dkw = dkw0;
    auto gdqkv = up(dqkv0), gdqw = up(dqw0), gdkw = up(dkw0), csaved = up(saved), crstd = up(rstd);
    cpu.head_rmsnorm_backward(dqkv.data(), dqw.data(), dkw.data(), saved.data(), rstd.data(), qw.data(),
                              kw.data(), N, shape);
    gpu.head_rmsnorm_backward(gdqkv.data(), gdqw.data(), gdkw.data(), csaved.data(), crstd.data(), gqw.data(),
                              gkw.data(), N, shape);
    cmp("head_rmsnorm_backward dqkv" + tag, gdqkv, dqkv, kSums);
    cmp("head_rmsnorm_backward dq_weight" + tag, gdqw, dqw, kSums);
    cmp("head_rmsnorm_backward dk_weight" + tag, gdkw, dkw, kSums);
    auto gdqkv2 = up(dqkv0), gdqw2 = up(dqw0), gdkw2 = up(dkw0);
    gpu.head_rmsnorm_backward(gdqkv2.data(), gdqw2.data(), gdkw2.data(), csaved.data(), crstd.data(),
                              gqw.data(), gkw.data(), N, shape);
    Floats again = down(gdqw2), first = down(gdqw);
    for (float v : down(gdkw2)) again.push_back(v);
    for (float v : down(gdkw)) first.push_back(v);
    report.bits<float>("head_rmsnorm_backward weights run again" + tag, again, first);
  }

  // SwiGLU on gate | up rows: H = 37 (one value a thread), 48 (four); gates over [-6, 6]. FP32 and BF16 in,
  // FP32 and BF16 out; the backward overwrites din (from garbage).
  void swiglu(int N, int H) {
    const Floats in = rng.floats(2 * size_t(N) * size_t(H), -6, 6);
    swiglu_with(in, N, H, fmt::format(" (H {})", H));
    swiglu_with(halves(in), N, H, fmt::format(" (H {}, BF16 in)", H));
    Halves out(size_t(N) * size_t(H));
    const Halves hin = halves(in);
    auto ghin = up(hin), gout = up(out);
    cpu.swiglu_forward(out.data(), hin.data(), N, H);
    gpu.swiglu_forward(gout.data(), ghin.data(), N, H);
    cmp(fmt::format("swiglu_forward (H {}, BF16 in and out)", H), gout, out, kBf16);
  }
  // FP32 out from `in` (FP32 values or their BF16 bits), and the backward.
  template <class In>
  void swiglu_with(const std::vector<In>& in, int N, int H, const std::string& tag) {
    const size_t n = size_t(N) * size_t(H);
    Floats out = rng.floats(n), din = rng.floats(2 * n);
    const Floats dout = rng.floats(n);
    auto gin = up(in);
    auto gout = up(out), gdin = up(din), gdout = up(dout);
    cpu.swiglu_forward(out.data(), in.data(), N, H);
    gpu.swiglu_forward(gout.data(), gin.data(), N, H);
    cmp("swiglu_forward" + tag, gout, out, kElementwise);
    cpu.swiglu_backward(din.data(), dout.data(), in.data(), N, H);
    gpu.swiglu_backward(gdin.data(), gdout.data(), gin.data(), N, H);
    cmp("swiglu_backward" + tag, gdin, din, kElementwise);
  }

  // Rotary positions on the q and k heads (v untouched): head dims 12 and 10 (one pair a thread), 16 and 128
  // (four); positions null (r % T) or given up to 5000 (angles of thousands of radians, where fast-math's
  // cos and sin would be off); Llama 3's theta, magnitude 1 or YaRN's; forward and inverse; FP32 and BF16.
  void rope(const AttentionShape& shape, bool yarn) {
    const int N = 29, T = 11;
    RopeSpec spec;
    spec.theta = 500000;
    if (yarn) spec.scaling = RopeScaling::kYarn, spec.factor = 4, spec.original_positions = 1024;
    const RopeTable table = rope_table(spec, shape.head_dim);
    const size_t n = size_t(N) * shape.qkv_width();
    const Floats qkv0 = rng.floats(n, -2, 2);
    const Ints positions = rng.ints(size_t(N), 5000);
    auto gfreq = up(table.inv_freq);
    auto gpos = up(positions);
    for (bool given : {false, true})
      for (bool inverse : {false, true}) {
        const std::string tag = fmt::format(" ({}/{} heads, hd {}, {}, positions {}{})", shape.heads,
                                            shape.kv_heads, shape.head_dim, yarn ? "yarn" : "magnitude 1",
                                            given ? "given" : "null", inverse ? ", inverse" : "");
        Floats qkv = qkv0;
        auto gqkv = up(qkv0);
        cpu.rope(qkv.data(), opt(positions, given), table.inv_freq.data(), table.magnitude, N, T, shape,
                 inverse);
        gpu.rope(gqkv.data(), opt(gpos, given), gfreq.data(), table.magnitude, N, T, shape, inverse);
        cmp("rope" + tag, gqkv, qkv, kElementwise);
        if (given && !inverse) {
          Halves h = halves(qkv0);
          auto gh = up(h);
          cpu.rope(h.data(), positions.data(), table.inv_freq.data(), table.magnitude, N, T, shape, false);
          gpu.rope(gh.data(), gpos.data(), gfreq.data(), table.magnitude, N, T, shape, false);
          cmp("rope (BF16)" + tag, gh, h, kBf16);
        }
      }
  }

  void moe(bool with_factors, bool accumulate) {
    const int rows_in = 11, rows = 17, N = 13, k = 3, C = 37;
    const std::string tag =
        fmt::format(" ({}{})", with_factors ? "scaled" : "unscaled", accumulate ? ", accumulate" : "");
    const Floats in = rng.floats(size_t(rows_in) * C), scale = rng.floats(size_t(rows), 0.1f, 2.0f);
    const Ints index = rng.ints(size_t(rows), rows_in);
    Floats out = rng.floats(size_t(rows) * C);
    auto gin = up(in), gscale = up(scale), gout = up(out);
    auto gindex = up(index);
    cpu.gather_rows(out.data(), in.data(), index.data(), opt(scale, with_factors), rows, C);
    gpu.gather_rows(gout.data(), gin.data(), gindex.data(), opt(gscale, with_factors), rows, C);
    cmp("gather_rows" + tag, gout, out, kElementwise);
    // A quarter of the slots empty (-1); token 0 has none at all.
    Ints slots = rng.ints(size_t(N) * k, rows_in);
    for (auto& r : slots)
      if (rng.below(4) == 0) r = -1;
    std::fill_n(slots.begin(), k, -1);
    Floats weight = rng.floats(slots.size(), 0.1f, 1.0f), combined = rng.floats(size_t(N) * C);
    auto gweight = up(weight), gcombined = up(combined);
    auto gslots = up(slots);
    cpu.combine_rows(combined.data(), in.data(), slots.data(), opt(weight, with_factors), N, k, C,
                     accumulate);
    gpu.combine_rows(gcombined.data(), gin.data(), gslots.data(), opt(gweight, with_factors), N, k, C,
                     accumulate);
    cmp("combine_rows" + tag, gcombined, combined, kElementwise);
    if (!with_factors || accumulate) return;
    const Floats a = rng.floats(size_t(N) * C);
    Floats dot = rng.floats(slots.size());
    auto ga = up(a), gdot = up(dot);
    cpu.row_dots(dot.data(), a.data(), in.data(), slots.data(), N, k, C);
    gpu.row_dots(gdot.data(), ga.data(), gin.data(), gslots.data(), N, k, C);
    cmp("row_dots", gdot, dot, kSums);
  }

  // Targets: a third in this shard's columns [40, 93), some kIgnore, the rest elsewhere in a vocabulary of
  // 160.
  Ints loss_targets(int rows, int vb, int V) {
    Ints t(static_cast<size_t>(rows));
    for (auto& x : t) {
      const int kind = rng.below(6);
      x = kind < 2 ? vb + rng.below(V) : kind == 2 ? MicroBatch::kIgnore : rng.below(160);
    }
    t[0] = vb;  // the shard's first and last column
    t[1] = vb + V - 1;
    t[2] = MicroBatch::kIgnore;
    return t;
  }

  void cross_entropy(bool with_weights, bool backward, bool grouped) {
    const int rows = 19, V = 53, vb = 40;
    const float scale = 0.37f;
    const std::string tag = fmt::format(" ({}, {}{})", with_weights ? "weights" : "no weights",
                                        backward ? "backward" : "forward", grouped ? ", group" : "");
    Floats logits = rng.floats(size_t(rows) * V, -4, 4), weights = rng.floats(size_t(rows), 0.25f, 2.0f),
           nll = rng.floats(size_t(rows));
    weights[3] = 0.0f;
    const Ints targets = loss_targets(rows, vb, V);
    auto glogits = up(logits), gweights = up(weights), gnll = up(nll);
    auto gtargets = up(targets);
    FakeGroup cpu_group, gpu_group;
    const double want = cpu.cross_entropy(logits.data(), targets.data(), opt(weights, with_weights), rows, V,
                                          vb, scale, backward, grouped ? &cpu_group : nullptr, nll.data());
    const double got = gpu.cross_entropy(glogits.data(), gtargets.data(), opt(gweights, with_weights), rows,
                                         V, vb, scale, backward, grouped ? &gpu_group : nullptr, gnll.data());
    report.number("cross_entropy loss" + tag, got, want, kSums);
    cmp("cross_entropy nll" + tag, gnll, nll, kSums);
    if (backward) cmp("cross_entropy dlogits" + tag, glogits, logits, kSums);
    if (grouped) report.flag("cross_entropy group calls" + tag, cpu_group.calls == gpu_group.calls);
  }

  void distillation(bool with_weights, bool backward, bool grouped, bool same_teacher) {
    const int rows = 17, V = 41, vb = 10;
    const float temperature = 2.0f, alpha = 0.6f, scale = 0.5f;
    const std::string tag = fmt::format(" ({}, {}{}{})", with_weights ? "weights" : "no weights",
                                        backward ? "backward" : "forward", grouped ? ", group" : "",
                                        same_teacher ? ", teacher = student" : "");
    Floats logits = rng.floats(size_t(rows) * V, -4, 4), weights = rng.floats(size_t(rows), 0.25f, 2.0f);
    Floats teacher = same_teacher ? logits : rng.floats(logits.size(), -4, 4);
    weights[3] = 0.0f;
    const Ints targets = loss_targets(rows, vb, V);
    auto glogits = up(logits), gteacher = up(teacher), gweights = up(weights);
    auto gtargets = up(targets);
    FakeGroup cpu_group, gpu_group;
    double want_kl = 0, got_kl = 0;
    const double want =
        cpu.distillation(logits.data(), teacher.data(), targets.data(), opt(weights, with_weights), rows, V,
                         vb, temperature, alpha, scale, backward, grouped ? &cpu_group : nullptr, &want_kl);
    const double got =
        gpu.distillation(glogits.data(), gteacher.data(), gtargets.data(), opt(gweights, with_weights), rows,
                         V, vb, temperature, alpha, scale, backward, grouped ? &gpu_group : nullptr, &got_kl);
    report.number("distillation loss" + tag, got, want, kSums);
    report.number("distillation kl_sum" + tag, got_kl, want_kl, kSums);
    if (backward) cmp("distillation dlogits" + tag, glogits, logits, kSums);
    if (grouped) report.flag("distillation group calls" + tag, cpu_group.calls == gpu_group.calls);
  }

  // An empty chunk: nothing to compute, but a group's reductions are collectives and must still be called.
  void empty_losses() {
    Buffer<float> logits, teacher, weights;
    Buffer<int32_t> targets;
    FakeGroup cpu_group, gpu_group;
    const double got = gpu.cross_entropy(logits.data(), targets.data(), weights.data(), 0, 53, 40, 1.0f, true,
                                         &gpu_group, nullptr);
    const double want =
        cpu.cross_entropy(nullptr, nullptr, nullptr, 0, 53, 40, 1.0f, true, &cpu_group, nullptr);
    double got_kl = 1, want_kl = 1;
    const double got_d = gpu.distillation(logits.data(), teacher.data(), targets.data(), weights.data(), 0,
                                          41, 10, 2.0f, 0.6f, 1.0f, true, &gpu_group, &got_kl);
    const double want_d = cpu.distillation(nullptr, nullptr, nullptr, nullptr, 0, 41, 10, 2.0f, 0.6f, 1.0f,
                                           true, &cpu_group, &want_kl);
    report.flag("cross_entropy, distillation of 0 rows (group calls, 0 losses)",
                cpu_group.calls == gpu_group.calls && got == want && got_d == want_d && got_kl == want_kl);
  }

  // Rounding's edge cases by construction (ties either way, just off a tie, subnormals, zeros, infinities,
  // NaNs, the largest finite value, which rounds to infinity), then random values of every magnitude.
  // The BF16 products (set_bf16_products) against the CPU's FP32 ones on the same BF16-valued inputs:
  // the forward products are exact products summed in FP32 (kSums); what rounds a gradient or the
  // attention's probabilities to BF16 is within kBf16 (2^-8 per rounding, relative to the largest value).
  Floats bf16_values(size_t n, float lo, float hi) {
    Floats x = rng.floats(n, lo, hi);
    cpu.round_to_bf16(x.data(), x.data(), n);
    return x;
  }
  void bf16_products() {
    gpu.set_bf16_products(true);
    const int N = 33, C = 64, OC = 40;
    const Floats x = bf16_values(size_t(N) * C, -1, 1), b = rng.floats(size_t(OC));
    // The weights: a working copy of two tensors, the product's at an offset into it.
    Floats work = bf16_values(size_t(OC) * C + 24, -0.2f, 0.2f);
    const Floats w(work.begin() + 24, work.end());
    Floats out(size_t(N) * OC);
    auto gx = up(x), gb = up(b), gwork = up(work), gout = up(out);
    const float* gw = gwork.data() + 24;
    gpu.bf16_working_copy(gwork.data(), work.size());
    cpu.matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    gpu.matmul_forward(gout.data(), gx.data(), gw, gb.data(), N, C, OC);
    cmp("bf16 products: matmul_forward (working copy)", gout, out, kSums);
    const Floats dout = rng.floats(out.size());
    Floats din(x.size()), dw = rng.floats(w.size()), db = rng.floats(b.size());
    auto gdout = up(dout), gdin = up(din), gdw = up(dw), gdb = up(db);
    cpu.matmul_backward(din.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
    gpu.matmul_backward(gdin.data(), gdw.data(), gdb.data(), gdout.data(), gx.data(), gw, N, C, OC);
    cmp("bf16 products: matmul_backward din", gdin, din, kBf16);
    cmp("bf16 products: matmul_backward dweight", gdw, dw, kBf16);
    cmp("bf16 products: matmul_backward dbias", gdb, db, kBf16);
    // The kept copy until the working copy is announced again: a change not announced is not seen.
    const Floats w2 = bf16_values(w.size(), -0.2f, 0.2f);
    gpu.copy_from_host(gwork.data() + 24, w2.data(), w2.size() * sizeof(float));
    gpu.matmul_forward(gout.data(), gx.data(), gw, nullptr, N, C, OC);
    Floats stale(out.size()), fresh(out.size());
    cpu.matmul_forward(stale.data(), x.data(), w.data(), nullptr, N, C, OC);
    cmp("bf16 products: matmul_forward reads the kept copy", gout, stale, kSums);
    gpu.bf16_working_copy(gwork.data() + 24, w2.size());  // a part of the kept copy: refreshed
    gpu.matmul_forward(gout.data(), gx.data(), gw, nullptr, N, C, OC);
    cpu.matmul_forward(fresh.data(), x.data(), w2.data(), nullptr, N, C, OC);
    cmp("bf16 products: matmul_forward after the copy is announced again", gout, fresh, kSums);
    // Weights no working copy holds are converted per call.
    auto gw2 = up(w2);
    gpu.matmul_forward(gout.data(), gx.data(), gw2.data(), nullptr, N, C, OC);
    cmp("bf16 products: matmul_forward (weights not announced)", gout, fresh, kSums);

    // The attention: head dims 64 (tensor cores, mma.sync; T = 45 leaves a tail tile), 128 (WMMA) and 32,
    // grouped-query heads and windows on tensor cores (T = 150 with a window of 40: the key tiles before a
    // query tile's window are skipped, the first one walked is partly outside it); head dim 40 (no
    // tensor-core kernel: the FP32 one), and documents (the FP32 kernel).
    struct Case {
      AttentionShape shape;
      int T;
      bool documents;
    };
    for (const Case& c :
         {Case{{3, 3, 64, 0}, 45, false}, Case{{3, 3, 40, 0}, 45, false}, Case{{3, 3, 64, 0}, 45, true},
          Case{{8, 2, 64, 0}, 45, false}, Case{{4, 2, 128, 0}, 45, false}, Case{{4, 1, 32, 40}, 150, false},
          Case{{8, 2, 64, 40}, 150, false}, Case{{4, 2, 128, 40}, 150, false},
          Case{{8, 2, 64, 20}, 45, true}}) {
      const AttentionShape& shape = c.shape;
      const int B = 2, T = c.T;
      const bool documents = c.documents;
      const size_t rows = size_t(B) * T;
      const bool tensor_cores = shape.head_dim != 40 && !documents;
      const std::string tag =
          fmt::format(" (T {}, {}, {}{})", T, shape_tag(shape), documents ? "documents" : "causal",
                      tensor_cores ? ", tensor cores" : "");
      const Floats qkv = bf16_values(rows * shape.qkv_width(), -2, 2);
      const Ints starts = doc_starts(rng, B, T, 3);
      Floats aout(rows * shape.q_width()), lse(size_t(B) * shape.heads * T);
      auto gqkv = up(qkv), gaout = up(aout), glse = up(lse);
      auto gstarts = up(starts);
      cpu.attention_forward(aout.data(), lse.data(), qkv.data(), opt(starts, documents), B, T, shape);
      gpu.attention_forward(gaout.data(), glse.data(), gqkv.data(), opt(gstarts, documents), B, T, shape);
      cmp("bf16 products: attention_forward out" + tag, gaout, aout, tensor_cores ? kBf16 : kSums);
      cmp("bf16 products: attention_forward lse" + tag, glse, lse, tensor_cores ? kBf16 : kSums);
      // Backward from the CPU's out (rounded to BF16, as the model keeps it) and lse.
      cpu.round_to_bf16(aout.data(), aout.data(), aout.size());
      const Floats adout = rng.floats(aout.size());
      Floats dqkv(qkv.size());
      auto gadout = up(adout), gdqkv = up(dqkv), gcpu_out = up(aout), gcpu_lse = up(lse);
      cpu.attention_backward(dqkv.data(), adout.data(), qkv.data(), aout.data(), lse.data(),
                             opt(starts, documents), B, T, shape);
      gpu.attention_backward(gdqkv.data(), gadout.data(), gqkv.data(), gcpu_out.data(), gcpu_lse.data(),
                             opt(gstarts, documents), B, T, shape);
      cmp("bf16 products: attention_backward dqkv" + tag, gdqkv, dqkv, tensor_cores ? 2 * kBf16 : kSums);
      if (shape.kv_heads != shape.heads) {  // dK, dV summed over the group: the same bits when run again
        auto again = up(Floats(dqkv.size()));
        gpu.attention_backward(again.data(), gadout.data(), gqkv.data(), gcpu_out.data(), gcpu_lse.data(),
                               opt(gstarts, documents), B, T, shape);
        report.bits<float>("bf16 products: attention_backward dqkv run again" + tag, down(again),
                           down(gdqkv));
      }
    }
    gpu.set_bf16_products(false);
  }

  void bf16() {
    std::vector<uint32_t> patterns{
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa00000u,
        0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x00008000u, 0x80018000u, 0x007fffffu, 0x3f808000u,
        0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f80ffffu, 0xbf808000u, 0xbf818000u, 0x4effffffu};
    for (int i = 0; i < 4000; ++i) {
      const uint64_t r = rng.next();
      patterns.push_back(i % 2 == 0 ? uint32_t(r)
                                    : (uint32_t(r) & 0xffff0000u) | 0x8000u);  // every other a tie
    }
    Floats x(patterns.size());
    std::memcpy(x.data(), patterns.data(), x.size() * sizeof(float));
    Floats rounded(x.size());
    auto gx = up(x), grounded = up(rounded);
    cpu.round_to_bf16(rounded.data(), x.data(), x.size());
    gpu.round_to_bf16(grounded.data(), gx.data(), x.size());
    report.bits<float>("round_to_bf16", down(grounded), rounded);
    // BF16 activations widened by an op that reads them: gather_rows of every pattern.
    Halves all(65536);
    Ints index(all.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(index[i] = int32_t(i));
    Floats back(all.size());
    auto gall = up(all);
    auto gindex = up(index);
    auto gback = up(back);
    cpu.gather_rows(back.data(), all.data(), index.data(), nullptr, int(all.size()), 1);
    gpu.gather_rows(gback.data(), gall.data(), gindex.data(), nullptr, int(all.size()), 1);
    report.bits<float>("BF16 activations read (gather_rows, all 65536 patterns)", down(gback), back);
  }

  // The block's ops on the activations BF16 mode stores as BF16 (Act), as the model chains them, each
  // from the CPU's inputs; outputs compared after widening. Outputs rounded to BF16 differ by a rounding
  // where the FP32 values do in the last bits (kBf16), more where a product rounds a gradient.
  static Halves halves(const Floats& bf16_values) {
    Halves h(bf16_values.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(std::bit_cast<uint32_t>(bf16_values[i]) >> 16);
    return h;
  }
  static Floats widened(const Halves& h) {
    Floats x(h.size());
    for (size_t i = 0; i < h.size(); ++i) x[i] = std::bit_cast<float>(uint32_t(h[i]) << 16);
    return x;
  }
  void cmp(const std::string& op, const Buffer<uint16_t>& got, const Halves& want, double tol) {
    report.floats(op, widened(down(got)), widened(want), tol);
  }
  void bf16_storage() {
    gpu.set_bf16_products(true);
    const int B = 2, T = 45, NH = 3, C = NH * 64, N = B * T, H = 2 * C;
    const size_t NC = size_t(N) * C;
    const Floats x = rng.floats(NC, -2, 2), d = rng.floats(NC), lnw = bf16_values(size_t(C), 0.5f, 1.5f),
                 lnb = bf16_values(size_t(C), -0.5f, 0.5f),
                 wqkv = bf16_values(3 * size_t(C) * C, -0.1f, 0.1f), bqkv = bf16_values(3 * size_t(C), -1, 1),
                 wfc = bf16_values(size_t(H) * C, -0.1f, 0.1f), bfc = bf16_values(size_t(H), -1, 1),
                 dqkv_out = rng.floats(NC), dfc = rng.floats(size_t(N) * H);
    auto gx = up(x), gd = up(d), glnw = up(lnw), glnb = up(lnb), gwqkv = up(wqkv), gbqkv = up(bqkv),
         gwfc = up(wfc), gbfc = up(bfc);
    Floats mean(static_cast<size_t>(N)), rstd(mean.size()), res(NC), lse(size_t(B) * NH * T);
    auto gmean = up(mean), grstd = up(rstd), gres = up(res), glse = up(lse);

    Halves ln(NC);
    auto gln = up(ln);
    cpu.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), 1e-5f, N, C);
    gpu.layernorm_forward(gln.data(), gmean.data(), grstd.data(), gx.data(), glnw.data(), glnb.data(), 1e-5f,
                          N, C);
    cmp("BF16 activations: layernorm_forward out", gln, ln, kBf16);
    cpu.residual_layernorm_forward(res.data(), ln.data(), mean.data(), rstd.data(), x.data(), d.data(),
                                   lnb.data(), lnw.data(), lnb.data(), 1e-5f, N, C);
    gpu.residual_layernorm_forward(gres.data(), gln.data(), gmean.data(), grstd.data(), gx.data(), gd.data(),
                                   glnb.data(), glnw.data(), glnb.data(), 1e-5f, N, C);
    cmp("BF16 activations: residual_layernorm_forward ln_out", gln, ln, kBf16);
    cmp("BF16 activations: residual_layernorm_forward res_out", gres, res, kElementwise);

    gln = up(ln);  // the CPU's from here on
    Halves qkv(3 * NC), att(NC), pre(size_t(N) * H), act(pre.size());
    auto gqkv = up(qkv), gatt = up(att), gpre = up(pre), gact = up(act);
    cpu.matmul_forward(qkv.data(), ln.data(), wqkv.data(), bqkv.data(), N, C, 3 * C);
    gpu.matmul_forward(gqkv.data(), gln.data(), gwqkv.data(), gbqkv.data(), N, C, 3 * C);
    cmp("BF16 activations: matmul_forward", gqkv, qkv, kBf16);
    gqkv = up(qkv);
    const AttentionShape shape{NH, NH, C / NH, 0};
    cpu.attention_forward(att.data(), lse.data(), qkv.data(), nullptr, B, T, shape);
    gpu.attention_forward(gatt.data(), glse.data(), gqkv.data(), nullptr, B, T, shape);
    cmp("BF16 activations: attention_forward out", gatt, att, kBf16);
    // With documents: the FP32 kernel, its operands widened and its output rounded as the CPU rounds.
    const Ints starts = doc_starts(rng, B, T, 3);
    auto gstarts = up(starts);
    Halves datt(NC);
    auto gdatt = up(datt);
    cpu.attention_forward(datt.data(), lse.data(), qkv.data(), starts.data(), B, T, shape);
    gpu.attention_forward(gdatt.data(), glse.data(), gqkv.data(), gstarts.data(), B, T, shape);
    cmp("BF16 activations: attention_forward out (documents)", gdatt, datt, kBf16);
    cpu.attention_forward(att.data(), lse.data(), qkv.data(), nullptr, B, T, shape);
    Floats dqkv(3 * NC);
    auto gdqkv = up(dqkv), gdout = up(dqkv_out), clse = up(lse);
    auto catt = up(att);
    cpu.attention_backward(dqkv.data(), dqkv_out.data(), qkv.data(), att.data(), lse.data(), nullptr, B, T,
                           shape);
    gpu.attention_backward(gdqkv.data(), gdout.data(), gqkv.data(), catt.data(), clse.data(), nullptr, B, T,
                           shape);
    cmp("BF16 activations: attention_backward dqkv", gdqkv, dqkv, 2 * kBf16);

    cpu.matmul_bias_gelu_forward(act.data(), pre.data(), ln.data(), wfc.data(), bfc.data(), N, C, H);
    gpu.matmul_bias_gelu_forward(gact.data(), gpre.data(), gln.data(), gwfc.data(), gbfc.data(), N, C, H);
    cmp("BF16 activations: matmul_bias_gelu_forward out", gact, act, kBf16);
    cmp("BF16 activations: matmul_bias_gelu_forward pre", gpre, pre, kBf16);
    Floats dpre = dfc;
    auto gdpre = up(dpre);
    auto cpre = up(pre);
    cpu.gelu_backward(dpre.data(), pre.data(), N, H);
    gpu.gelu_backward(gdpre.data(), cpre.data(), N, H);
    cmp("BF16 activations: gelu_backward", gdpre, dpre, kElementwise);
    Floats dln(NC), dw(wfc.size()), db(bfc.size());
    auto gdln = up(dln), gdw = up(dw), gdb = up(db), gdfc = up(dfc);
    cpu.matmul_backward(dln.data(), dw.data(), db.data(), dfc.data(), ln.data(), wfc.data(), N, C, H);
    gpu.matmul_backward(gdln.data(), gdw.data(), gdb.data(), gdfc.data(), gln.data(), gwfc.data(), N, C, H);
    cmp("BF16 activations: matmul_backward din", gdln, dln, kBf16);
    cmp("BF16 activations: matmul_backward dweight", gdw, dw, kBf16);
    gpu.set_bf16_products(false);
  }

  void optimizer() {
    const Floats x = rng.floats(1001, -3, 3);
    const std::vector<FlatRange> ranges{{3, 250}, {400, 401}, {10, 10}, {500, 999}};
    auto gx = up(x);
    report.number("sum_squares (4 ranges, one empty)", gpu.sum_squares(gx.data(), ranges),
                  cpu.sum_squares(x.data(), ranges), kDouble);
    report.number("sum_squares (no ranges)", gpu.sum_squares(gx.data(), {}), 0.0, kExact);
    Floats y = x;
    cpu.scale(y.data(), 0.73f, ranges);
    gpu.scale(gx.data(), 0.73f, ranges);
    cmp("scale (4 ranges)", gx, y, kElementwise);

    // Three segments over 301 weights, one left out (137..149), one without decay; moments packed (288).
    const std::vector<AdamWSegment> segments{
        {0, 100, 0, true}, {100, 137, 100, false}, {150, 301, 137, true}};
    const Floats w0 = rng.floats(301);
    Floats w = w0, m(288, 0.0f), v(288, 0.0f);
    auto gw = up(w), gm = up(m), gv = up(v);
    const float beta1 = 0.9f, beta2 = 0.95f, lr = 1e-2f, decay = 0.1f;
    for (int t = 1; t <= 3; ++t) {
      const Floats g = rng.floats(w.size());
      auto gg = up(g);
      AdamWStep step;
      step.beta1 = beta1, step.beta2 = beta2, step.eps = 1e-8f;
      step.step_size = float(lr / (1.0 - std::pow(double(beta1), t)));
      step.inv_sqrt_bc2 = float(1.0 / std::sqrt(1.0 - std::pow(double(beta2), t)));
      step.keep = 1.0f - lr * decay;
      cpu.adamw(w.data(), g.data(), m.data(), v.data(), segments, step);
      gpu.adamw(gw.data(), gg.data(), gm.data(), gv.data(), segments, step);
    }
    cmp("adamw weights (3 steps, 3 segments)", gw, w, kElementwise);
    cmp("adamw m", gm, m, kElementwise);
    cmp("adamw v", gv, v, kElementwise);
    // What the steps changed, against the CPU's change: the update itself to 1e-4.
    const Floats got = down(gw);
    Floats du(w.size()), wu(w.size());
    for (size_t i = 0; i < w.size(); ++i) du[i] = got[i] - w0[i], wu[i] = w[i] - w0[i];
    report.floats("adamw update (weights - initial)", du, wu, kSums);
  }
};

}  // namespace

bool check_backend(uint64_t seed, int device) {
  Report report;
  Rng rng(seed);
  std::unique_ptr<Backend> gpu;
  try {
    gpu = make_cuda_backend(device);
  } catch (const std::exception& e) {
    report.error("make_cuda_backend", e.what());
    return report.print();
  }
  Checker check{cpu_backend(), *gpu, rng, report};
  // A failing call (a launch or cuBLASLt error) is one failed line; the other ops still run.
  const auto run = [&](const char* what, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      report.error(what, e.what());
    }
  };
  run("memory", [&] { check.memory(); });
  run("release, acquire", [&] { check.release(); });
  run("embedding",
      [&] { check.embedding(true, true), check.embedding(false, true), check.embedding(true, false); });
  run("layernorm", [&] { check.layernorm(45), check.layernorm(48); });
  run("residual", [&] { check.residual(); });
  run("matmul", [&] { check.matmul(33, true), check.matmul(33, false), check.matmul(1, true); });
  run("attention", [&] {
    for (const AttentionShape& shape :
         {AttentionShape{3, 3, 12, 0}, AttentionShape{3, 3, 40, 0}, AttentionShape{8, 2, 12, 0},
          AttentionShape{4, 1, 20, 0}, AttentionShape{8, 2, 40, 5}, AttentionShape{3, 3, 12, 30}})
      for (bool documents : {true, false}) check.attention(shape, documents);
  });
  run("attention_decode", [&] {
    check.attention_decode({3, 3, 12, 0}), check.attention_decode({8, 2, 12, 4});
  });
  run("attention_chunk_forward, attention_chunk_backward", [&] {
    struct Case {
      AttentionShape shape;
      int n;
      bool documents;
    };
    // n = 45 and 100: tails of the kernels' 32-row tiles; head dims 40 and 64, and 12, 128 and 256 (each
    // width the kernels pad to); grouped-query heads (4 on 2, 2 on 1); windows shorter than a chunk and
    // longer; documents.
    for (const Case& c :
         {Case{{4, 4, 64, 0}, 45, false}, Case{{4, 4, 40, 0}, 100, false}, Case{{4, 2, 64, 0}, 45, false},
          Case{{4, 2, 40, 0}, 100, true}, Case{{4, 4, 64, 0}, 45, true}, Case{{4, 2, 40, 20}, 45, false},
          Case{{4, 2, 64, 130}, 100, true}, Case{{2, 1, 12, 0}, 45, true}, Case{{2, 2, 128, 0}, 45, false},
          Case{{2, 1, 256, 60}, 45, false}})
      check.chunk_attention(c.shape, c.n, c.documents);
  });
  run("attention_delta", [&] { check.attention_delta({4, 2, 40, 0}), check.attention_delta({3, 3, 64, 0}); });
  run("copy_rows", [&] { check.copy_rows(); });
  run("convert", [&] { check.convert(); });
  run("rmsnorm", [&] {
    for (const auto& [N, C] : {std::pair{29, 45}, std::pair{29, 48}, std::pair{29, 520}, std::pair{29, 2048},
                               std::pair{2100, 45}, std::pair{2100, 48}})
      check.rmsnorm(N, C);
  });
  run("head_rmsnorm", [&] {
    for (const AttentionShape& shape :
         {AttentionShape{8, 2, 12, 0}, AttentionShape{3, 3, 10, 0}, AttentionShape{4, 2, 128, 0}})
      check.head_rmsnorm(29, shape), check.head_rmsnorm(700, shape);
  });
  // Sequence parallelism; named as the ops, so that an op that throws is an "(error)" line
  // scripts/gpu/check.sh counts under them.
  for (bool layernorm : {false, true})
    run(layernorm ? "layernorm_backward_partials" : "rmsnorm_backward_partials", [&] {
      for (int C : {96, 4096})
        for (int N : {96, 71}) check.norm_partials(layernorm, N, C);
    });
  run("add_chunk_sums", [&] {
    check.chunk_sums(5, 96, 192), check.chunk_sums(3, 4096, 8192), check.chunk_sums(1, 1000, 1000);
  });
  run("swiglu", [&] {
    for (int H : {37, 48}) check.swiglu(29, H);
  });
  run("rope", [&] {
    for (const AttentionShape& shape : {AttentionShape{8, 2, 12, 0}, AttentionShape{4, 2, 16, 0},
                                        AttentionShape{2, 1, 128, 0}, AttentionShape{3, 3, 10, 0}})
      for (bool yarn : {false, true}) check.rope(shape, yarn);
  });
  run("gelu", [&] { check.gelu(); });
  run("moe", [&] { check.moe(true, false), check.moe(false, false), check.moe(true, true); });
  run("cross_entropy", [&] {
    check.cross_entropy(true, true, false), check.cross_entropy(false, false, false);
    check.cross_entropy(true, true, true);
  });
  run("distillation", [&] {
    check.distillation(true, true, false, false), check.distillation(false, false, false, false);
    check.distillation(true, true, true, false), check.distillation(true, true, false, true);
    check.empty_losses();
  });
  run("bf16", [&] { check.bf16(); });
  run("bf16 products", [&] { check.bf16_products(); });
  run("bf16 activations", [&] { check.bf16_storage(); });
  run("optimizer", [&] { check.optimizer(); });
  return report.print();
}

}  // namespace forge::trainer::cuda::check
