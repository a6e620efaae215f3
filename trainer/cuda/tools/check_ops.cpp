// Each CUDA op against its CPU op on fresh random data. BF16 runs feed both sides the same BF16-rounded
// inputs, so the comparison measures the GPU op, not the rounding of its inputs.
#include "check.h"
#include "cpu/kernels.h"
#include "forge/comm/comm.h"
#include "forge/common/hash.h"
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/grouped_gemm.h"
#include "forge/trainer/cuda/nccl_comm.h"
#include "forge/trainer/cuda/ops.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"
#include "forge/trainer/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <tuple>
#include <type_traits>

namespace forge::trainer::cuda::check {

namespace {

using Vec = std::vector<float>;

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  float uniform(float lo, float hi) {
    const uint64_t r = splitmix64(state_++);
    return lo + (hi - lo) * float(double(r >> 11) * 0x1.0p-53);
  }
  Vec vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    Vec v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  std::vector<int32_t> ints(size_t n, int32_t bound) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(splitmix64(state_++) % uint64_t(bound));
    return v;
  }

 private:
  uint64_t state_;
};

double rel_err(std::span<const float> got, std::span<const float> want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// A device copy of host floats as T, and back.
template <class T>
DeviceBuffer up(const Vec& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  if constexpr (std::is_same_v<T, float>) {
    to_device(d.as<void>(), host.data(), host.size() * sizeof(float));
  } else {
    std::vector<T> tmp(host.size());
    for (size_t i = 0; i < host.size(); ++i) tmp[i] = __float2bfloat16_rn(host[i]);
    to_device(d.as<void>(), tmp.data(), tmp.size() * sizeof(T));
  }
  return d;
}

DeviceBuffer up_ints(const std::vector<int32_t>& host) {
  DeviceBuffer d(host.size() * sizeof(int32_t));
  to_device(d.as<void>(), host.data(), host.size() * sizeof(int32_t));
  return d;
}

template <class T>
Vec down(const DeviceBuffer& d, size_t n) {
  Vec out(n);
  if constexpr (std::is_same_v<T, float>) {
    to_host(out.data(), d.as<void>(), n * sizeof(float));
  } else {
    std::vector<T> tmp(n);
    to_host(tmp.data(), d.as<void>(), n * sizeof(T));
    for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(tmp[i]);
  }
  return out;
}

template <class T>
struct Checker {
  Table& table;
  Rng& rng;
  static constexpr bool kBf16 = !std::is_same_v<T, float>;
  const char* dtype = kBf16 ? "bf16" : "fp32";
  double tol = kBf16 ? 1e-2 : 1e-4;

  // Inputs the GPU reads as T: rounded to BF16 on the host too in BF16 mode.
  Vec in(size_t n, float lo = -1.0f, float hi = 1.0f) {
    Vec v = rng.vec(n, lo, hi);
    if (kBf16) cpu::round_to_bf16(v.data(), int64_t(v.size()));
    return v;
  }
  void cmp(const std::string& what, const Vec& got, const Vec& want) {
    table.add(what, dtype, rel_err(got, want), tol);
  }

  void embedding() {
    const int B = 2, T_ = 37, C = 96, V = 50;
    const auto tokens = rng.ints(size_t(B) * T_, V);
    const Vec wte = in(size_t(V) * C), wpe = in(size_t(T_) * C);
    Vec out(size_t(B) * T_ * C);
    cpu::embedding_forward(out.data(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T_, C);
    DeviceBuffer dt = up_ints(tokens);
    DeviceBuffer dwte = up<T>(wte), dwpe = up<T>(wpe);
    DeviceBuffer dout(out.size() * sizeof(float));
    embedding_forward<T>(dout.as<float>(), dt.as<int32_t>(), dwte.as<T>(), dwpe.as<T>(), B, T_, C);
    cmp("embedding forward", down<float>(dout, out.size()), out);
    if (kBf16) return;  // the backward has FP32 inputs and outputs only
    const Vec g = rng.vec(out.size()), gwte0 = rng.vec(wte.size()), gwpe0 = rng.vec(wpe.size());
    Vec gwte = gwte0, gwpe = gwpe0;
    cpu::embedding_backward(gwte.data(), gwpe.data(), g.data(), tokens.data(), nullptr, B, T_, C);
    DeviceBuffer dg = up<float>(g), dgwte = up<float>(gwte0), dgwpe = up<float>(gwpe0);
    embedding_backward(dgwte.as<float>(), dgwpe.as<float>(), dg.as<float>(), dt.as<int32_t>(), B, T_, C);
    cmp("embedding backward dwte", down<float>(dgwte, gwte.size()), gwte);
    cmp("embedding backward dwpe", down<float>(dgwpe, gwpe.size()), gwpe);
  }

  // C % 4 == 0 takes the 4-wide kernels, other widths the scalar ones.
  void layernorm(int C) {
    const int N = 300;
    const std::string tag = C % 4 == 0 ? "" : " (C % 4 != 0)";
    const Vec x = rng.vec(size_t(N) * C, -2, 2), w = in(size_t(C), 0.5f, 1.5f),
              b = in(static_cast<size_t>(C));
    Vec out(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1e-5f, N, C);
    DeviceBuffer dx = up<float>(x), dw = up<T>(w), db = up<T>(b);
    DeviceBuffer dout(out.size() * sizeof(T)), dmean(size_t(N) * 4), drstd(size_t(N) * 4);
    layernorm_forward<T>(dout.as<T>(), dmean.as<float>(), drstd.as<float>(), dx.as<float>(), dw.as<T>(),
                         db.as<T>(), 1e-5f, N, C);
    cmp("layernorm forward" + tag, down<T>(dout, out.size()), out);
    cmp("layernorm forward rstd" + tag, down<float>(drstd, rstd.size()), rstd);
    // Backward (accumulating into din, dweight, dbias that start non-zero).
    const Vec g = in(x.size()), din0 = rng.vec(x.size()), dw0 = rng.vec(static_cast<size_t>(C)),
              db0 = rng.vec(static_cast<size_t>(C));
    Vec din = din0, gw = dw0, gb = db0;
    cpu::layernorm_backward(din.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    DeviceBuffer dg = up<T>(g), ddin = up<float>(din0), dgw = up<float>(dw0), dgb = up<float>(db0);
    DeviceBuffer cmean = up<float>(mean), crstd = up<float>(rstd), ddin_t(din.size() * sizeof(T));
    layernorm_backward<T>(ddin.as<float>(), kBf16 ? ddin_t.as<T>() : nullptr, dgw.as<float>(),
                          dgb.as<float>(), dg.as<T>(), dx.as<float>(), dw.as<T>(), cmean.as<float>(),
                          crstd.as<float>(), N, C);
    cmp("layernorm backward din" + tag, down<float>(ddin, din.size()), din);
    if (kBf16) cmp("layernorm backward din (bf16 copy)" + tag, down<T>(ddin_t, din.size()), din);
    cmp("layernorm backward dweight" + tag, down<float>(dgw, gw.size()), gw);
    cmp("layernorm backward dbias" + tag, down<float>(dgb, gb.size()), gb);
  }

  void residual_layernorm() {
    const int N = 300, C = 192;
    const Vec r = rng.vec(size_t(N) * C), d = rng.vec(r.size()), dbias = in(static_cast<size_t>(C)),
              w = in(size_t(C), 0.5f, 1.5f), b = in(static_cast<size_t>(C));
    Vec res(r.size()), ln(r.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    cpu::residual_layernorm_forward(res.data(), ln.data(), mean.data(), rstd.data(), r.data(), d.data(),
                                    dbias.data(), w.data(), b.data(), 1e-5f, N, C);
    DeviceBuffer dr = up<float>(r), dd = up<float>(d), ddb = up<T>(dbias), dw = up<T>(w), db = up<T>(b);
    DeviceBuffer dres(res.size() * 4), dln(ln.size() * sizeof(T)), dm(size_t(N) * 4), ds(size_t(N) * 4);
    residual_layernorm_forward<T>(dres.as<float>(), dln.as<T>(), dm.as<float>(), ds.as<float>(),
                                  dr.as<float>(), dd.as<float>(), ddb.as<T>(), dw.as<T>(), db.as<T>(), 1e-5f,
                                  N, C);
    cmp("residual+layernorm forward res", down<float>(dres, res.size()), res);
    cmp("residual+layernorm forward ln", down<T>(dln, ln.size()), ln);
  }

  void matmul() {
    const int N = 200, C = 128, OC = 384;
    const Vec x = in(size_t(N) * C), w = in(size_t(OC) * C, -0.1f, 0.1f), bias = in(static_cast<size_t>(OC));
    Vec out(size_t(N) * OC);
    cpu::matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, C, OC);
    DeviceBuffer dx = up<T>(x), dw = up<T>(w), db = up<T>(bias);
    DeviceBuffer dout(out.size() * sizeof(T));
    matmul_forward<T, T>(dout.as<T>(), dx.as<T>(), dw.as<T>(), db.as<T>(), N, C, OC);
    cmp("matmul forward (+bias)", down<T>(dout, out.size()), out);
    // FP32 output, no bias (the residual branch's products).
    Vec out2(out.size());
    cpu::matmul_forward(out2.data(), x.data(), w.data(), nullptr, N, C, OC);
    DeviceBuffer dout2(out.size() * sizeof(float));
    matmul_forward<T, float>(dout2.as<float>(), dx.as<T>(), dw.as<T>(), nullptr, N, C, OC);
    cmp("matmul forward (fp32 out)", down<float>(dout2, out2.size()), out2);
    const Vec g = in(out.size()), gw0 = rng.vec(w.size()), gb0 = rng.vec(bias.size());
    Vec din(x.size()), gw = gw0, gb = gb0;
    cpu::matmul_backward(din.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(), N, C, OC);
    DeviceBuffer dg = up<T>(g), dgw = up<float>(gw0), dgb = up<float>(gb0);
    DeviceBuffer ddin(din.size() * sizeof(T));
    matmul_backward<T>(ddin.as<T>(), dgw.as<float>(), dgb.as<float>(), dg.as<T>(), dx.as<T>(), dw.as<T>(), N,
                       C, OC);
    cmp("matmul backward din", down<T>(ddin, din.size()), din);
    cmp("matmul backward dweight", down<float>(dgw, gw.size()), gw);
    cmp("matmul backward dbias", down<float>(dgb, gb.size()), gb);
  }

  // The MoE experts' products (grouped_gemm.h): per expert its rows times its weight, against the CPU
  // matmul per expert. Random group sizes, one expert without rows (its gradients must stay as they were),
  // and odd row offsets (expert row blocks less aligned than cuBLASLt's default).
  void grouped_matmul() {
    const int E = 5, C = 128, OC = 192, empty = 2;
    std::vector<int> begin(size_t(E) + 1, 0);
    const auto sizes = rng.ints(size_t(E), 97);
    for (int e = 0; e < E; ++e)
      begin[size_t(e) + 1] = begin[size_t(e)] + (e == empty ? 0 : 1 + sizes[size_t(e)]);
    const int R = begin[size_t(E)];
    const Vec x = in(size_t(R) * C), w = in(size_t(E) * OC * C, -0.1f, 0.1f), bias = in(size_t(E) * OC);
    const auto rows = [&](int e) { return begin[size_t(e) + 1] - begin[size_t(e)]; };
    const auto at = [&](int e, int width) { return int64_t(begin[size_t(e)]) * width; };
    Vec out(size_t(R) * OC), out2(out.size());
    for (int e = 0; e < E; ++e) {
      if (rows(e) == 0) continue;
      cpu::matmul_forward(out.data() + at(e, OC), x.data() + at(e, C), w.data() + int64_t(e) * OC * C,
                          bias.data() + int64_t(e) * OC, rows(e), C, OC);
      cpu::matmul_forward(out2.data() + at(e, OC), x.data() + at(e, C), w.data() + int64_t(e) * OC * C,
                          nullptr, rows(e), C, OC);
    }
    DeviceBuffer dx = up<T>(x), dw = up<T>(w), db = up<T>(bias);
    DeviceBuffer dout(out.size() * sizeof(T)), dout2(out2.size() * sizeof(float));
    grouped_matmul_forward<T, T>(dout.as<T>(), dx.as<T>(), dw.as<T>(), db.as<T>(), begin.data(), E, C, OC);
    cmp("grouped matmul forward (+bias)", down<T>(dout, out.size()), out);
    grouped_matmul_forward<T, float>(dout2.as<float>(), dx.as<T>(), dw.as<T>(), nullptr, begin.data(), E, C,
                                     OC);
    cmp("grouped matmul forward (fp32 out)", down<float>(dout2, out2.size()), out2);
    // Backward, accumulating into weight and bias gradients that start non-zero.
    const Vec g = in(out.size()), gw0 = rng.vec(w.size()), gb0 = rng.vec(bias.size());
    Vec din(x.size()), gw = gw0, gb = gb0;
    for (int e = 0; e < E; ++e) {
      if (rows(e) == 0) continue;
      cpu::matmul_backward(din.data() + at(e, C), gw.data() + int64_t(e) * OC * C,
                           gb.data() + int64_t(e) * OC, g.data() + at(e, OC), x.data() + at(e, C),
                           w.data() + int64_t(e) * OC * C, rows(e), C, OC);
    }
    DeviceBuffer dg = up<T>(g), dgw = up<float>(gw0), dgb = up<float>(gb0);
    DeviceBuffer ddin(din.size() * sizeof(T));
    grouped_matmul_backward<T>(ddin.as<T>(), dgw.as<float>(), dgb.as<float>(), dg.as<T>(), dx.as<T>(),
                               dw.as<T>(), begin.data(), E, C, OC);
    cmp("grouped matmul backward din", down<T>(ddin, din.size()), din);
    cmp("grouped matmul backward dweight", down<float>(dgw, gw.size()), gw);
    cmp("grouped matmul backward dbias", down<float>(dgb, gb.size()), gb);
  }

  // The MLP's first product as the model runs it: bias and GELU fused into the forward product, GELU's
  // derivative into the backward one (cuBLASLt epilogues, or the separate kernels when `tag` says off).
  void fused_mlp(const std::string& tag) {
    const int N = 256, C = 128, OC = 512;
    const Vec x = in(size_t(N) * C, -2, 2), w = in(size_t(OC) * C, -0.2f, 0.2f), bias = in(size_t(OC));
    Vec pre(size_t(N) * OC), out(pre.size());
    cpu::matmul_forward(pre.data(), x.data(), w.data(), nullptr, N, C, OC);
    cpu::bias_gelu_forward(out.data(), pre.data(), bias.data(), N, OC);
    DeviceBuffer dx = up<T>(x), dw = up<T>(w), db = up<T>(bias);
    DeviceBuffer dpre(pre.size() * sizeof(T)), dout(out.size() * sizeof(T));
    matmul_bias_gelu_forward<T>(dout.as<T>(), dpre.as<T>(), dx.as<T>(), dw.as<T>(), db.as<T>(), N, C, OC);
    cmp("matmul+bias+gelu forward" + tag, down<T>(dout, out.size()), out);
    cmp("matmul+bias+gelu forward pre" + tag, down<T>(dpre, pre.size()), pre);
    // Backward through the next product (w2: [C, OC]) into the GELU input, from the same rounded pre.
    if (kBf16)
      cpu::round_to_bf16(pre.data(), int64_t(pre.size())),
          cpu::round_to_bf16(out.data(), int64_t(out.size()));
    const Vec w2 = in(size_t(C) * OC, -0.2f, 0.2f), g = in(size_t(N) * C), gw0 = rng.vec(w2.size()),
              gb0 = rng.vec(size_t(C));
    Vec din(pre.size()), gw = gw0, gb = gb0;
    cpu::matmul_backward(din.data(), gw.data(), gb.data(), g.data(), out.data(), w2.data(), N, OC, C);
    cpu::gelu_backward(din.data(), pre.data(), N, OC);
    DeviceBuffer dpre_r = up<T>(pre), dw2 = up<T>(w2), dg = up<T>(g), dgw = up<float>(gw0),
                 dgb = up<float>(gb0);
    DeviceBuffer dact = up<T>(out), ddin(din.size() * sizeof(T));
    matmul_backward<T>(ddin.as<T>(), dgw.as<float>(), dgb.as<float>(), dg.as<T>(), dact.as<T>(), dw2.as<T>(),
                       N, OC, C, dpre_r.as<T>());
    cmp("matmul backward din*gelu'" + tag, down<T>(ddin, din.size()), din);
    cmp("matmul backward dweight" + tag, down<float>(dgw, gw.size()), gw);
    cmp("matmul backward dbias" + tag, down<float>(dgb, gb.size()), gb);
  }

  // T = 200: three full 64-row tiles and a partial one (the tensor-core kernels' tile), seven and a
  // partial of 32 (the CUDA-core kernels'). `path` names the kernels in the row. kv_heads < NH: grouped-query
  // heads; window 70: a sliding window that starts mid-tile for both tile sizes and leaves the first tiles
  // of a walk partly or wholly outside it.
  void attention(int NH, int hd, const std::string& path = "", int kv_heads = 0, int window = 0) {
    const AttentionShape shape{NH, kv_heads > 0 ? kv_heads : NH, hd, window};
    const int B = 2, T_ = 200;
    std::string tag = " (hd " + std::to_string(hd);
    if (shape.kv_heads != NH)
      tag += ", " + std::to_string(NH) + "/" + std::to_string(shape.kv_heads) + " heads";
    if (window > 0) tag += ", window " + std::to_string(window);
    tag += (path.empty() ? "" : ", " + path) + ")";
    const Vec qkv = in(size_t(B) * T_ * shape.qkv_width(), -2, 2);
    Vec out(size_t(B) * T_ * shape.q_width()), lse(size_t(B) * NH * T_);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), nullptr, B, T_, shape);
    DeviceBuffer dqkv_in = up<T>(qkv);
    DeviceBuffer dout(out.size() * sizeof(T)), dlse(lse.size() * 4);
    attention_forward<T>(dout.as<T>(), dlse.as<float>(), dqkv_in.as<T>(), B, T_, shape);
    cmp("attention forward" + tag, down<T>(dout, out.size()), out);
    cmp("attention forward lse" + tag, down<float>(dlse, lse.size()), lse);
    // Backward from the CPU forward's (rounded) output and log-sum-exp on both sides.
    Vec o = out;
    if (kBf16) cpu::round_to_bf16(o.data(), int64_t(o.size()));
    const Vec g = in(out.size());
    Vec dqkv(qkv.size());
    cpu::attention_backward(dqkv.data(), g.data(), qkv.data(), o.data(), lse.data(), nullptr, B, T_, shape);
    DeviceBuffer dg = up<T>(g), dO = up<T>(o), dL = up<float>(lse);
    DeviceBuffer ddqkv(qkv.size() * sizeof(T)), scratch(lse.size() * 4);
    attention_backward<T>(ddqkv.as<T>(), scratch.as<float>(), dg.as<T>(), dqkv_in.as<T>(), dO.as<T>(),
                          dL.as<float>(), B, T_, shape);
    cmp("attention backward dqkv" + tag, down<T>(ddqkv, dqkv.size()), dqkv);
  }

  void gelu() {
    const int N = 200, C = 512;
    const Vec pre0 = in(size_t(N) * C, -4, 4), bias = in(static_cast<size_t>(C));
    Vec pre = pre0, out(pre.size());
    cpu::bias_gelu_forward(out.data(), pre.data(), bias.data(), N, C);
    DeviceBuffer dpre = up<T>(pre0), db = up<T>(bias);
    DeviceBuffer dout(out.size() * sizeof(T));
    bias_gelu_forward<T>(dout.as<T>(), dpre.as<T>(), db.as<T>(), N, C);
    cmp("bias+gelu forward", down<T>(dout, out.size()), out);
    cmp("bias+gelu forward pre", down<T>(dpre, pre.size()), pre);
    if (kBf16) cpu::round_to_bf16(pre.data(), int64_t(pre.size()));
    const Vec g = in(pre.size());
    Vec d = g;
    cpu::gelu_backward(d.data(), pre.data(), N, C);
    DeviceBuffer dd = up<T>(g), dp = up<T>(pre);
    gelu_backward<T>(dd.as<T>(), dp.as<T>(), N, C);
    cmp("gelu backward", down<T>(dd, d.size()), d);
  }

  void classifier() {
    const int N = 300, C = 128, V = 1000;
    const Vec x = in(size_t(N) * C), wte = in(size_t(V) * C, -0.2f, 0.2f), gw0 = rng.vec(wte.size());
    const auto targets = rng.ints(size_t(N), V);
    const float scale = 1.0f / N;
    Vec dx(x.size()), gw = gw0;
    // The CPU model's classifier and loss (layers.h) as the reference.
    ParamInfo info;
    info.name = "wte.weight";
    info.shape = info.local_shape = {V, C};
    Classifier reference(cpu_backend(), {&info, wte.data(), gw.data()}, 0);
    DeviceBatch batch;
    batch.targets = targets.data();
    const double loss =
        reference.forward_backward(dx.data(), x.data(), batch, N, LmCrossEntropy(), scale, nullptr);
    DeviceBuffer ddx(dx.size() * sizeof(T));
    DeviceBuffer dxin = up<T>(x), dw = up<T>(wte), dgw = up<float>(gw0), dt = up_ints(targets);
    const double got = classifier_forward_backward<T>(ddx.as<T>(), dgw.as<float>(), dxin.as<T>(), dw.as<T>(),
                                                      dt.as<int32_t>(), N, C, V, scale);
    const float gl = float(got), wl = float(loss);
    cmp("classifier+xent loss", Vec{gl}, Vec{wl});
    cmp("classifier+xent dx", down<T>(ddx, dx.size()), dx);
    cmp("classifier+xent dwte", down<float>(dgw, gw.size()), gw);
  }

  void optimizer() {
    if (kBf16) return;
    // Two AdamW steps over a two-tensor table (one decayed, one not), the second with a clipping factor.
    ModelSpec mc = gpt2_spec(1, 64, 2, 100, 16, 16);
    const auto params = parameter_table(mc);
    const size_t P = params.back().offset + params.back().numel;
    OptimConfig oc;
    oc.weight_decay = 0.1;
    const Vec w0 = rng.vec(P), g = rng.vec(P);
    Vec w = w0, gc = g;
    AdamW cpu_opt(oc, params, P);
    cpu_opt.step(w, g, 1e-3);
    const double norm = clip_grad_norm(gc, 1.0);
    cpu_opt.step(w, gc, 5e-4);
    DeviceBuffer dw = up<float>(w0), dg = up<float>(g);
    DeviceBuffer m(P * 4), v(P * 4), dn(sizeof(double));
    m.zero();
    v.zero();
    dn.zero();
    sum_squares(dn.as<double>(), dg.as<float>(), P);
    double got_norm = 0;
    to_host(&got_norm, dn.as<void>(), sizeof(double));
    got_norm = std::sqrt(got_norm);
    for (int t = 1; t <= 2; ++t) {
      const double lr = t == 1 ? 1e-3 : 5e-4;
      const float clip = t == 1 ? 1.0f : float(std::min(1.0, 1.0 / (norm + 1e-6)));
      const float step_size = float(lr / (1.0 - std::pow(oc.beta1, t)));
      const float isb = float(1.0 / std::sqrt(1.0 - std::pow(oc.beta2, t)));
      for (const auto& p : params)
        adamw_update<float>(dw.as<float>() + p.offset, nullptr, dg.as<float>() + p.offset,
                            m.as<float>() + p.offset, v.as<float>() + p.offset, p.numel, clip,
                            float(oc.beta1), float(oc.beta2), float(oc.eps),
                            p.decay ? float(1.0 - lr * oc.weight_decay) : 1.0f, step_size, isb);
    }
    cmp("grad norm", Vec{float(got_norm)}, Vec{float(norm)});
    // Compare the updates (w - w0), not the weights, so the tolerance applies to what AdamW changed.
    Vec got = down<float>(dw, P), du(P), wu(P);
    for (size_t i = 0; i < P; ++i) du[i] = got[i] - w0[i], wu[i] = w[i] - w0[i];
    cmp("adamw update (2 steps, clipped)", du, wu);
  }
};

void check_nccl(Table& table) {
  // One rank: the communicator's calls, streams, events and error checks run; the values must come back.
  auto comm = make_nccl_comm(0, 1, "world", [](void*, size_t) {});
  const size_t n = 4096;
  Vec host(n);
  std::iota(host.begin(), host.end(), 0.0f);
  DeviceBuffer a = up<float>(host);
  DeviceBuffer gathered(n * 4);
  comm->all_reduce(a.as<float>(), n, comm::CommType::kF32, comm::ReduceOp::kSum)->wait();
  comm->all_gather(a.as<float>(), gathered.as<float>(), n, comm::CommType::kF32)->wait();
  auto req = comm->broadcast(gathered.as<float>(), n, comm::CommType::kF32, 0);
  while (!req->test()) {
  }
  comm->barrier();
  auto sub = comm->split(0, 0, "dp");
  sub->all_reduce(gathered.as<float>(), n, comm::CommType::kF32, comm::ReduceOp::kMax)->wait();
  table.add("nccl 1-rank all_reduce/all_gather/split", "fp32", rel_err(down<float>(gathered, n), host), 0);
}

}  // namespace

bool check_ops(uint64_t seed) {
  Table table;
  Rng rng(seed);
  Checker<float> f32{table, rng};
  Checker<bf16> b16{table, rng};
  // A failing call (a cuBLASLt or launch error) is one failed row; the other ops still run.
  const auto run = [&](const char* what, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      fmt::print("{}: {}\n", what, e.what());
      table.add(std::string(what) + " (error)", "-", std::numeric_limits<double>::quiet_NaN(), 0);
    }
  };
  run("embedding", [&] { f32.embedding(), b16.embedding(); });
  run("layernorm", [&] {
    for (int C : {192, 190}) f32.layernorm(C), b16.layernorm(C);
  });
  run("residual+layernorm", [&] { f32.residual_layernorm(), b16.residual_layernorm(); });
  run("matmul", [&] { f32.matmul(), b16.matmul(); });
  run("grouped matmul", [&] { f32.grouped_matmul(), b16.grouped_matmul(); });
  // Each head dim plain, then with fewer key/value heads (grouped-query, multi-query) and a sliding window.
  for (const auto& [nh, hd, kv] : {std::tuple{4, 32, 2}, std::tuple{3, 64, 1}, std::tuple{2, 128, 1}})
    for (const auto& [kv_heads, window] : {std::pair{nh, 0}, std::pair{kv, 70}})
      run("attention", [&] {
        f32.attention(nh, hd, "", kv_heads, window), b16.attention(nh, hd, "", kv_heads, window);
        // BF16 again on the other kernel sets: WMMA (head dim 128's default), CUDA cores (misaligned
        // tensors).
        for (const char* kernels : {"wmma", "simt"}) {
          setenv("FORGE_CUDA_ATTENTION", kernels, 1);
          b16.attention(nh, hd, kernels, kv_heads, window);
        }
        unsetenv("FORGE_CUDA_ATTENTION");
      });
  run("gelu", [&] { f32.gelu(), b16.gelu(); });
  run("fused mlp", [&] {
    f32.fused_mlp(""), b16.fused_mlp("");
    setenv("FORGE_CUDA_GEMM_FUSION", "off", 1);
    f32.fused_mlp(" (fusion off)"), b16.fused_mlp(" (fusion off)");
    unsetenv("FORGE_CUDA_GEMM_FUSION");
  });
  run("classifier", [&] { f32.classifier(), b16.classifier(); });
  run("adamw", [&] { f32.optimizer(); });
  run("nccl", [&] { check_nccl(table); });
  table.print("CUDA ops against the CPU ops (max |gpu - cpu| / max |cpu|)");
  return table.all_pass();
}

}  // namespace forge::trainer::cuda::check
