// Numerical parity with PyTorch (fixture written by reference/make_fixture.py): logits, loss, every
// gradient, and ten AdamW steps with warm-up + cosine schedule, clipping and two accumulated
// micro-batches; and logits, weighted loss and gradients of a batch of packed documents. Tolerances (FP32),
// relative to the largest magnitude of the reference tensor:
//   logits 1e-5, gradients 2e-5, loss 1e-5 (relative), step losses and gradient norms 1e-5 (relative),
//   weights after ten steps 1e-3.
// Measured: logits and gradients <= 1e-6, step losses <= 1e-7, weights <= 3e-4. Reductions run in a
// different order than PyTorch's; Adam divides by sqrt(v), so coordinates whose gradients are nearly
// zero turn that rounding into visible weight differences, hence the looser weight tolerance.
#include "h5_fixture.h"
#include "support/paths.h"

#include "support/training.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

using forge::MicroBatch;
using forge::test::H5Fixture;
using forge::test::rel_diff;
using namespace forge::trainer;

namespace {

std::string fixture_path() {
  return forge::test::source_path("test/trainer/reference/gpt_parity.h5");
}

TrainSpec fixture_spec(const H5Fixture& f) {
  TrainSpec s;
  s.model = gpt2_spec(int(f.attr("layers")), int(f.attr("d_model")), int(f.attr("heads")),
                      int(f.attr("vocab")), int(f.attr("seq_len")));
  s.batch = int(f.attr("batch"));
  s.microbatches = int(f.attr("microbatches"));
  s.steps = int64_t(f.attr("steps"));
  s.optim = {f.attr("lr"),           f.attr("min_lr"),   int64_t(f.attr("warmup_steps")),
             f.attr("weight_decay"), f.attr("beta1"),    f.attr("beta2"),
             f.attr("eps"),          f.attr("grad_clip")};
  s.threads = 2;
  return s;
}

// The fixture's weights under `group` ("init/": the initial model's) into every parameter of `model`.
void load_initial(GPT& model, const H5Fixture& f, const std::string& group = "init/") {
  for (const auto& p : model.params()) {
    const auto w = f.floats(group + p.name);
    REQUIRE(w.size() == p.numel);
    std::copy(w.begin(), w.end(), model.weight(p.name).begin());
  }
  model.weights_changed();
}

// The fixture's batch of packed documents with loss weights.
MicroBatch fixture_packed(const H5Fixture& f, const TrainSpec& spec) {
  MicroBatch batch = forge::test::micro_batch(f.ints("packed/tokens"), f.ints("packed/targets"), spec.batch,
                                              spec.model.seq_len);
  const auto weights = f.floats("packed/weights");
  batch.weights.assign(weights.begin(), weights.end());
  const auto positions = f.ints("packed/positions"), segments = f.ints("packed/segments");
  batch.positions.assign(positions.begin(), positions.end());
  batch.segments.assign(segments.begin(), segments.end());
  return batch;
}

}  // namespace

TEST_CASE("GPT matches PyTorch: logits, loss and every gradient", "[trainer][parity]") {
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_spec(f);
  forge::test::OneProcess trainer(spec);
  GPT& model = trainer->model();
  load_initial(model, f);
  const auto tokens = f.ints("tokens"), targets = f.ints("targets");
  const MicroBatch batch = forge::test::micro_batch(tokens, targets, spec.batch, spec.model.seq_len);

  std::vector<float> logits(tokens.size() * size_t(spec.model.vocab));
  model.forward_logits(batch, logits);
  CHECK(rel_diff(logits, f.floats("logits")) < 1e-5);

  model.zero_grad();
  const double n = double(tokens.size());
  const double loss = model.forward_backward(batch, float(1.0 / n)).loss / n;
  const double ref_loss = f.floats("loss")[0];
  CHECK(std::abs(loss - ref_loss) / ref_loss < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats("grad/" + p.name)) < 2e-5);
  }
}

TEST_CASE("Ten AdamW steps match PyTorch", "[trainer][parity]") {
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_spec(f);
  forge::test::OneProcess trainer(spec);
  load_initial(trainer->model(), f);
  const auto stream = f.ints("steps/tokens");
  const auto ref_loss = f.doubles("steps/loss"), ref_norm = f.doubles("steps/grad_norm");
  const size_t per_batch = size_t(spec.batch) * size_t(spec.model.seq_len + 1);
  const size_t per_step = per_batch * size_t(spec.microbatches);
  REQUIRE(stream.size() == per_step * size_t(spec.steps));
  for (int64_t s = 0; s < spec.steps; ++s) {
    std::vector<MicroBatch> batches;
    for (int k = 0; k < spec.microbatches; ++k)
      batches.push_back(forge::test::window_batch(
          std::span(stream).subspan(size_t(s) * per_step + size_t(k) * per_batch, per_batch), spec.batch,
          spec.model.seq_len));
    const StepStats st = trainer->step(batches);
    INFO("step " << st.step);
    CHECK(std::abs(st.loss - ref_loss[size_t(s)]) / ref_loss[size_t(s)] < 1e-5);
    CHECK(std::abs(st.grad_norm - ref_norm[size_t(s)]) / ref_norm[size_t(s)] < 1e-5);
  }
  for (const auto& p : trainer->model().params()) {
    INFO(p.name);
    CHECK(rel_diff(trainer->model().weight(p.name), f.floats("final/" + p.name)) < 1e-3);
  }
}

TEST_CASE("GPT matches PyTorch on packed documents with loss weights", "[trainer][parity][documents]") {
  // Positions restart at each document, attention is masked to it, some targets are ignored and the
  // loss is sum(weight x cross-entropy) / sum(weight).
  const H5Fixture f(fixture_path());
  TrainSpec spec = fixture_spec(f);
  const auto tokens = f.ints("packed/tokens");
  spec.batch = int(tokens.size()) / spec.model.seq_len;
  forge::test::OneProcess trainer(spec);
  GPT& model = trainer->model();
  load_initial(model, f);
  const MicroBatch batch = fixture_packed(f, spec);
  REQUIRE_FALSE(batch.problem(spec.model.vocab, spec.model.max_positions));

  std::vector<float> logits(tokens.size() * size_t(spec.model.vocab));
  model.forward_logits(batch, logits);
  CHECK(rel_diff(logits, f.floats("packed/logits")) < 1e-5);

  model.zero_grad();
  const double weight = batch.weight_sum();
  const LossSums sums = model.forward_backward(batch, float(1.0 / weight));
  CHECK(sums.weight == weight);
  const double ref_loss = f.doubles("packed/loss")[0];
  CHECK(std::abs(sums.loss / weight - ref_loss) / ref_loss < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats("packed/grad/" + p.name)) < 2e-5);
  }
}

// The fixture's two preference pairs (without their reference log-probabilities).
MicroBatch fixture_pairs(const H5Fixture& f, const TrainSpec& spec) {
  MicroBatch batch =
      forge::test::micro_batch(f.ints("dpo/tokens"), f.ints("dpo/targets"), spec.batch, spec.model.seq_len);
  const auto weights = f.floats("dpo/weights");
  batch.weights.assign(weights.begin(), weights.end());
  const auto positions = f.ints("dpo/positions"), segments = f.ints("dpo/segments");
  batch.positions.assign(positions.begin(), positions.end());
  batch.segments.assign(segments.begin(), segments.end());
  return batch;
}

TEST_CASE("DPO matches PyTorch on two preference pairs, label smoothing on", "[trainer][parity][dpo]") {
  const H5Fixture f(fixture_path());
  TrainSpec spec = fixture_spec(f);
  const auto tokens = f.ints("dpo/tokens");
  spec.batch = int(tokens.size()) / spec.model.seq_len;
  spec.objective = forge::trainer::Objective::kDpo;
  spec.dpo.beta = f.attr("dpo/beta");
  spec.dpo.label_smoothing = f.attr("dpo/label_smoothing");
  forge::test::OneProcess trainer(spec);
  GPT& model = trainer->model();
  load_initial(model, f);
  MicroBatch batch = fixture_pairs(f, spec);
  batch.reference_logps = f.doubles("dpo/reference_logps");
  REQUIRE_FALSE(batch.problem(spec.model.vocab, spec.model.max_positions));

  model.zero_grad();
  const LossSums sums = model.forward_backward(batch, float(1.0 / batch.rows));
  CHECK(sums.weight == batch.rows);  // normalised by the pairs
  const double ref_loss = f.doubles("dpo/loss")[0];
  CHECK(std::abs(sums.loss / sums.weight - ref_loss) / ref_loss < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats("dpo/grad/" + p.name)) < 2e-5);
  }
}

TEST_CASE("DPO with the policy as its own reference: loss ln 2, margin 0", "[trainer][dpo]") {
  // The reference pass (ReplyLogps) and the policy compute the same log-probabilities from the same
  // weights and batch, so every z is exactly 0.
  const H5Fixture f(fixture_path());
  TrainSpec spec = fixture_spec(f);
  const auto tokens = f.ints("dpo/tokens");
  spec.batch = int(tokens.size()) / spec.model.seq_len;
  spec.microbatches = 1;
  spec.objective = forge::trainer::Objective::kDpo;
  spec.dpo.beta = 0.3;
  MicroBatch batch = fixture_pairs(f, spec);

  const auto logps = std::make_shared<forge::trainer::ReplyLogps>();
  GPT reference(spec.model, {.batch = spec.batch, .loss = logps});
  load_initial(reference, f);
  reference.forward_loss(batch);
  batch.reference_logps = logps->last();
  REQUIRE(batch.reference_logps.size() == 4);
  for (double lp : batch.reference_logps) CHECK(lp < -10);

  forge::test::OneProcess trainer(spec);
  load_initial(trainer->model(), f);
  const StepStats st = trainer->step(std::span(&batch, 1));
  CHECK(st.loss == double(float(std::log(2.0))));  // reported at FP32, as every loss
  const std::map<std::string, double> figures(st.objective.begin(), st.objective.end());
  CHECK(figures.at("reward_margin") == 0.0);
  CHECK(figures.at("reward_chosen") == 0.0);
  CHECK(figures.at("accuracy") == 0.0);
  // And a step later the policy has moved away from its reference: the chosen reply gains.
  const StepStats next = trainer->step(std::span(&batch, 1));
  const std::map<std::string, double> after(next.objective.begin(), next.objective.end());
  CHECK(next.loss < st.loss);
  CHECK(after.at("reward_margin") > 0.0);
  CHECK(after.at("accuracy") == 1.0);
}

namespace {

// The fixture's distillation teacher (3 blocks of width 48, the student's vocabulary and positions).
std::shared_ptr<GPT> fixture_teacher(const H5Fixture& f, const TrainSpec& spec) {
  const ModelSpec config = gpt2_spec(int(f.attr("distill/layers")), int(f.attr("distill/d_model")),
                                     spec.model.heads, spec.model.vocab, spec.model.seq_len);
  auto teacher = std::make_shared<GPT>(config, ModelSetup{.batch = spec.batch});
  load_initial(*teacher, f, "distill/teacher/");
  return teacher;
}

}  // namespace

TEST_CASE("Distillation matches PyTorch: a larger teacher, temperature 2, packed documents",
          "[trainer][parity][distill]") {
  const H5Fixture f(fixture_path());
  TrainSpec spec = fixture_spec(f);
  spec.batch = int(f.ints("packed/tokens").size()) / spec.model.seq_len;
  spec.objective = Objective::kDistill;
  spec.distill.alpha = f.attr("distill/alpha");
  spec.distill.temperature = f.attr("distill/temperature");
  forge::test::OneProcess trainer(spec, fixture_teacher(f, spec));
  GPT& model = trainer->model();
  load_initial(model, f);
  const MicroBatch batch = fixture_packed(f, spec);

  model.zero_grad();
  const double weight = batch.weight_sum();
  const LossSums sums = model.forward_backward(batch, float(1.0 / weight));
  CHECK(sums.weight == weight);
  const double ref_loss = f.doubles("distill/loss")[0];
  CHECK(std::abs(sums.loss / weight - ref_loss) / ref_loss < 1e-5);
  const auto figures = model.loss().take_metrics();
  REQUIRE(figures.size() == 1);
  CHECK(figures[0].first == "kl_teacher");
  CHECK(std::abs(figures[0].second / weight - f.doubles("distill/kl")[0]) < 1e-5);
  for (const auto& p : model.params()) {
    INFO(p.name);
    CHECK(rel_diff(model.grad(p.name), f.floats("distill/grad/" + p.name)) < 2e-5);
  }
}

TEST_CASE("Distillation from a teacher equal to the student: KL 0, the loss its cross-entropy share",
          "[trainer][distill]") {
  // The teacher's logits are formed by the same products from the same weights, so every KL term is
  // exactly 0 (the kernel's b - a is 0), at any temperature.
  const H5Fixture f(fixture_path());
  TrainSpec spec = fixture_spec(f);
  spec.batch = int(f.ints("packed/tokens").size()) / spec.model.seq_len;
  spec.microbatches = 1;
  spec.objective = Objective::kDistill;
  spec.distill.alpha = 0.7;
  spec.distill.temperature = 3.0;
  auto teacher = std::make_shared<GPT>(spec.model, ModelSetup{.batch = spec.batch});
  load_initial(*teacher, f);
  const MicroBatch batch = fixture_packed(f, spec);
  forge::test::OneProcess trainer(spec, teacher);
  load_initial(trainer->model(), f);
  const StepStats st = trainer->step(std::span(&batch, 1));
  const std::map<std::string, double> figures(st.objective.begin(), st.objective.end());
  CHECK(figures.at("kl_teacher") == 0.0);
  // The loss is (1 - alpha) x the cross-entropy the LM objective gives on the same batch.
  const double ce = f.doubles("packed/loss")[0];
  CHECK(std::abs(st.loss - 0.3 * ce) / (0.3 * ce) < 1e-5);
  // A step later the student has moved and the KL is positive.
  const StepStats next = trainer->step(std::span(&batch, 1));
  const std::map<std::string, double> after(next.objective.begin(), next.objective.end());
  CHECK(after.at("kl_teacher") > 0.0);
}

// The fixture's four sampled replies in two groups, with their advantages and old and reference
// log-probabilities.
MicroBatch fixture_rollout(const H5Fixture& f, const TrainSpec& spec) {
  MicroBatch batch =
      forge::test::micro_batch(f.ints("grpo/tokens"), f.ints("grpo/targets"), 4, spec.model.seq_len);
  const auto weights = f.floats("grpo/weights");
  batch.weights.assign(weights.begin(), weights.end());
  batch.advantages = f.floats("grpo/advantages");
  batch.old_logps = f.floats("grpo/old_logps");
  batch.ref_logps = f.floats("grpo/ref_logps");
  return batch;
}

// The fixture's rollout with the log-probabilities recorded (TokenLogps) under the weights that then train
// on it, as old and reference ones: a rollout's first update against the same weights as reference.
MicroBatch recorded_rollout(const H5Fixture& f, const TrainSpec& spec) {
  MicroBatch batch = fixture_rollout(f, spec);
  const auto logps = std::make_shared<TokenLogps>();
  GPT sampler(spec.model, {.batch = 4, .loss = logps});
  load_initial(sampler, f);
  sampler.forward_loss(batch);
  batch.old_logps = batch.ref_logps = logps->last();
  return batch;
}

GrpoOptions fixture_grpo(const H5Fixture& f, GrpoOptions::Norm norm) {
  return {f.attr("grpo/clip_low"), f.attr("grpo/clip_high"), f.attr("grpo/kl_coef"), norm};
}

TEST_CASE("GRPO advantages match PyTorch's; a group of equal rewards carries no signal", "[trainer][grpo]") {
  const H5Fixture f(fixture_path());
  const auto rewards = f.floats("grpo/rewards");
  CHECK(rel_diff(grpo_advantages(rewards, int(f.attr("grpo/group_size")), true),
                 f.floats("grpo/advantages")) < 1e-6);
  const std::vector<float> flat = {0.5f, 0.5f, 0.5f, 1.0f, 0.0f, 0.5f};
  const auto adv = grpo_advantages(flat, 3, true);
  CHECK(adv[0] == 0.0f);
  CHECK(adv[1] == 0.0f);
  CHECK(adv[2] == 0.0f);
  CHECK(grpo_advantages(flat, 3, false)[3] == 0.5f);  // unscaled: reward minus the group's mean
  CHECK_THROWS_AS(grpo_advantages(flat, 4, true), std::invalid_argument);
  CHECK_THROWS_AS(grpo_advantages(flat, 1, true), std::invalid_argument);
}

TEST_CASE("GRPO matches PyTorch on four replies in two groups, per token and per sequence",
          "[trainer][parity][grpo]") {
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_spec(f);
  for (const auto& [norm, group] :
       {std::pair{GrpoOptions::Norm::kToken, "token"}, std::pair{GrpoOptions::Norm::kSequence, "sequence"}}) {
    INFO(group);
    const auto loss = std::make_shared<GrpoLoss>(fixture_grpo(f, norm));
    GPT model(spec.model, {.batch = 4, .loss = loss});
    load_initial(model, f);
    const MicroBatch batch = fixture_rollout(f, spec);
    REQUIRE_FALSE(batch.problem(spec.model.vocab, spec.model.max_positions));
    model.zero_grad();
    const double weight = loss->weight(batch);
    CHECK(weight == (norm == GrpoOptions::Norm::kToken ? 4 * 60 - 15 : 4));
    const LossSums sums = model.forward_backward(batch, float(1.0 / weight));
    const double ref_loss = f.doubles(std::string("grpo/") + group + "/loss")[0];
    CHECK(std::abs(sums.loss / sums.weight - ref_loss) < 1e-5 * std::max(1.0, std::abs(ref_loss)));
    for (const auto& p : model.params()) {
      INFO(p.name);
      CHECK(rel_diff(model.grad(p.name), f.floats(std::string("grpo/") + group + "/grad/" + p.name)) < 2e-5);
    }
    const std::map<std::string, double> figures = [&] {
      const auto m = loss->take_metrics();
      return std::map<std::string, double>(m.begin(), m.end());
    }();
    CHECK(figures.at("clip_fraction") > 0);  // the fixture's old log-probabilities put some ratios outside
    CHECK(figures.at("kl") > 0);
  }
}

TEST_CASE("GRPO at the first update of a rollout: ratio exactly 1, KL to the same weights exactly 0",
          "[trainer][grpo]") {
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_spec(f);
  const MicroBatch batch = recorded_rollout(f, spec);
  REQUIRE_FALSE(batch.problem(spec.model.vocab, spec.model.max_positions));

  const auto loss = std::make_shared<GrpoLoss>(GrpoOptions{0.2, 0.28, 0.05, GrpoOptions::Norm::kToken});
  GPT model(spec.model, {.batch = 4, .loss = loss});
  load_initial(model, f);
  model.zero_grad();
  const double weight = loss->weight(batch);
  const LossSums sums = model.forward_backward(batch, float(1.0 / weight));
  const auto m = loss->take_metrics();
  const std::map<std::string, double> figures(m.begin(), m.end());
  CHECK(figures.at("ratio") == weight);  // every scored token's ratio is exactly 1
  CHECK(figures.at("kl") == 0.0);
  CHECK(figures.at("clip_fraction") == 0.0);
  // The sampled tokens' surprise under the policy: the recorded log-probabilities' negated weighted sum.
  double surprise = 0;
  for (size_t i = 0; i < batch.size(); ++i) surprise -= double(batch.weight(i)) * double(batch.old_logps[i]);
  CHECK(figures.at("entropy") == Approx(surprise).epsilon(1e-12));
  CHECK(surprise > 0);
  // -ratio x A summed: the advantages' weighted sum over the scored tokens.
  double expected = 0;
  for (size_t i = 0; i < batch.size(); ++i)
    expected -= double(batch.weight(i)) * batch.advantages[i / size_t(batch.seq_len)];
  CHECK(std::abs(sums.loss - expected) < 1e-9 * std::max(1.0, std::abs(expected)));
}

TEST_CASE(
    "GRPO on policy: the training forward is the recomputation, bit for bit, measured against the sampler",
    "[trainer][grpo]") {
  // One update per rollout: the loss divides by its own log-probabilities instead of recomputed ones, which
  // are the same numbers, so loss and gradients are bit-identical; old_logps then hold the sampler's, which
  // the loss compares with its own.
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_spec(f);
  const MicroBatch recomputed = recorded_rollout(f, spec);
  MicroBatch sampled = recomputed;  // the decode kernels' figures: off by up to 1e-3 here
  double off_max = 0;
  for (size_t i = 0; i < sampled.size(); ++i) {
    if (sampled.weight(i) == 0.0f) continue;
    sampled.old_logps[i] = std::min(0.0f, sampled.old_logps[i] - 1e-3f * float(i % 3));
    off_max = std::max(off_max, std::fabs(double(sampled.old_logps[i]) - double(recomputed.old_logps[i])));
  }
  REQUIRE(off_max > 1e-3);

  auto run = [&](const MicroBatch& batch, bool on_policy) {
    const auto loss =
        std::make_shared<GrpoLoss>(GrpoOptions{0.2, 0.28, 0.05, GrpoOptions::Norm::kToken, on_policy});
    GPT model(spec.model, {.batch = 4, .loss = loss});
    load_initial(model, f);
    model.zero_grad();
    const LossSums sums = model.forward_backward(batch, float(1.0 / loss->weight(batch)));
    std::map<std::string, std::vector<float>> grads;
    for (const auto& p : model.params()) {
      const std::span<float> g = model.grad(p.name);
      grads[p.name].assign(g.begin(), g.end());
    }
    auto m = loss->take_metrics();
    for (auto& x : loss->take_maxima()) m.push_back(x);
    return std::tuple{sums.loss, grads, std::map<std::string, double>(m.begin(), m.end())};
  };
  const auto [loss_recomputed, grads_recomputed, figures_recomputed] = run(recomputed, false);
  const auto [loss_on_policy, grads_on_policy, figures] = run(sampled, true);
  CHECK(loss_on_policy == loss_recomputed);
  CHECK(grads_on_policy == grads_recomputed);
  CHECK(figures.at("ratio") == figures_recomputed.at("ratio"));
  CHECK_FALSE(figures_recomputed.count("logp_diff_mean"));
  CHECK(figures.at("logp_diff_max") == Approx(off_max).epsilon(1e-3));
  double off = 0, weight = 0;
  for (size_t i = 0; i < sampled.size(); ++i) {
    off +=
        double(sampled.weight(i)) * std::fabs(double(sampled.old_logps[i]) - double(recomputed.old_logps[i]));
    weight += double(sampled.weight(i));
  }
  CHECK(figures.at("logp_diff_mean") / weight == Approx(off / weight).epsilon(1e-3));
}

// The fixture's replies as PPO sees them: rewards instead of advantages, the rollout's values; the model
// with the fixture's value head.
MicroBatch fixture_ppo_rollout(const H5Fixture& f, const TrainSpec& spec) {
  MicroBatch batch = fixture_rollout(f, spec);
  batch.advantages.clear();
  batch.rewards = f.floats("grpo/rewards");
  batch.old_values = f.floats("ppo/old_values");
  return batch;
}

TrainSpec fixture_ppo_spec(const H5Fixture& f) {
  TrainSpec spec = fixture_spec(f);
  spec.model.value_head = true;
  return spec;
}

void load_with_value_head(GPT& model, const H5Fixture& f) {
  for (const auto& p : model.params()) {
    const auto w = f.floats((p.name.starts_with("value_head.") ? "ppo/init/" : "init/") + p.name);
    REQUIRE(w.size() == p.numel);
    std::copy(w.begin(), w.end(), model.weight(p.name).begin());
  }
  model.weights_changed();
}

PpoOptions fixture_ppo(const H5Fixture& f) {
  return {f.attr("ppo/gamma"), f.attr("ppo/lam"), f.attr("ppo/value_coef"), f.attr("ppo/value_clip")};
}

TEST_CASE("GAE: one-step errors at lambda 0, reward minus value at gamma = lambda = 1", "[trainer][ppo]") {
  const std::vector<float> rewards = {0, 0, 2}, values = {0.5f, 1.0f, 1.5f};
  std::vector<float> adv(3);
  gae(rewards, values, 1.0, 1.0, adv);
  CHECK(adv == std::vector<float>{1.5f, 1.0f, 0.5f});  // 2 - V_t
  gae(rewards, values, 0.5, 0.0, adv);
  CHECK(adv == std::vector<float>{0.0f, -0.25f, 0.5f});  // r_t + 0.5 V_(t+1) - V_t
  gae(rewards, values, 0.5, 0.5, adv);
  CHECK(adv[2] == 0.5f);
  CHECK(adv[1] == Approx(-0.25 + 0.25 * 0.5));
  CHECK(adv[0] == Approx(0.0 + 0.25 * (-0.25 + 0.25 * 0.5)));
}

TEST_CASE("PPO matches PyTorch: advantages by GAE, the clipped value loss, the value head's gradients",
          "[trainer][parity][ppo]") {
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_ppo_spec(f);
  for (const auto& [norm, group] :
       {std::pair{GrpoOptions::Norm::kToken, "token"}, std::pair{GrpoOptions::Norm::kSequence, "sequence"}}) {
    INFO(group);
    GrpoOptions policy = fixture_grpo(f, norm);
    const auto loss = std::make_shared<PpoLoss>(policy, fixture_ppo(f));
    GPT model(spec.model, {.batch = 4, .loss = loss});
    load_with_value_head(model, f);
    const MicroBatch batch = fixture_ppo_rollout(f, spec);
    REQUIRE_FALSE(batch.problem(spec.model.vocab, spec.model.max_positions));
    model.zero_grad();
    const double weight = loss->weight(batch);
    const LossSums sums = model.forward_backward(batch, float(1.0 / weight));
    const double ref_loss = f.doubles(std::string("ppo/") + group + "/loss")[0];
    CHECK(std::abs(sums.loss / sums.weight - ref_loss) < 1e-5 * std::max(1.0, std::abs(ref_loss)));
    for (const auto& p : model.params()) {
      INFO(p.name);
      CHECK(rel_diff(model.grad(p.name), f.floats(std::string("ppo/") + group + "/grad/" + p.name)) < 2e-5);
    }
    const auto m = loss->take_metrics();
    const std::map<std::string, double> figures(m.begin(), m.end());
    CHECK(figures.at("value_clip_fraction") > 0);  // the fixture's old values are off by more than the clip
    CHECK(figures.at("value_loss") > 0);
    CHECK(figures.at("clip_fraction") > 0);
  }
}

TEST_CASE("PPO on policy: ratio exactly 1, the values the forward's own, the clip never holds",
          "[trainer][ppo]") {
  // One update per rollout: no old values; the forward's own (detached) are the rollout's, so the value
  // term is the plain squared error to the returns, and the loss equals the off-policy loss given those
  // values as old ones, bit for bit.
  const H5Fixture f(fixture_path());
  const TrainSpec spec = fixture_ppo_spec(f);
  MicroBatch recorded = fixture_ppo_rollout(f, spec);
  const auto record = std::make_shared<TokenLogps>(true);
  GPT sampler(spec.model, {.batch = 4, .loss = record});
  load_with_value_head(sampler, f);
  sampler.forward_loss(recorded);
  recorded.old_logps = recorded.ref_logps = record->last();
  recorded.old_values = record->last_values();

  auto run = [&](const MicroBatch& batch, bool on_policy) {
    const auto loss = std::make_shared<PpoLoss>(
        GrpoOptions{0.2, 0.28, 0.05, GrpoOptions::Norm::kToken, on_policy}, fixture_ppo(f));
    GPT model(spec.model, {.batch = 4, .loss = loss});
    load_with_value_head(model, f);
    model.zero_grad();
    const LossSums sums = model.forward_backward(batch, float(1.0 / loss->weight(batch)));
    std::vector<float> grads(model.grads().begin(), model.grads().end());
    const auto m = loss->take_metrics();
    return std::tuple{sums.loss, grads, std::map<std::string, double>(m.begin(), m.end())};
  };
  MicroBatch on_policy = recorded;
  on_policy.old_values.clear();
  const auto [loss_recorded, grads_recorded, figures_recorded] = run(recorded, false);
  const auto [loss_on_policy, grads_on_policy, figures] = run(on_policy, true);
  CHECK(loss_on_policy == loss_recorded);
  CHECK(grads_on_policy == grads_recorded);
  CHECK(figures.at("ratio") == recorded.weight_sum());
  CHECK(figures.at("kl") == 0.0);
  CHECK(figures.at("value_clip_fraction") == 0.0);
  CHECK(figures_recorded.at("value_clip_fraction") == 0.0);
  CHECK(figures.at("value_loss") > 0);
}
