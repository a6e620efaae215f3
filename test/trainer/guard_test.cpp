// Guards against silent errors and the watchdog (trainer/include/forge/trainer/{guard,watchdog}.h).
#include "forge/trainer/guard.h"
#include "forge/common/activity.h"
#include "forge/common/error.h"
#include "forge/trainer/spec.h"
#include "forge/trainer/watchdog.h"
#include "support/training.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

using namespace forge::trainer;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

StepStats stats(int64_t step, double loss, bool finite = true) {
  StepStats s;
  s.step = step;
  s.loss = loss;
  s.grad_norm = finite ? 1.0 : kNaN;
  s.finite = finite;
  return s;
}

forge::ExitCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    return e.code();
  }
  return forge::ExitCode::kOk;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("skip policy drops non-finite steps and exits 71 when they persist", "[guard]") {
  GuardConfig c;
  c.max_bad_steps = 2;
  StepGuard g(c);
  CHECK(g.after_step(stats(1, 3.0)) == GuardAction::kApply);
  CHECK(g.after_step(stats(2, kNaN, false)) == GuardAction::kSkip);
  CHECK(g.after_step(stats(3, kNaN, false)) == GuardAction::kSkip);
  CHECK(g.skipped() == 2);
  // A finite step resets the streak.
  CHECK(g.after_step(stats(4, 2.9)) == GuardAction::kApply);
  CHECK(g.consecutive_bad() == 0);
  CHECK(g.after_step(stats(5, kNaN, false)) == GuardAction::kSkip);
  CHECK(g.after_step(stats(6, kNaN, false)) == GuardAction::kSkip);
  const std::string msg = message_of([&] { g.after_step(stats(7, kNaN, false)); });
  CHECK_THAT(msg, Catch::Contains("step 7: loss NaN") && Catch::Contains("3 consecutive non-finite steps") &&
                      Catch::Contains("guard.max_bad_steps = 2") &&
                      Catch::Contains("guard.nonfinite = skip"));
  StepGuard strict(GuardConfig{.max_bad_steps = 0});
  CHECK(code_of([&] { strict.after_step(stats(1, kNaN, false)); }) == forge::ExitCode::kNumeric);

  const auto events = g.take_events();
  REQUIRE(events.size() == 4);
  CHECK(events[0]["kind"] == "nonfinite");
  CHECK(events[0]["step"] == 2);
  CHECK(events[0]["action"] == "skip");
  CHECK(events[0]["loss"].is_null());
  CHECK(g.take_events().empty());
}

TEST_CASE("rewind policy counts a step that fails again after replaying good steps", "[guard]") {
  GuardConfig c;
  c.policy = NonFinitePolicy::kRewind;
  c.max_bad_steps = 2;
  StepGuard g(c);
  for (int s = 1; s <= 6; ++s) CHECK(g.after_step(stats(s, 3.0)) == GuardAction::kApply);
  CHECK(g.after_step(stats(7, kNaN, false)) == GuardAction::kRewind);
  g.rewound_to(5);
  // The replayed steps before the bad one do not clear the streak...
  CHECK(g.after_step(stats(6, 3.0)) == GuardAction::kApply);
  CHECK(g.after_step(stats(7, kNaN, false)) == GuardAction::kRewind);
  CHECK(g.consecutive_bad() == 2);
  CHECK(g.after_step(stats(6, 3.0)) == GuardAction::kApply);
  CHECK(code_of([&] { g.after_step(stats(7, kNaN, false)); }) == forge::ExitCode::kNumeric);
  CHECK(g.rewinds() == 2);

  // ...but passing the bad step does.
  StepGuard h(c);
  CHECK(h.after_step(stats(7, kNaN, false)) == GuardAction::kRewind);
  CHECK(h.after_step(stats(6, 3.0)) == GuardAction::kApply);
  CHECK(h.after_step(stats(7, 3.0)) == GuardAction::kApply);
  CHECK(h.consecutive_bad() == 0);
  const auto events = h.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0]["action"] == "rewind");
}

TEST_CASE("the NaN hook poisons inject_nan_count computations from the first one of its step", "[guard]") {
  GuardConfig c;
  c.inject_nan_step = 3;
  c.inject_nan_count = 2;
  StepGuard g(c);
  CHECK_FALSE(g.inject_nan(1));
  CHECK_FALSE(g.inject_nan(2));
  CHECK(g.inject_nan(3));
  CHECK(g.inject_nan(2));  // after a rewind: the next computation, whatever its step
  CHECK_FALSE(g.inject_nan(3));
  CHECK_FALSE(g.inject_nan(4));
  StepGuard off{GuardConfig{}};
  for (int s = 0; s < 10; ++s) CHECK_FALSE(off.inject_nan(s));
}

TEST_CASE("loss spikes are judged by z-score over a full window", "[guard]") {
  SpikeDetector d(10, 4.0);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(d.observe(3.0 + 0.01 * (i % 3)));  // filling the window
  CHECK_FALSE(d.observe(3.02));
  CHECK_FALSE(d.observe(kNaN));  // non-finite values are the other guard's business
  const auto z = d.observe(4.0);
  REQUIRE(z);
  CHECK(*z > 4.0);
  CHECK_FALSE(d.observe(2.0));  // a drop is not a spike

  // Counted by the step guard, with an event.
  GuardConfig c;
  c.spike_window = 5;
  c.spike_z = 3;
  StepGuard g(c);
  for (int s = 1; s <= 5; ++s) g.after_step(stats(s, 2.0 + 0.01 * s));
  CHECK(g.spikes() == 0);
  g.after_step(stats(6, 9.0));
  CHECK(g.spikes() == 1);
  const auto events = g.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0]["kind"] == "loss_spike");
  CHECK(events[0]["step"] == 6);
  CHECK(events[0]["z"].get<double>() > 3);
  CHECK(g.summary()["loss_spikes"] == 1);
}

TEST_CASE("a rank slower than the median by the margin for N consecutive steps is a straggler", "[guard]") {
  StragglerDetector d(0.2, 3);
  const std::vector<double> slow2{1.0, 1.02, 1.5, 0.98};
  const std::vector<double> even{1.0, 1.02, 1.1, 0.98};
  CHECK(d.observe(slow2).empty());
  CHECK(d.observe(slow2).empty());
  CHECK(d.observe(slow2) == std::vector<int>{2});
  CHECK(d.observe(slow2) == std::vector<int>{2});
  CHECK(d.observe(even).empty());  // back within the margin: the streak restarts
  CHECK(d.observe(slow2).empty());
  // Two ranks: the median is their mean.
  StragglerDetector two(0.2, 1);
  CHECK(two.observe(std::vector<double>{1.0, 2.0}) == std::vector<int>{1});
  CHECK(two.observe(std::vector<double>{1.0, 1.1}).empty());
}

TEST_CASE("DP replica checksums: the ranks that differ from the majority are named", "[guard]") {
  const std::vector<float> w{1.0f, 2.0f, 3.0f};
  std::vector<float> w2 = w;
  w2[1] = std::nextafter(2.0f, 3.0f);
  const uint64_t a = parameter_checksum(w), b = parameter_checksum(w2);
  CHECK(a != b);
  CHECK(a == parameter_checksum(std::vector<float>(w)));
  CHECK(diverging_replicas(std::vector<uint64_t>{a, a, a, a}).empty());
  CHECK(diverging_replicas(std::vector<uint64_t>{a, a, b, a}) == std::vector<int>{2});
  CHECK(diverging_replicas(std::vector<uint64_t>{b, a, a, a}) == std::vector<int>{0});
  CHECK(diverging_replicas(std::vector<uint64_t>{a, b}) == std::vector<int>{1});  // tie: rank 0's value
  const std::string msg = message_of([&] { check_replicas(40, std::vector<uint64_t>{a, a, b, b, a}); });
  CHECK_THAT(msg, Catch::Contains("step 40") &&
                      Catch::Contains("ranks 2, 3 hold parameter checksum " + fmt::format("{:016x}", b)));
  CHECK(code_of([&] { check_replicas(40, std::vector<uint64_t>{a, b, a}); }) == forge::ExitCode::kNumeric);
  CHECK(code_of([&] { check_replicas(40, std::vector<uint64_t>{a, a}); }) == forge::ExitCode::kOk);
  CHECK_FALSE(checksum_due(5, 0));
  CHECK(checksum_due(10, 5));
  CHECK_FALSE(checksum_due(11, 5));
}

TEST_CASE("duplicate samples across DP ranks are named with both ranks", "[guard]") {
  const std::vector<std::vector<uint64_t>> clean{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  CHECK(duplicate_samples(clean).empty());
  // A rank repeating its own sample is not a cross-rank duplicate.
  CHECK(duplicate_samples(std::vector<std::vector<uint64_t>>{{1, 1}, {2}}).empty());
  const std::vector<std::vector<uint64_t>> dup{{1, 2, 3}, {4, 2, 6}, {7, 8, 2, 4}};
  const auto c = duplicate_samples(dup);
  REQUIRE(c.size() == 3);
  CHECK((c[0].sample == 2 && c[0].rank_a == 0 && c[0].rank_b == 1));
  CHECK((c[1].sample == 2 && c[1].rank_a == 0 && c[1].rank_b == 2));
  CHECK((c[2].sample == 4 && c[2].rank_a == 1 && c[2].rank_b == 2));
  const std::string msg = message_of([&] { check_no_duplicate_samples(9, dup); });
  CHECK_THAT(msg, Catch::Contains("step 9: data-parallel ranks 0 and 1 both trained sample 2 of epoch 0") &&
                      Catch::Contains("3 duplicates"));
  CHECK(code_of([&] { check_no_duplicate_samples(9, dup); }) == forge::ExitCode::kData);
}

TEST_CASE("[guard] keys are validated with the key named", "[guard]") {
  forge::ConfigSchema schema;
  add_trainer_keys(schema);
  const auto load = [&](std::vector<std::string> overrides) {
    return train_spec(forge::load_config(schema, "", overrides));
  };
  const TrainSpec s = load({"--guard.nonfinite=rewind", "--guard.max_bad_steps=5", "--guard.watchdog_s=30"});
  CHECK(s.guard.policy == NonFinitePolicy::kRewind);
  CHECK(s.guard.max_bad_steps == 5);
  CHECK(s.guard.watchdog_s == 30);
  CHECK_THAT(message_of([&] { load({"--guard.spike_window=1"}); }), Catch::Contains("guard.spike_window"));
  CHECK_THAT(message_of([&] { load({"--guard.max_bad_steps=-1"}); }), Catch::Contains("guard.max_bad_steps"));
  CHECK_THAT(message_of([&] { load({"--guard.nonfinite=panic"}); }), Catch::Contains("guard.nonfinite"));
  CHECK(code_of([&] { load({"--guard.watchdog_s=-1"}); }) == forge::ExitCode::kUsage);
  CHECK_THAT(message_of([&] { load({"--guard.dead_expert_steps=0"}); }),
             Catch::Contains("guard.dead_expert_steps"));
  CHECK_THAT(message_of([&] { load({"--guard.expert_imbalance=0.5"}); }),
             Catch::Contains("guard.expert_imbalance"));
  const std::vector<std::string> moe = {"--model.ffn=moe", "--model.experts=4", "--model.layers=2"};
  const auto with = [&](std::string hook) {
    auto o = moe;
    o.push_back(std::move(hook));
    return load(o);
  };
  CHECK(with("--guard.inject_dead_expert=1/3").guard.inject_dead_expert == 3);
  CHECK_THAT(message_of([&] { with("--guard.inject_dead_expert=2/0"); }),
             Catch::Contains("guard.inject_dead_expert"));
  CHECK_THAT(message_of([&] { with("--guard.inject_dead_expert=1/4"); }),
             Catch::Contains("guard.inject_dead_expert"));
  CHECK_THAT(message_of([&] { with("--guard.inject_dead_expert=x"); }),
             Catch::Contains("guard.inject_dead_expert"));
}

TEST_CASE("a dead expert is reported once per death, or stops the run; imbalance is logged on crossing",
          "[guard]") {
  // Block 1 of 4 experts: expert 2 idle for steps 1-3, busy at 4, idle again from 5; expert 0 takes every
  // token (4x the mean) at steps 2-3 only.
  const auto moe_step = [](int64_t step) {
    StepStats s = stats(step, 2.0);
    std::vector<double> tokens = {10, 10, step == 4 ? 10.0 : 0.0, 10};
    if (step == 2 || step == 3) tokens = {50, 0, 0, 0};
    s.moe = {RouterStats{1, tokens}};
    return s;
  };
  GuardConfig config;
  config.dead_expert_steps = 3;
  config.expert_imbalance = 2.0;
  StepGuard guard(config);
  std::vector<std::string> kinds;
  for (int64_t step = 1; step <= 8; ++step) {
    guard.after_step(moe_step(step));
    for (const auto& e : guard.take_events()) {
      kinds.push_back(fmt::format("{}@{}", e["kind"].get<std::string>(), step));
      if (e["kind"] == "dead_expert") CHECK((e["layer"] == 1 && e["idle_steps"] == 3));
    }
  }
  // Expert 2 dies at step 3 (experts 1 and 3, idle at steps 2-3 only, do not), and again at step 7.
  CHECK(kinds == std::vector<std::string>{"expert_imbalance@2", "dead_expert@3", "dead_expert@7"});

  config.dead_expert_stop = true;
  StepGuard stopping(config);
  stopping.after_step(moe_step(1));
  stopping.after_step(moe_step(2));
  const std::string why = message_of([&] { stopping.after_step(moe_step(3)); });
  CHECK_THAT(why, Catch::Contains("step 3: dead expert 1/2") && Catch::Contains("guard.dead_expert_steps"));
  StepGuard again(config);
  again.after_step(moe_step(1));
  again.after_step(moe_step(2));
  CHECK(code_of([&] { again.after_step(moe_step(3)); }) == forge::ExitCode::kNumeric);
}

TEST_CASE("a non-finite step leaves weights and moments unchanged and still counts", "[guard]") {
  forge::ConfigSchema schema;
  add_trainer_keys(schema);
  const TrainSpec spec = train_spec(
      forge::load_config(schema, "",
                         {"--run.threads=1", "--model.layers=1", "--model.d_model=16", "--model.heads=2",
                          "--model.vocab=32", "--model.seq_len=8", "--data.batch=2", "--run.steps=10"}));
  forge::test::OneProcess one(spec);
  ParallelTrainer& t = *one;
  std::vector<int32_t> windows(size_t(spec.batch) * size_t(spec.model.seq_len + 1));
  for (size_t i = 0; i < windows.size(); ++i) windows[i] = int32_t((i * 7) % 32);
  const forge::MicroBatch batch = forge::test::window_batch(windows, spec.batch, spec.model.seq_len);
  const std::span<const forge::MicroBatch> tokens(&batch, 1);
  CHECK(t.step(tokens).finite);
  const std::vector<float> weights(t.model().weights().begin(), t.model().weights().end());
  const std::vector<float> m(t.optimizer().m().begin(), t.optimizer().m().end());
  t.inject_nan_once();
  const StepStats bad = t.step(tokens);
  CHECK_FALSE(bad.finite);
  CHECK(bad.step == 2);
  CHECK(std::isnan(bad.loss));
  CHECK(t.steps_taken() == 2);
  CHECK(std::equal(weights.begin(), weights.end(), t.model().weights().begin()));
  CHECK(std::equal(m.begin(), m.end(), t.optimizer().m().begin()));
  const StepStats next = t.step(tokens);
  CHECK(next.finite);
  CHECK(next.step == 3);
  CHECK_FALSE(std::equal(weights.begin(), weights.end(), t.model().weights().begin()));
}

TEST_CASE("the watchdog names the operation that stopped beating and calls the abort callback",
          "[watchdog]") {
  forge::Activity activity;
  std::mutex mutex;
  std::vector<Hang> hangs;
  std::atomic<bool> stop_beating{false}, done{false};
  std::thread worker([&] {
    // Beats every 2 ms while "all_reduce dp", then hangs in "recv pp" with rank 3.
    while (!stop_beating) {
      activity.what = "all_reduce dp";
      activity.beats.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    activity.what = "recv pp";
    activity.peer = 3;
    activity.beats.fetch_add(1);
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  Watchdog dog(
      0.5, 5,
      [&](const Hang& h) {
        std::lock_guard lock(mutex);
        hangs.push_back(h);
      },
      activity);
  // Beating for several timeouts: never fires.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  {
    std::lock_guard lock(mutex);
    CHECK(hangs.empty());
  }
  CHECK_FALSE(dog.fired());
  stop_beating = true;
  for (int i = 0; i < 500 && !dog.fired(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(dog.fired());
  dog.stop();
  done = true;
  worker.join();
  std::lock_guard lock(mutex);
  REQUIRE(hangs.size() == 1);  // once
  CHECK(hangs[0].what == "recv pp");
  CHECK(hangs[0].peer == 3);
  CHECK(hangs[0].rank == 5);
  CHECK(hangs[0].seconds >= 0.5);
  CHECK_THAT(hangs[0].line, Catch::StartsWith("rank 5: no progress for ") &&
                                Catch::Contains("s in recv pp with rank 3 — aborting (exit 69)"));
}

TEST_CASE("a stopped or disabled watchdog never fires", "[watchdog]") {
  forge::Activity activity;
  bool called = false;
  {
    Watchdog off(
        0, 0, [&](const Hang&) { called = true; }, activity);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(off.fired());
  }
  Watchdog dog(
      0.05, 0, [&](const Hang&) { called = true; }, activity);
  dog.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  CHECK_FALSE(called);
  CHECK(
      hang_message(2, 61.4, "checkpoint", -1) ==
      "rank 2: no progress for 61s in checkpoint — aborting (exit 69): look for a dead, stuck or unreachable "
      "peer or disk in that rank's log and node, or raise guard.watchdog_s");
}
