// A vision-language model against PyTorch (fixture written by reference/make_vision.py after SigLIP's vision
// transformer, LLaVA's projector and Llama): a batch with two pictures in one row and a text-only row, the
// loss on text only. Logits, loss and every gradient, at the families' tolerances (families_test.cpp), also
// in LLaVA's arrangement (no final norm, SigLIP's epsilon). And
// the rules of the [vision] keys, its record in a checkpoint, and the batches the model refuses.
#include "h5_fixture.h"
#include "support/errors.h"
#include "support/paths.h"
#include "support/training.h"

#include "forge/common/error.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/spec.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

using forge::MicroBatch;
using forge::test::error_of;
using forge::test::H5Fixture;
using forge::test::rel_diff;
using namespace forge::trainer;

namespace {

std::string fixture_path() {
  return forge::test::source_path("test/trainer/reference/vision_parity.h5");
}

// The fixture's model through the job spec's own reader.
std::vector<std::string> fixture_keys(const H5Fixture& f) {
  const auto n = [&](const char* key) { return fmt::format("{}", f.attr(key)); };
  return {"--model.family=llama",
          "--model.layers=" + n("layers"),
          "--model.d_model=" + n("d_model"),
          "--model.heads=" + n("heads"),
          "--model.kv_heads=" + n("kv_heads"),
          "--model.head_dim=" + n("head_dim"),
          "--model.vocab=" + n("vocab"),
          "--model.seq_len=" + n("seq_len"),
          "--model.ffn_hidden=" + n("ffn_hidden"),
          "--model.norm_eps=" + n("norm_eps"),
          "--model.rope_theta=" + n("rope_theta"),
          "--vision.layers=" + n("vision_layers"),
          "--vision.image_size=" + n("image_size"),
          "--vision.patch=" + n("patch"),
          "--vision.width=" + n("vision_width"),
          "--vision.heads=" + n("vision_heads"),
          "--vision.mlp_hidden=" + n("vision_mlp_hidden"),
          "--vision.projector_hidden=" + n("projector_hidden")};
}

// The fixture's batch: its tokens, targets and loss weights, and its pictures where the reader puts them.
MicroBatch fixture_batch(const H5Fixture& f, const ModelSpec& spec) {
  const int B = int(f.attr("batch"));
  MicroBatch b = forge::test::micro_batch(f.ints("tokens"), f.ints("targets"), B, spec.seq_len);
  const auto weights = f.floats("weights");
  b.weights.assign(weights.begin(), weights.end());
  b.image_size = spec.vision.image_size;
  b.image_tokens = spec.vision.tokens();
  const auto pixels = f.ints("pictures");  // uint8 values, read widened
  const auto starts = f.ints("picture_starts");
  std::vector<uint8_t> rgb(b.image_bytes());
  for (size_t k = 0; k < starts.size(); ++k) {
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(pixels[k * rgb.size() + i]);
    b.add_image(starts[k] / spec.seq_len, starts[k] % spec.seq_len, rgb.data());
  }
  return b;
}

void load_initial(GPT& model, const H5Fixture& f) {
  for (const auto& p : model.params()) {
    INFO(p.name);
    const auto w = f.floats("init/" + p.name);
    REQUIRE(w.size() == p.numel);
    std::copy(w.begin(), w.end(), model.weight(p.name).begin());
  }
  model.weights_changed();
}

// Logits, loss and every gradient of `model` on `b` against the fixture's (group: "" or "llava/"), at the
// families' tolerances; returns the logits. The gradients stay in the model.
std::vector<float> check_against(GPT& model, const MicroBatch& b, const H5Fixture& f,
                                 const std::string& group) {
  std::vector<float> logits(b.size() * size_t(model.config().vocab));
  model.forward_logits(b, logits);
  CHECK(rel_diff(logits, f.floats(group + "logits")) < 1e-5);
  model.zero_grad();
  const double weight = b.weight_sum();
  const double loss = model.forward_backward(b, float(1.0 / weight)).loss / weight;
  const double ref = f.doubles(group + "loss")[0];
  CHECK(std::abs(loss - ref) / ref < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats(group + "grad/" + p.name)) < 2e-5);
  }
  return logits;
}

}  // namespace

TEST_CASE("A vision-language model matches PyTorch: logits, loss and every gradient",
          "[trainer][parity][vision]") {
  const H5Fixture f(fixture_path());
  const ModelSpec spec = model_spec(fixture_keys(f));
  REQUIRE(spec.vision.tokens() == 16);
  const MicroBatch b = fixture_batch(f, spec);
  REQUIRE(b.images() == 2);
  GPT model(spec, {.batch = b.rows});
  load_initial(model, f);
  check_against(model, b, f, "");
  // The placeholder token's embedding had no part in the forward: no gradient reaches it.
  const int placeholder = int(f.attr("placeholder"));
  const auto dwte = model.grad("wte.weight");
  for (int c = 0; c < spec.d_model; ++c)
    CHECK(dwte[size_t(placeholder) * size_t(spec.d_model) + size_t(c)] == 0);

  // Frozen parts (train.freeze): no gradient of theirs is formed (they stay as allocated, zero), and the
  // other parts' are the same bit for bit, the input gradients passed through a frozen part included. A
  // frozen encoder: the backward stops at the projector. A frozen language model: its products form only
  // their input gradients, down to the pictures' rows.
  for (const std::string parts : {"vision", "lm", "vision,lm", "projector"}) {
    INFO("train.freeze = " << parts);
    Freeze freeze;
    freeze.vision = parts.starts_with("vision");
    freeze.lm = parts.ends_with("lm");
    freeze.projector = parts == "projector";
    GPT frozen(spec, {.batch = b.rows, .frozen = freeze.predicate()});
    load_initial(frozen, f);
    frozen.zero_grad();
    frozen.forward_backward(b, float(1.0 / b.weight_sum()));
    for (const auto& p : frozen.params()) {
      INFO(p.name);
      const auto g = frozen.grad(p.name);
      if (freeze.frozen(p.name))
        CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0; }));
      else
        CHECK(std::equal(g.begin(), g.end(), model.grad(p.name).begin()));
    }
  }

  // A batch without pictures runs the language model alone: the tower's gradients stay zero.
  MicroBatch text = b;
  text.image_pixels.clear();
  text.image_starts.clear();
  model.zero_grad();
  model.forward_backward(text, 1.0f);
  for (const auto& p : model.params())
    if (p.name.starts_with("vision.") || p.name.starts_with("projector.")) {
      INFO(p.name);
      for (float g : model.grad(p.name)) REQUIRE(g == 0);
    }
}

TEST_CASE("LLaVA's arrangement matches PyTorch: the projector reads the last block, SigLIP's epsilon",
          "[trainer][parity][vision]") {
  const H5Fixture f(fixture_path());
  auto keys = fixture_keys(f);
  keys.push_back("--vision.post_norm=off");
  keys.push_back(fmt::format("--vision.norm_eps={}", f.attr("llava_norm_eps")));
  const ModelSpec spec = model_spec(keys);
  const MicroBatch b = fixture_batch(f, spec);
  GPT model(spec, {.batch = b.rows});
  REQUIRE(std::none_of(model.params().begin(), model.params().end(),
                       [](const ParamInfo& p) { return p.name.starts_with("vision.ln_post"); }));
  load_initial(model, f);
  const std::vector<float> logits = check_against(model, b, f, "llava/");
  // (the fixture's model with its final norm scores otherwise: the checks can tell them apart)
  CHECK(rel_diff(logits, f.floats("logits")) > 1e-3);
}

TEST_CASE("A vision-language model decodes through its KV cache as its full forward computes",
          "[trainer][vision][decode]") {
  const H5Fixture f(fixture_path());
  const ModelSpec spec = model_spec(fixture_keys(f));
  const MicroBatch b = fixture_batch(f, spec);
  GPT model(spec, {.batch = b.rows});
  load_initial(model, f);
  const int T = spec.seq_len, V = spec.vocab, run = spec.vision.tokens();
  std::vector<float> full(b.size() * size_t(V));
  model.forward_logits(b, full);
  // Row 0 (pictures at 3 and 27): a prompt with the first picture (positions 0..26), the second picture's
  // run as one call, then a token at a time.
  KvCache cache(model, 1, T);
  const auto picture = [&](size_t k) { return b.image_pixels.data() + k * b.image_bytes(); };
  const auto rows_of = [&](int from, int to) {
    std::vector<DecodeRow> rows;
    for (int t = from; t < to; ++t) rows.push_back({0, t, b.inputs[size_t(t)]});
    return rows;
  };
  double worst = 0;
  const auto compare = [&](const std::vector<float>& got, int first, int count) {
    for (int i = 0; i < count; ++i)
      for (int v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(double(got[size_t(i) * size_t(V) + size_t(v)]) -
                                         full[size_t(first + i) * size_t(V) + size_t(v)]));
  };
  const auto call = [&](int from, int to, std::vector<DecodePicture> pictures) {
    const auto rows = rows_of(from, to);
    std::vector<int> wanted(rows.size());
    for (size_t i = 0; i < wanted.size(); ++i) wanted[i] = int(i);
    std::vector<float> logits(wanted.size() * size_t(V));
    model.decode(cache, rows, wanted, logits, pictures);
    compare(logits, from, to - from);
  };
  REQUIRE(b.image_starts[0] == 3);
  REQUIRE(b.image_starts[1] == 27);
  call(0, 27, {{3, picture(0)}});
  call(27, 27 + run, {{0, picture(1)}});
  for (int t = 27 + run; t < T; ++t) call(t, t + 1, {});
  CHECK(worst < 1e-5);
  // A picture whose run would leave the call's rows.
  KvCache other(model, 1, T);
  const auto rows = rows_of(0, 10);
  const int last = 9;
  std::vector<float> logits(static_cast<size_t>(V));
  const DecodePicture outside{3, picture(0)};
  CHECK_THROWS_AS(model.decode(other, rows, {&last, 1}, logits, {&outside, 1}), std::invalid_argument);
}

TEST_CASE("The [vision] keys: defaults, rules naming the key, and the checkpoint's record",
          "[trainer][spec][vision]") {
  const std::vector<std::string> llama = {"--model.family=llama", "--model.d_model=64", "--model.heads=4",
                                          "--model.seq_len=64"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), llama.begin(), llama.end());
    return extra;
  };
  CHECK_FALSE(model_spec(llama).vision.enabled());
  const ModelSpec m = model_spec(with({"--vision.layers=2", "--vision.image_size=32", "--vision.patch=8"}));
  CHECK(m.vision.width == 64);
  CHECK(m.vision.heads == 4);
  CHECK(m.vision.mlp_hidden == 256);
  CHECK(m.vision.projector_hidden == 64);
  CHECK(m.vision.tokens() == 16);
  CHECK_THAT(model_description(m), Catch::Contains("vision: 2 blocks of 64") && Catch::Contains("16 tokens"));
  // The record a checkpoint keeps reads back as the same model; a text model's record has no vision keys.
  const forge::Json record = model_spec_json(m);
  CHECK(record.at("vision.layers") == 2);
  CHECK(model_spec_json(model_spec_from_json(record, "record")) == record);
  CHECK_FALSE(model_spec_json(model_spec(llama)).contains("vision.layers"));
  // The tower's parameters are counted in the total, not in what a text token computes with.
  const ParameterCounts with_vision = parameter_counts(m), text = parameter_counts(model_spec(llama));
  CHECK(with_vision.total > text.total);
  CHECK(with_vision.active == text.active);

  const auto rejected = [&](std::vector<std::string> extra) {
    const forge::Error e = error_of([&] { model_spec(with(std::move(extra))); });
    CHECK(e.code() == forge::ExitCode::kUsage);
    return std::string(e.what());
  };
  CHECK_THAT(rejected({"--vision.layers=1", "--vision.image_size=30", "--vision.patch=8"}),
             Catch::Contains("vision.image_size = 30") && Catch::Contains("multiple of vision.patch = 8"));
  CHECK_THAT(rejected({"--vision.layers=1", "--vision.image_size=64", "--vision.patch=4"}),
             Catch::Contains("256 tokens") && Catch::Contains("model.seq_len = 64"));
  CHECK_THAT(
      rejected({"--vision.layers=1", "--vision.image_size=32", "--vision.patch=8", "--vision.heads=3"}),
      Catch::Contains("vision.heads = 3") && Catch::Contains("divide vision.width = 64"));
  CHECK_THAT(rejected({"--vision.layers=1", "--vision.image_size=32", "--vision.patch=8",
                       "--model.positions=learned"}),
             Catch::Contains("model.positions") && Catch::Contains("rotary"));
}

TEST_CASE("A model refuses pictures it cannot take, naming what to change", "[trainer][vision]") {
  const H5Fixture f(fixture_path());
  const ModelSpec spec = model_spec(fixture_keys(f));
  const MicroBatch b = fixture_batch(f, spec);
  // Pictures into a text-only model.
  ModelSpec text = spec;
  text.vision = {};
  forge::Error e = error_of([&] { GPT::check_batch(b, b.rows, text); });
  CHECK(e.code() == forge::ExitCode::kData);
  CHECK_THAT(e.what(), Catch::Contains("2 pictures") && Catch::Contains("no vision tower"));
  // Pictures of another size than the tower takes.
  ModelSpec larger = spec;
  larger.vision.image_size = 32;
  e = error_of([&] { GPT::check_batch(b, b.rows, larger); });
  CHECK(e.code() == forge::ExitCode::kData);
  CHECK_THAT(e.what(), Catch::Contains("16 x 16") && Catch::Contains("--image.size=32"));
}

TEST_CASE("train.freeze: frozen parts keep their weights bit for bit and hold no optimizer state",
          "[trainer][vision][freeze]") {
  const H5Fixture f(fixture_path());
  // LLaVA's two stages: the projector alone, then the projector and the language model; and the tower
  // trained under a frozen language model.
  for (const std::string freeze : {"vision,lm", "vision", "lm"}) {
    INFO("train.freeze = " << freeze);
    std::vector<std::string> keys = fixture_keys(f);
    for (const std::string k : {"--data.batch=2", "--run.threads=1", "--optim.warmup_steps=0"})
      keys.push_back(k);
    keys.push_back("--train.freeze=" + freeze);
    forge::ConfigSchema schema;
    add_trainer_keys(schema);
    const TrainSpec spec = train_spec(forge::load_config(schema, "", keys));
    forge::test::OneProcess trainer(spec);
    GPT& model = trainer->model();
    load_initial(model, f);
    const std::vector<float> before(model.weights().begin(), model.weights().end());
    const MicroBatch b = fixture_batch(f, spec.model);
    for (int step = 0; step < 2; ++step) REQUIRE(trainer->step({&b, 1}).finite);
    const auto ranges = trainer->optimizer().ranges();
    size_t frozen_elements = 0;
    for (const auto& p : model.params())
      if (spec.freeze.frozen(p.name)) frozen_elements += p.numel;
    CHECK(trainer->optimizer().m().size() <= model.weights().size() - frozen_elements);
    for (const auto& p : model.params()) {
      INFO(p.name);
      const bool frozen = spec.freeze.frozen(p.name);
      const auto now = model.weight(p.name);
      const bool same = std::equal(now.begin(), now.end(), before.begin() + ptrdiff_t(p.offset));
      CHECK(same == frozen);
      // A frozen part's gradients were never formed.
      const auto g = model.grad(p.name);
      if (frozen) CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 0; }));
      // The optimizer's ranges hold every trained element and none of a frozen one.
      size_t held = 0;
      for (const FlatRange& r : ranges) {
        const size_t lo = std::max(r.lo, p.offset), hi = std::min(r.hi, p.offset + p.numel);
        if (lo < hi) held += hi - lo;
      }
      CHECK(held == (frozen ? 0 : p.numel));
    }
  }
  // Parts that are not there, or nothing left to train: exit 64 naming the key.
  forge::ConfigSchema schema;
  add_trainer_keys(schema);
  const auto rejected = [&](const std::vector<std::string>& keys) {
    const forge::Error e = error_of([&] { train_spec(forge::load_config(schema, "", keys)); });
    CHECK(e.code() == forge::ExitCode::kUsage);
    return std::string(e.what());
  };
  CHECK_THAT(rejected({"--train.freeze=vision"}),
             Catch::Contains("train.freeze = vision") && Catch::Contains("no vision tower"));
  CHECK_THAT(rejected({"--train.freeze=lm"}), Catch::Contains("leaves nothing to train"));
  CHECK_THAT(rejected({"--train.freeze=encoder"}), Catch::Contains("'encoder' is not a part"));
}
