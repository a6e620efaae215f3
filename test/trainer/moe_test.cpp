// The Mixture-of-Experts layer against PyTorch (fixture written by reference/make_moe_fixture.py): routing,
// gates, capacity drops, output, load-balancing and z losses, and every gradient, for top-1 and top-2,
// dropless and capacity-bound. Tolerances relative to the largest magnitude of the reference tensor: output
// and gradients 1e-5, losses 1e-6 (relative). Measured: <= 3e-7 (the reference computes in float64).
// Also: forced uniform routing makes the load-balancing loss exactly its coefficient; an MoE model's
// logits do not depend on how many rows decode at once. The variants of released models (SwiGLU experts,
// gates renormalised over the top_k, no biases) against a plain double-precision layer written here, its
// gradients by central differences: output and gradients 1e-5, gates and losses 1e-6 (relative).
#include "h5_fixture.h"
#include "support/paths.h"

#include "support/training.h"

#include "forge/trainer/moe.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

using forge::test::H5Fixture;
using forge::test::rel_diff;
using namespace forge::trainer;

namespace {

std::string fixture_path() {
  return forge::test::source_path("test/trainer/reference/moe_parity.h5");
}

// The layer's parameters as plain host arrays, with table entries of their logical shapes: router, fc
// weight and bias, proj weight and bias. SwiGLU: fc is gate_up, [E, 2H, C] and [E, 2H]; proj is down.
struct Experts {
  int E, C, H;
  ParamInfo info[5];
  std::vector<float> value[5], grad[5];
  bool biases = true;  // false: the layer gets null bias references

  Experts(int experts, int C_, int H_, bool swiglu = false) : E(experts), C(C_), H(H_) {
    const int64_t F = swiglu ? 2 * H : H;
    const std::vector<std::vector<int64_t>> shapes = {{E, C}, {E, F, C}, {E, F}, {E, C, H}, {E, C}};
    for (size_t i = 0; i < 5; ++i) {
      info[i].shape = info[i].local_shape = shapes[i];
      size_t n = 1;
      for (int64_t d : shapes[i]) n *= size_t(d);
      info[i].numel = n;
      value[i].assign(n, 0.0f);
      grad[i].assign(n, 0.0f);
    }
  }
  ParamRef ref(int i) {
    if (!biases && (i == 2 || i == 4)) return {};
    return {&info[i], value[size_t(i)].data(), grad[size_t(i)].data()};
  }
  MoeLayer layer(const MoeSettings& settings, int rows) {
    return MoeLayer(cpu_backend(), settings, 0, ref(0), ref(1), ref(2), ref(3), ref(4),
                    LayerFactory::whole().token_exchange(), 1, rows);
  }
};

// A plain double-precision MoE layer and its loss L = sum(out x G) + aux + z (what make_moe_fixture.py
// differentiates), written from the definitions in moe.h: the reference of the variants.
struct ReferenceMoe {
  int N, E, C, H, k;
  bool swiglu, renormalize, biases;
  double capacity_factor, alpha, beta;

  struct Result {
    std::vector<int32_t> expert;  // [N, k]
    std::vector<double> gate;     // [N, k]
    std::vector<char> kept;       // [N, k]
    std::vector<double> out;      // [N, C]
    double aux = 0, z = 0, loss = 0;
    double gap = 0;  // the smallest margin of a token's k-th choice over the next probability
  };

  // p: router [E, C], fc [E, F, C], fc bias [E, F], proj [E, C, H], proj bias [E, C]; x [N, C]; g [N, C].
  Result run(const std::vector<double> (&p)[5], const std::vector<double>& x,
             const std::vector<double>& g) const {
    const int F = swiglu ? 2 * H : H;
    Result r;
    r.expert.assign(size_t(N) * k, -1);
    r.gate.assign(size_t(N) * k, 0);
    r.kept.assign(size_t(N) * k, 0);
    r.out.assign(size_t(N) * C, 0);
    r.gap = std::numeric_limits<double>::infinity();
    std::vector<double> mean_prob(size_t(E), 0), routed(size_t(E), 0), prob(size_t(E), 0.0);
    for (int t = 0; t < N; ++t) {
      double most = -1e300;
      for (int e = 0; e < E; ++e) {
        double l = 0;
        for (int c = 0; c < C; ++c) l += p[0][size_t(e) * C + size_t(c)] * x[size_t(t) * C + size_t(c)];
        prob[size_t(e)] = l;
        most = std::max(most, l);
      }
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(prob[size_t(e)] - most);
      const double lse = most + std::log(sum);
      r.z += lse * lse;
      for (int e = 0; e < E; ++e) {
        prob[size_t(e)] = std::exp(prob[size_t(e)] - lse);
        mean_prob[size_t(e)] += prob[size_t(e)] / N;
      }
      std::vector<int> order(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) order[size_t(e)] = e;
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return prob[size_t(a)] > prob[size_t(b)]; });
      if (k < E) r.gap = std::min(r.gap, prob[size_t(order[size_t(k) - 1])] - prob[size_t(order[size_t(k)])]);
      double chosen = 0;
      for (int j = 0; j < k; ++j) chosen += prob[size_t(order[size_t(j)])];
      for (int j = 0; j < k; ++j) {
        const int e = order[size_t(j)];
        r.expert[size_t(t) * k + size_t(j)] = e;
        r.gate[size_t(t) * k + size_t(j)] = renormalize ? prob[size_t(e)] / chosen : prob[size_t(e)];
        routed[size_t(e)] += 1.0 / (double(N) * k);
      }
    }
    for (int e = 0; e < E; ++e) r.aux += alpha * E * routed[size_t(e)] * mean_prob[size_t(e)];
    r.z *= beta / N;
    // Capacity: first choices of every token, then second ones, in token order.
    const double cap = capacity_factor > 0 ? std::ceil(capacity_factor * N * k / E) : 1e300;
    std::vector<double> taken(size_t(E), 0);
    for (int j = 0; j < k; ++j)
      for (int t = 0; t < N; ++t) {
        const size_t a = size_t(t) * k + size_t(j);
        if (taken[size_t(r.expert[a])] < cap) {
          taken[size_t(r.expert[a])] += 1;
          r.kept[a] = 1;
        }
      }
    std::vector<double> pre(static_cast<size_t>(F)), act(static_cast<size_t>(H));
    for (size_t a = 0; a < r.kept.size(); ++a) {
      if (!r.kept[a]) continue;
      const size_t t = a / size_t(k), e = size_t(r.expert[a]);
      for (int f = 0; f < F; ++f) {
        double v = biases ? p[2][e * F + size_t(f)] : 0.0;
        for (int c = 0; c < C; ++c) v += p[1][(e * F + size_t(f)) * C + size_t(c)] * x[t * C + size_t(c)];
        pre[size_t(f)] = v;
      }
      for (int h = 0; h < H; ++h) {
        const double u = pre[size_t(h)];
        act[size_t(h)] = swiglu ? u / (1 + std::exp(-u)) * pre[size_t(H + h)]
                                : 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
      }
      for (int c = 0; c < C; ++c) {
        double v = biases ? p[4][e * C + size_t(c)] : 0.0;
        for (int h = 0; h < H; ++h) v += p[3][(e * C + size_t(c)) * H + size_t(h)] * act[size_t(h)];
        r.out[t * C + size_t(c)] += r.gate[a] * v;
      }
    }
    r.loss = r.aux + r.z;
    for (size_t i = 0; i < r.out.size(); ++i) r.loss += r.out[i] * g[i];
    return r;
  }

  // dL/dv by central differences, for every element of v (which run reads through p and x).
  std::vector<float> gradient(std::vector<double>& v, const std::function<double()>& loss) const {
    std::vector<float> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i], h = 1e-5 * std::max(1.0, std::abs(keep));
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      d[i] = float((up - down) / (2 * h));
    }
    return d;
  }
};

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
std::vector<float> narrow(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

// One variant: the layer against ReferenceMoe on a small problem whose routing is far from ties.
void check_variant(bool swiglu, bool renormalize, bool biases, int k, double capacity_factor) {
  const int E = 4, C = 8, H = 12, N = 16;
  INFO("swiglu " << swiglu << ", renormalize " << renormalize << ", biases " << biases << ", top_k " << k
                 << ", capacity " << capacity_factor);
  Experts p(E, C, H, swiglu);
  p.biases = biases;
  for (int i = 0; i < 5; ++i) {
    auto& v = p.value[size_t(i)];
    const double scale = i == 0 ? 1.5 : 0.4;  // a sharp router: clear choices
    for (size_t j = 0; j < v.size(); ++j) v[j] = float(scale * std::sin(1.7 * double(j) + 0.9 * i + 0.3));
  }
  std::vector<float> x(size_t(N) * C), g(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(std::sin(0.37 * double(i) + 0.5)), g[i] = float(std::cos(0.23 * double(i)));
  MoeSettings s;
  s.experts = E;
  s.top_k = k;
  s.capacity_factor = capacity_factor;
  s.aux_coef = 0.05;  // larger than the default so that its gradient counts
  s.z_coef = 0.01;
  s.swiglu = swiglu;
  s.renormalize = renormalize;
  MoeLayer layer = p.layer(s, N);
  std::vector<float> out(x.size()), din(x.size());
  layer.forward(0, x.data(), out.data(), N);
  layer.backward(0, x.data(), g.data(), din.data(), N);
  const MoeLayer::Routing& r = layer.routing(0);

  const ReferenceMoe ref{N, E, C, H, k, swiglu, renormalize, biases, capacity_factor, s.aux_coef, s.z_coef};
  std::vector<double> pd[5], xd = widen(x);
  for (int i = 0; i < 5; ++i) pd[i] = widen(p.value[size_t(i)]);
  const ReferenceMoe::Result want = ref.run(pd, xd, widen(g));
  REQUIRE(want.gap > 1e-3);  // no choice flips within the differences' steps or the FP32 rounding
  CHECK(r.expert == want.expert);
  std::vector<char> kept(r.row.size());
  for (size_t a = 0; a < kept.size(); ++a) kept[a] = r.row[a] >= 0;
  CHECK(kept == want.kept);
  if (capacity_factor > 0) CHECK(std::count(kept.begin(), kept.end(), 0) > 0);  // drops happen
  CHECK(rel_diff(r.gate, narrow(want.gate)) < 1e-6);
  if (renormalize)
    for (int t = 0; t < N; ++t) {
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += r.gate[size_t(t) * k + size_t(j)];
      CHECK(std::abs(sum - 1) < 1e-6);
    }
  CHECK(std::abs(r.aux - want.aux) <= 1e-6 * want.aux);
  CHECK(std::abs(r.z - want.z) <= 1e-6 * want.z);
  CHECK(rel_diff(out, narrow(want.out)) < 1e-5);

  const auto loss = [&] { return ref.run(pd, xd, widen(g)).loss; };
  CHECK(rel_diff(din, ref.gradient(xd, loss)) < 1e-5);
  const char* names[] = {"router", "fc", "fc bias", "proj", "proj bias"};
  for (int i = 0; i < 5; ++i) {
    if (!biases && (i == 2 || i == 4)) continue;
    INFO(names[i]);
    CHECK(rel_diff(p.grad[size_t(i)], ref.gradient(pd[i], loss)) < 1e-5);
  }
}

}  // namespace

TEST_CASE("MoE layer matches PyTorch: routing, capacity, output, router losses and gradients") {
  const H5Fixture f(fixture_path());
  const int N = int(f.attr("N")), C = int(f.attr("C")), H = int(f.attr("H")), E = int(f.attr("E"));
  const std::vector<float> x = f.floats("x"), dout = f.floats("dout");
  const char* names[] = {"router_weight", "fc_weight", "fc_bias", "proj_weight", "proj_bias"};
  for (const char* c : {"top1_dropless", "top2_dropless", "top1_capacity", "top2_capacity"}) {
    const std::string g = std::string(c) + "/";
    INFO(c);
    Experts p(E, C, H);
    for (int i = 0; i < 5; ++i) p.value[size_t(i)] = f.floats(names[i]);
    MoeSettings s;
    s.experts = E;
    s.top_k = int(f.attr(g + "top_k"));
    s.capacity_factor = f.attr(g + "capacity_factor");
    s.aux_coef = f.attr("alpha");
    s.z_coef = f.attr("beta");
    MoeLayer layer = p.layer(s, N);
    std::vector<float> out(size_t(N) * C), din(size_t(N) * C);
    layer.forward(0, x.data(), out.data(), N);
    const MoeLayer::Routing& r = layer.routing(0);
    CHECK(r.expert == f.ints(g + "expert_index"));
    CHECK(rel_diff(r.gate, f.floats(g + "gates")) < 1e-6);
    CHECK(std::abs(r.aux - f.attr(g + "aux_loss")) <= 1e-6 * f.attr(g + "aux_loss"));
    CHECK(std::abs(r.z - f.attr(g + "z_loss")) <= 1e-6 * f.attr(g + "z_loss"));
    CHECK(rel_diff(out, f.floats(g + "out")) < 1e-5);
    const RouterStats stats = layer.take_stats();
    CHECK(stats.dropped == f.attr(g + "dropped"));
    const std::vector<int32_t> per_expert = f.ints(g + "tokens_per_expert");
    for (int e = 0; e < E; ++e) CHECK(stats.tokens[size_t(e)] == per_expert[size_t(e)]);
    CHECK(stats.assignments == double(N) * s.top_k);

    layer.backward(0, x.data(), dout.data(), din.data(), N);
    CHECK(rel_diff(din, f.floats(g + "d_x")) < 1e-5);
    for (int i = 0; i < 5; ++i) {
      INFO(names[i]);
      CHECK(rel_diff(p.grad[size_t(i)], f.floats(g + "d_" + names[i])) < 1e-5);
    }
  }
}

TEST_CASE("MoE: uniform routing makes the load-balancing loss exactly its coefficient") {
  const int E = 4, C = 8, H = 32, N = 32;
  for (int k : {1, 2}) {
    Experts p(E, C, H);  // a zero router: every probability 1/E
    MoeSettings s;
    s.experts = E;
    s.top_k = k;
    s.aux_coef = 0.01;
    s.round_robin = true;
    MoeLayer layer = p.layer(s, N);
    std::vector<float> x(size_t(N) * C), out(size_t(N) * C);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * double(i));
    layer.forward(0, x.data(), out.data(), N);
    CHECK(std::abs(layer.routing(0).aux - s.aux_coef) <= 1e-12 * s.aux_coef);
    const RouterStats stats = layer.take_stats();
    for (double t : stats.tokens) CHECK(t == double(N) * k / E);
  }
}

TEST_CASE("MoE: an MoE model decodes as it trains, and counts its active parameters") {
  const ModelSpec cfg = model_spec(
      {"--model.layers=2", "--model.d_model=32", "--model.heads=4", "--model.vocab=64", "--model.seq_len=8",
       "--model.ffn=moe", "--model.experts=4", "--model.top_k=2", "--model.moe_every=2"});  // block 1 only
  CHECK_FALSE(cfg.moe_block(0));
  CHECK(cfg.moe_block(1));
  GPT model(cfg, {.batch = 2});
  forge::test::randomize_weights(model, 3, 0.3f);  // routing far from uniform
  REQUIRE(model.moe_layers().size() == 1);
  forge::MicroBatch b;
  b.resize(2, cfg.seq_len);
  for (size_t i = 0; i < b.inputs.size(); ++i) {
    b.inputs[i] = int32_t((i * 7 + 3) % size_t(cfg.vocab));
    b.targets[i] = int32_t((i * 5 + 1) % size_t(cfg.vocab));
  }
  std::vector<float> logits(size_t(2) * cfg.seq_len * cfg.vocab);
  model.forward_logits(b, logits);
  // Sequence 1, a token at a time through the KV cache: the same logits.
  KvCache cache(model, 1, cfg.seq_len);
  std::vector<float> row(size_t(cfg.vocab));
  double worst = 0;
  for (int t = 0; t < cfg.seq_len; ++t) {
    const DecodeRow d{0, t, b.inputs[size_t(cfg.seq_len + t)]};
    const int first = 0;
    model.decode(cache, {&d, 1}, {&first, 1}, row);
    for (int v = 0; v < cfg.vocab; ++v)
      worst = std::max(worst, std::abs(double(row[size_t(v)]) -
                                       logits[(size_t(cfg.seq_len) + size_t(t)) * cfg.vocab + size_t(v)]));
  }
  CHECK(worst < 1e-5);

  const ParameterCounts n = parameter_counts(cfg);
  const double experts = 4.0 * (2 * 4 * 32 * 32 + 4 * 32 + 32);  // fc, proj weights and biases, 4 experts
  CHECK(n.total - n.active == experts / 2);                      // top 2 of 4 are active
  CHECK(flops_per_token(cfg) == 6 * n.active + 12.0 * 2 * 8 * 32);
}

TEST_CASE("MoE: in BF16 mode the experts keep their activations in 2 bytes") {
  const int E = 4, C = 16, H = 64, N = 24, k = 2;
  Experts p(E, C, H);
  for (int i = 0; i < 5; ++i) {
    auto& v = p.value[size_t(i)];
    for (size_t j = 0; j < v.size(); ++j) v[j] = float(0.3 * std::sin(0.7 * double(j) + i));
    cpu_backend().round_to_bf16(v.data(), v.data(), v.size());  // the weights a BF16 model computes with
  }
  MoeSettings s;
  s.experts = E;
  s.top_k = k;
  MoeLayer f32 = p.layer(s, N);
  s.bf16 = true;
  MoeLayer b16 = p.layer(s, N);
  // Per slot: pre-activation and activation, [N x top_k, H] each, in 2 bytes instead of 4.
  CHECK(f32.activation_bytes() - b16.activation_bytes() == 2 * size_t(N) * k * H * (4 - 2));

  std::vector<float> x(size_t(N) * C), out32(x.size()), out16(x.size()), dout(x.size()), din32(x.size()),
      din16(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37 * double(i)), dout[i] = std::cos(0.11 * double(i));
  cpu_backend().round_to_bf16(x.data(), x.data(), x.size());
  f32.forward(0, x.data(), out32.data(), N);
  b16.forward(0, x.data(), out16.data(), N);
  REQUIRE(f32.routing(0).expert == b16.routing(0).expert);  // the router computes in FP32 in both
  CHECK(out16 != out32);                                    // the activations were rounded
  CHECK(rel_diff(out16, out32) < 1e-2);
  f32.backward(0, x.data(), dout.data(), din32.data(), N);
  b16.backward(0, x.data(), dout.data(), din16.data(), N);
  CHECK(rel_diff(din16, din32) < 2e-2);
}

TEST_CASE("MoE: SwiGLU experts (Mixtral, Qwen-MoE) match a double-precision reference") {
  for (int k : {1, 2}) check_variant(true, false, false, k, 0);
  check_variant(true, false, false, 2, 0.75);  // capacity-bound
  check_variant(true, false, true, 2, 0);      // with biases, which the layer also takes

  // BF16 mode keeps gate | up (2H) and the activation (H) in 2 bytes.
  const int E = 4, C = 8, H = 12, N = 16, k = 2;
  Experts p(E, C, H, true);
  p.biases = false;
  MoeSettings s;
  s.experts = E;
  s.top_k = k;
  s.swiglu = true;
  MoeLayer f32 = p.layer(s, N);
  s.bf16 = true;
  MoeLayer b16 = p.layer(s, N);
  CHECK(f32.activation_bytes() - b16.activation_bytes() == size_t(N) * k * (2 * H + H) * (4 - 2));
}

TEST_CASE("MoE: gates renormalised over the top_k (Mixtral, Qwen 3 MoE) match a double-precision reference") {
  check_variant(false, true, true, 2, 0);
  check_variant(false, true, true, 3, 0);
  check_variant(false, true, true, 2, 0.75);  // a dropped choice still counts in the sum
  check_variant(true, true, false, 2, 0);     // Mixtral's layer
  check_variant(true, true, false, 2, 0.75);
}

TEST_CASE("MoE: GELU experts without biases compute what zero biases do") {
  check_variant(false, false, false, 2, 0);
  const int E = 4, C = 8, H = 32, N = 24, k = 2;
  Experts zero(E, C, H), none(E, C, H);
  none.biases = false;
  for (Experts* p : {&zero, &none})
    for (int i : {0, 1, 3}) {
      auto& v = p->value[size_t(i)];
      for (size_t j = 0; j < v.size(); ++j) v[j] = float(0.4 * std::sin(0.9 * double(j) + i));
    }
  MoeSettings s;
  s.experts = E;
  s.top_k = k;
  MoeLayer a = zero.layer(s, N), b = none.layer(s, N);
  std::vector<float> x(size_t(N) * C), dout(x.size()), out_a(x.size()), out_b(x.size()), din_a(x.size()),
      din_b(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(std::sin(0.37 * double(i))), dout[i] = float(std::cos(0.11 * double(i)));
  a.forward(0, x.data(), out_a.data(), N);
  b.forward(0, x.data(), out_b.data(), N);
  CHECK(out_a == out_b);
  a.backward(0, x.data(), dout.data(), din_a.data(), N);
  b.backward(0, x.data(), dout.data(), din_b.data(), N);
  CHECK(din_a == din_b);
  for (int i : {0, 1, 3}) CHECK(zero.grad[size_t(i)] == none.grad[size_t(i)]);
  for (int i : {2, 4})  // untouched: the layer has no bias to give a gradient
    CHECK(std::all_of(none.grad[size_t(i)].begin(), none.grad[size_t(i)].end(),
                      [](float v) { return v == 0; }));
}
