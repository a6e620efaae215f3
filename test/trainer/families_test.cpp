// The model families against PyTorch (fixture written by reference/make_families.py from the published
// model definitions): Llama 3 with llama3 rope scaling, Qwen 2 with q/k/v biases and tied embeddings,
// Qwen 3 with qk-norm and head_dim != width / heads, Mistral with a sliding window shorter than the
// sequence (and a batch of packed documents), Mixtral top-2 renormalised, Qwen2-MoE with a shared expert.
// Logits, loss and every gradient, at the GPT-2 fixture's tolerances (parity_test.cpp); and decoding
// through the KV cache equals the full forward for every family.
#include "h5_fixture.h"
#include "support/paths.h"
#include "support/training.h"

#include "forge/common/error.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/moe.h"
#include "forge/trainer/spec.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

using forge::MicroBatch;
using forge::test::H5Fixture;
using forge::test::rel_diff;
using namespace forge::trainer;

namespace {

constexpr const char* kFamilies[] = {"llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe"};

std::string fixture_path() {
  return forge::test::source_path("test/trainer/reference/families_parity.h5");
}

// The family's spec from the fixture's attributes, through the job spec's own reader.
ModelSpec family_spec(const H5Fixture& f, const std::string& g) {
  const auto n = [&](const char* key) { return fmt::format("{}", f.attr(g + "/" + key)); };
  const auto on = [&](const char* key) { return f.attr(g + "/" + key) != 0 ? "on" : "off"; };
  std::vector<std::string> keys = {"--model.family=" + g,
                                   "--model.layers=" + n("layers"),
                                   "--model.d_model=" + n("d_model"),
                                   "--model.heads=" + n("heads"),
                                   "--model.kv_heads=" + n("kv_heads"),
                                   "--model.head_dim=" + n("head_dim"),
                                   "--model.vocab=" + n("vocab"),
                                   "--model.seq_len=" + n("seq_len"),
                                   "--model.norm_eps=" + n("norm_eps"),
                                   "--model.rope_theta=" + n("rope_theta"),
                                   "--model.rope_scaling=" + f.text(g + "/rope_scaling"),
                                   "--model.window=" + n("window"),
                                   std::string("--model.qkv_bias=") + on("qkv_bias"),
                                   std::string("--model.qk_norm=") + on("qk_norm"),
                                   std::string("--model.tied_embeddings=") + on("tied_embeddings"),
                                   "--model.router_aux_coef=" + n("router_aux_coef"),
                                   "--model.router_z_coef=" + n("router_z_coef")};
  if (f.text(g + "/rope_scaling") == "llama3")
    for (const char* k :
         {"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_positions"})
      keys.push_back(fmt::format("--model.{}={}", k, n(k)));
  if (f.attr(g + "/experts") > 0) {
    keys.push_back("--model.ffn=moe");
    for (const char* k : {"experts", "top_k", "moe_hidden", "shared_expert_hidden"})
      keys.push_back(fmt::format("--model.{}={}", k, n(k)));
    keys.push_back(std::string("--model.router_renormalize=") + on("router_renormalize"));
  } else {
    keys.push_back("--model.ffn_hidden=" + n("ffn_hidden"));
  }
  return model_spec(keys);
}

void load_initial(GPT& model, const H5Fixture& f, const std::string& g) {
  for (const auto& p : model.params()) {
    INFO(p.name);
    const auto w = f.floats(g + "/init/" + p.name);
    REQUIRE(w.size() == p.numel);
    std::copy(w.begin(), w.end(), model.weight(p.name).begin());
  }
  model.weights_changed();
}

// Logits, loss and gradients of batch `b` (group prefix `at`) against the fixture; `weight` the loss's
// normaliser (positions, or the sum of the loss weights).
void check_against(GPT& model, const H5Fixture& f, const std::string& at, const MicroBatch& b,
                   double weight) {
  std::vector<float> logits(b.size() * size_t(model.config().vocab));
  model.forward_logits(b, logits);
  CHECK(rel_diff(logits, f.floats(at + "/logits")) < 1e-5);
  model.zero_grad();
  const double loss = model.forward_backward(b, float(1.0 / weight)).loss / weight;
  const double ref = f.doubles(at + "/loss" + (at.ends_with("packed") ? "" : "_lm"))[0];
  CHECK(std::abs(loss - ref) / ref < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats(at + "/grad/" + p.name)) < 2e-5);
  }
}

}  // namespace

TEST_CASE("Every model family matches PyTorch: logits, loss and every gradient",
          "[trainer][parity][families]") {
  const H5Fixture f(fixture_path());
  for (const std::string g : kFamilies) {
    INFO(g);
    const ModelSpec spec = family_spec(f, g);
    const int B = int(f.attr(g + "/batch"));
    GPT model(spec, {.batch = B});
    load_initial(model, f, g);
    const MicroBatch b =
        forge::test::micro_batch(f.ints(g + "/tokens"), f.ints(g + "/targets"), B, spec.seq_len);
    check_against(model, f, g, b, double(b.size()));
    if (g != "mistral") continue;
    // Rotary positions from the batch's position ids, the document mask and the window together.
    MicroBatch packed = forge::test::micro_batch(f.ints(g + "/packed/tokens"), f.ints(g + "/packed/targets"),
                                                 B, spec.seq_len);
    const auto weights = f.floats(g + "/packed/weights");
    packed.weights.assign(weights.begin(), weights.end());
    const auto positions = f.ints(g + "/packed/positions"), segments = f.ints(g + "/packed/segments");
    packed.positions.assign(positions.begin(), positions.end());
    packed.segments.assign(segments.begin(), segments.end());
    check_against(model, f, g + "/packed", packed, packed.weight_sum());
  }
}

TEST_CASE("Every model family decodes through its KV cache as its full forward computes",
          "[trainer][decode]") {
  const H5Fixture f(fixture_path());
  for (const std::string g : kFamilies) {
    INFO(g);
    const ModelSpec spec = family_spec(f, g);
    GPT model(spec, {.batch = 1});
    load_initial(model, f, g);
    const auto tokens = f.ints(g + "/tokens");
    const MicroBatch b =
        forge::test::micro_batch(std::vector<int32_t>(tokens.begin(), tokens.begin() + spec.seq_len),
                                 std::vector<int32_t>(size_t(spec.seq_len), 0), 1, spec.seq_len);
    std::vector<float> full(size_t(spec.seq_len) * size_t(spec.vocab));
    model.forward_logits(b, full);
    // A 20-token prompt at once, then a token at a time.
    KvCache cache(model, 1, spec.seq_len);
    CHECK(cache.bytes() == 2 * sizeof(float) * size_t(spec.layers) * size_t(spec.seq_len) *
                               size_t(spec.kv_heads) * size_t(spec.head_dim));
    std::vector<float> row(size_t(spec.vocab)), prompt_last(size_t(spec.vocab));
    std::vector<DecodeRow> prompt;
    for (int t = 0; t < 20; ++t) prompt.push_back({0, t, tokens[size_t(t)]});
    const int last = 19;
    model.decode(cache, prompt, {&last, 1}, prompt_last);
    double worst = 0;
    const auto compare = [&](const std::vector<float>& got, int t) {
      for (int v = 0; v < spec.vocab; ++v)
        worst = std::max(worst,
                         std::abs(double(got[size_t(v)]) - full[size_t(t) * size_t(spec.vocab) + size_t(v)]));
    };
    compare(prompt_last, 19);
    for (int t = 20; t < spec.seq_len; ++t) {
      const DecodeRow d{0, t, tokens[size_t(t)]};
      const int first = 0;
      model.decode(cache, {&d, 1}, {&first, 1}, row);
      compare(row, t);
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("A model record reads back as the spec it was written from; a GPT-2 record as before",
          "[trainer][spec]") {
  const H5Fixture f(fixture_path());
  for (const std::string g : kFamilies) {
    INFO(g);
    const ModelSpec spec = family_spec(f, g);
    const forge::Json record = model_spec_json(spec);
    CHECK(record.at("family") == g);
    CHECK(model_spec_json(model_spec_from_json(record, "record")) == record);
  }
  // FLOPs per token: the products of the active parameters (an untied embedding is a lookup) and the
  // attention over the keys a query sees (Mistral: its window).
  for (const std::string g : {"llama", "mistral"}) {
    const ModelSpec m = family_spec(f, g);
    const double keys = m.window > 0 ? std::min(m.window, m.seq_len) : m.seq_len;
    CHECK(flops_per_token(m) == 6 * (parameter_counts(m).active - double(m.vocab) * m.d_model) +
                                    12.0 * m.layers * keys * m.heads * m.head_dim);
  }
  // GPT-2 records keep the keys they had before the families, so old checkpoints compare equal.
  const forge::Json gpt2 = model_spec_json(gpt2_spec(2, 32, 4, 64, 16));
  CHECK(gpt2 == forge::Json{{"layers", 2},
                            {"d_model", 32},
                            {"heads", 4},
                            {"vocab", 64},
                            {"seq_len", 16},
                            {"max_positions", 16}});
  // A checkpoint of one family under a spec of another: a usage error naming both.
  try {
    check_model_family(gpt2, family_spec(f, "llama"), "ckpt/step-10");
    FAIL("a gpt2 checkpoint was accepted for a llama spec");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK_THAT(e.what(),
               Catch::Contains("ckpt/step-10 holds a gpt2 model") && Catch::Contains("model.family = llama"));
  }
}
