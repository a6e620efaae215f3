// The Mixture-of-Experts layer against PyTorch (fixture written by reference/make_moe_fixture.py): routing,
// gates, capacity drops, output, load-balancing and z losses, and every gradient, for top-1 and top-2,
// dropless and capacity-bound. Tolerances relative to the largest magnitude of the reference tensor: output
// and gradients 1e-5, losses 1e-6 (relative). Measured: <= 3e-7 (the reference computes in float64).
// Also: forced uniform routing makes the load-balancing loss exactly its coefficient; an MoE model's
// logits do not depend on how many rows decode at once.
#include "h5_fixture.h"
#include "support/paths.h"

#include "support/training.h"

#include "forge/trainer/moe.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

using forge::test::H5Fixture;
using forge::test::rel_diff;
using namespace forge::trainer;

namespace {

std::string fixture_path() {
  return forge::test::source_path("test/trainer/reference/moe_parity.h5");
}

// The layer's parameters as plain host arrays, with table entries of their logical shapes.
struct Experts {
  int E, C, H;
  ParamInfo info[5];
  std::vector<float> value[5], grad[5];

  Experts(int experts, int C_, int H_) : E(experts), C(C_), H(H_) {
    const std::vector<std::vector<int64_t>> shapes = {{E, C}, {E, H, C}, {E, H}, {E, C, H}, {E, C}};
    for (size_t i = 0; i < 5; ++i) {
      info[i].shape = info[i].local_shape = shapes[i];
      size_t n = 1;
      for (int64_t d : shapes[i]) n *= size_t(d);
      info[i].numel = n;
      value[i].assign(n, 0.0f);
      grad[i].assign(n, 0.0f);
    }
  }
  ParamRef ref(int i) { return {&info[i], value[size_t(i)].data(), grad[size_t(i)].data()}; }
  MoeLayer layer(const MoeSettings& settings, int rows) {
    return MoeLayer(cpu_backend(), settings, 0, ref(0), ref(1), ref(2), ref(3), ref(4),
                    LayerFactory::whole().token_exchange(), 1, rows);
  }
};

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
  ModelConfig cfg{2, 32, 4, 64, 8, 8};
  cfg.ffn = Ffn::kMoe;
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.moe_every = 2;  // block 1 only
  CHECK_FALSE(cfg.moe_block(0));
  CHECK(cfg.moe_block(1));
  GPT model(cfg, 2);
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
