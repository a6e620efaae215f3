// Silent-error guards: the [guard] keys, the non-finite step policy, loss spikes, stragglers, replica
// checksums and duplicate samples.
#include "forge/trainer/guard.h"

#include "forge/common/activity.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/trainer/step_stats.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>
#include <unordered_map>

namespace forge::trainer {

void add_guard_keys(ConfigSchema& s) {
  s.add_choice("guard.nonfinite", "skip", {"skip", "rewind"},
               "a NaN/Inf loss or gradient norm drops the step's update (skip) or reloads the newest "
               "recovery checkpoint (rewind)")
      .add<int>("guard.max_bad_steps", 3, "consecutive non-finite steps tolerated; one more exits 71")
      .add<int>("guard.spike_window", 50, "losses the spike z-score is computed over")
      .add<double>("guard.spike_z", 6.0, "z-score above the window mean that counts as a loss spike")
      .add<double>("guard.straggler_margin", 0.2,
                   "a rank slower than the median step time by this fraction is straggling")
      .add<int>("guard.straggler_steps", 20, "consecutive straggling steps before a rank is flagged")
      .add<int64_t>("guard.checksum_every", 0, "steps between DP-replica parameter checksums (0: off)")
      .add<double>("guard.watchdog_s", 600, "seconds without progress before exit 69 (0: no watchdog)")
      .add<int64_t>("guard.inject_nan_step", 0, "testing: poison this step's loss with NaN (0: off)")
      .add<int>("guard.inject_nan_count", 1, "testing: step computations poisoned from inject_nan_step on")
      .add<int64_t>("guard.inject_hang_step", 0, "testing: hang in this step (0: off)")
      .add<int64_t>("guard.inject_duplicate_step", 0,
                    "testing: every data-parallel rank claims sample 0 in this step (0: off)")
      .add<int>("guard.inject_hang_rank", -1, "testing: only this rank hangs (-1: every rank)")
      .add<int>("guard.dead_expert_steps", 100,
                "MoE: steps an expert may go without a token before it is reported dead")
      .add_choice("guard.dead_expert_action", "report", {"report", "stop"},
                  "MoE: a dead expert is reported in the metrics and the log, or stops the run (exit 71)")
      .add<double>("guard.expert_imbalance", 2.0,
                   "MoE: log a block whose busiest expert gets more than this times the mean (0: off)")
      .add<std::string>("guard.inject_dead_expert", "",
                        "testing: L/E, the router of block L never chooses expert E (empty: off)");
}

GuardConfig guard_config(const Config& c) {
  GuardConfig g;
  g.policy =
      c.get<std::string>("guard.nonfinite") == "rewind" ? NonFinitePolicy::kRewind : NonFinitePolicy::kSkip;
  g.max_bad_steps = c.get<int>("guard.max_bad_steps");
  g.spike_window = c.get<int>("guard.spike_window");
  g.spike_z = c.get<double>("guard.spike_z");
  g.straggler_margin = c.get<double>("guard.straggler_margin");
  g.straggler_steps = c.get<int>("guard.straggler_steps");
  g.checksum_every = c.get<int64_t>("guard.checksum_every");
  g.watchdog_s = c.get<double>("guard.watchdog_s");
  g.inject_nan_step = c.get<int64_t>("guard.inject_nan_step");
  g.inject_nan_count = c.get<int>("guard.inject_nan_count");
  g.inject_hang_step = c.get<int64_t>("guard.inject_hang_step");
  g.inject_duplicate_step = c.get<int64_t>("guard.inject_duplicate_step");
  g.inject_hang_rank = c.get<int>("guard.inject_hang_rank");
  g.dead_expert_steps = c.get<int>("guard.dead_expert_steps");
  g.dead_expert_stop = c.get<std::string>("guard.dead_expert_action") == "stop";
  g.expert_imbalance = c.get<double>("guard.expert_imbalance");
  if (g.dead_expert_steps < 1) c.reject("guard.dead_expert_steps", "must be at least 1");
  if (!(g.expert_imbalance == 0 || g.expert_imbalance > 1))
    c.reject("guard.expert_imbalance",
             "must be above 1 (a ratio of the busiest expert to the mean), or 0: off");
  if (const std::string dead = c.get<std::string>("guard.inject_dead_expert"); !dead.empty()) {
    int layer = -1, expert = -1, used = 0;
    if (std::sscanf(dead.c_str(), "%d/%d%n", &layer, &expert, &used) != 2 || size_t(used) != dead.size() ||
        layer < 0 || expert < 0)
      c.reject("guard.inject_dead_expert", "expected L/E: a block and an expert index, e.g. 1/3");
    g.inject_dead_layer = layer;
    g.inject_dead_expert = expert;
  }
  if (g.max_bad_steps < 0)
    c.reject("guard.max_bad_steps", "must be >= 0 (0: the first non-finite step exits 71)");
  if (g.spike_window < 2) c.reject("guard.spike_window", "must be at least 2");
  if (!(g.spike_z > 0)) c.reject("guard.spike_z", "must be > 0");
  if (!(g.straggler_margin > 0)) c.reject("guard.straggler_margin", "must be > 0 (a fraction, 0.2 = 20%)");
  if (g.straggler_steps < 1) c.reject("guard.straggler_steps", "must be at least 1");
  if (g.checksum_every < 0) c.reject("guard.checksum_every", "must be >= 0 (0: off)");
  if (!(g.watchdog_s >= 0)) c.reject("guard.watchdog_s", "must be >= 0 (0: no watchdog)");
  if (g.inject_nan_step < 0) c.reject("guard.inject_nan_step", "must be >= 0 (0: off)");
  if (g.inject_nan_count < 1) c.reject("guard.inject_nan_count", "must be at least 1");
  if (g.inject_hang_step < 0) c.reject("guard.inject_hang_step", "must be >= 0 (0: off)");
  if (g.inject_duplicate_step < 0) c.reject("guard.inject_duplicate_step", "must be >= 0 (0: off)");
  return g;
}

// ---- spikes ----

SpikeDetector::SpikeDetector(int window, double z) : window_(size_t(std::max(window, 2))), z_(z) {}

std::optional<double> SpikeDetector::observe(double loss) {
  if (!std::isfinite(loss)) return std::nullopt;
  std::optional<double> spike;
  if (values_.size() == window_) {
    const double n = double(window_);
    const double mean = sum_ / n;
    const double var = std::max(0.0, sum_sq_ / n - mean * mean);
    // A floor on the deviation so a flat window does not turn rounding noise into spikes.
    const double sd = std::max(std::sqrt(var), 1e-6 * std::max(1.0, std::abs(mean)));
    const double z = (loss - mean) / sd;
    if (z > z_) spike = z;
    sum_ -= values_.front();
    sum_sq_ -= values_.front() * values_.front();
    values_.pop_front();
  }
  // Spikes enter the window too: a lasting level shift becomes the new normal instead of a spike per step.
  values_.push_back(loss);
  sum_ += loss;
  sum_sq_ += loss * loss;
  return spike;
}

// ---- the per-step guard ----

StepGuard::StepGuard(const GuardConfig& config)
    : config_(config),
      spikes_detector_(config.spike_window, config.spike_z),
      injections_left_(config.inject_nan_step > 0 ? config.inject_nan_count : 0) {}

bool StepGuard::before_step(int64_t step, int rank, std::span<MicroBatch> batches) {
  if (config_.inject_duplicate_step == step && !batches.empty() && batches[0].rows > 0) {
    batches[0].sample_ids[0] = 0;
    batches[0].epochs[0] = 0;
  }
  const bool nan = inject_nan(step);
  if (config_.inject_hang_step == step &&
      (config_.inject_hang_rank < 0 || config_.inject_hang_rank == rank)) {
    mark_activity("forward_backward");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return nan;
}

bool StepGuard::inject_nan(int64_t step) {
  if (injections_left_ == 0) return false;
  if (!injecting_ && step != config_.inject_nan_step) return false;
  injecting_ = true;
  --injections_left_;
  return true;
}

namespace {
Json number_or_null(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}
std::string describe(double v) {
  return std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "+Inf" : "-Inf") : fmt::format("{:.6g}", v);
}
}  // namespace

void StepGuard::watch_experts(const StepStats& s) {
  idle_steps_.resize(s.moe.size());
  imbalanced_.resize(s.moe.size(), 0);
  for (size_t i = 0; i < s.moe.size(); ++i) {
    const RouterStats& r = s.moe[i];
    std::vector<int64_t>& idle = idle_steps_[i];
    idle.resize(r.tokens.size(), 0);
    double most = 0, sum = 0;
    for (size_t e = 0; e < r.tokens.size(); ++e) {
      most = std::max(most, r.tokens[e]);
      sum += r.tokens[e];
      idle[e] = r.tokens[e] > 0 ? 0 : idle[e] + 1;
      if (idle[e] != config_.dead_expert_steps) continue;
      if (config_.dead_expert_stop)
        fail(ExitCode::kNumeric,
             "step {}: dead expert {}/{}: the router of block {} sent it no token for {} steps "
             "(guard.dead_expert_steps); raise model.router_aux_coef, lower optim.lr or resume from an "
             "earlier checkpoint (guard.dead_expert_action = report trains on)",
             s.step, r.layer, e, r.layer, idle[e]);
      events_.push_back({{"kind", "dead_expert"},
                         {"step", s.step},
                         {"layer", r.layer},
                         {"expert", e},
                         {"idle_steps", idle[e]}});
    }
    const double ratio = sum > 0 ? most / (sum / double(r.tokens.size())) : 0;
    const bool above = config_.expert_imbalance > 0 && ratio > config_.expert_imbalance;
    if (above && !imbalanced_[i])
      events_.push_back(
          {{"kind", "expert_imbalance"}, {"step", s.step}, {"layer", r.layer}, {"max_over_mean", ratio}});
    imbalanced_[i] = above;
  }
}

GuardAction StepGuard::after_step(const StepStats& s) {
  watch_experts(s);
  if (s.finite) {
    if (s.step >= last_bad_step_) consecutive_bad_ = 0;
    if (const auto z = spikes_detector_.observe(s.loss)) {
      ++spikes_;
      events_.push_back({{"kind", "loss_spike"}, {"step", s.step}, {"loss", s.loss}, {"z", *z}});
    }
    return GuardAction::kApply;
  }
  ++consecutive_bad_;
  last_bad_step_ = s.step;
  const bool rewind = config_.policy == NonFinitePolicy::kRewind;
  if (consecutive_bad_ > config_.max_bad_steps)
    fail(
        ExitCode::kNumeric,
        "step {}: loss {}, gradient norm {}: {} consecutive non-finite step{}, more than guard.max_bad_steps "
        "= {} (guard.nonfinite = {}); lower optim.lr, check the data, or resume from an earlier checkpoint",
        s.step, describe(s.loss), describe(s.grad_norm), consecutive_bad_, consecutive_bad_ == 1 ? "" : "s",
        config_.max_bad_steps, rewind ? "rewind" : "skip");
  events_.push_back({{"kind", "nonfinite"},
                     {"step", s.step},
                     {"loss", number_or_null(s.loss)},
                     {"grad_norm", number_or_null(s.grad_norm)},
                     {"action", rewind ? "rewind" : "skip"}});
  if (rewind) {
    ++rewinds_;
    return GuardAction::kRewind;
  }
  ++skipped_;
  return GuardAction::kSkip;
}

void StepGuard::rewound_to(int64_t step) {
  events_.push_back({{"kind", "rewind"}, {"to_step", step}});
}

std::vector<Json> StepGuard::take_events() {
  std::vector<Json> out;
  out.swap(events_);
  return out;
}

Json StepGuard::summary() const {
  return {{"skipped_steps", skipped_}, {"rewinds", rewinds_}, {"loss_spikes", spikes_}};
}

// ---- stragglers ----

StragglerDetector::StragglerDetector(double margin, int steps) : margin_(margin), steps_(steps) {}

std::vector<int> StragglerDetector::observe(std::span<const double> t) {
  if (streak_.size() != t.size()) streak_.assign(t.size(), 0);
  std::vector<double> sorted(t.begin(), t.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  std::vector<int> flagged;
  if (n == 0) return flagged;
  const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  for (size_t r = 0; r < n; ++r) {
    streak_[r] = t[r] > median * (1.0 + margin_) ? streak_[r] + 1 : 0;
    if (streak_[r] >= steps_) flagged.push_back(int(r));
  }
  return flagged;
}

// ---- replica checksums ----

uint64_t parameter_checksum(std::span<const float> weights) {
  return xxh3_64(weights.data(), weights.size_bytes());
}

std::vector<int> diverging_replicas(std::span<const uint64_t> checksums) {
  std::vector<int> out;
  if (checksums.empty()) return out;
  std::map<uint64_t, int> count;
  for (const uint64_t c : checksums) ++count[c];
  // The majority value; on a tie the one rank 0 holds (rank 0 is what a checkpoint would save).
  uint64_t reference = checksums[0];
  for (const auto& [value, n] : count)
    if (n > count[reference]) reference = value;
  for (size_t r = 0; r < checksums.size(); ++r)
    if (checksums[r] != reference) out.push_back(int(r));
  return out;
}

void check_replicas(int64_t step, std::span<const uint64_t> checksums) {
  const auto bad = diverging_replicas(checksums);
  if (bad.empty()) return;
  uint64_t good = 0;
  for (size_t r = 0; r < checksums.size(); ++r)
    if (std::find(bad.begin(), bad.end(), int(r)) == bad.end()) good = checksums[r];
  fail(ExitCode::kNumeric,
       "step {}: data-parallel replicas diverged: rank{} {} hold{} parameter checksum {:016x} where the "
       "other {} rank{} hold {:016x}; a rank computes differently (hardware fault or non-determinism): "
       "resume from the last checkpoint on other nodes",
       step, bad.size() == 1 ? "" : "s", fmt::join(bad, ", "), bad.size() == 1 ? "s" : "",
       checksums[size_t(bad[0])], checksums.size() - bad.size(),
       checksums.size() - bad.size() == 1 ? "" : "s", good);
}

// ---- duplicate samples ----

std::vector<SampleCollision> duplicate_samples(std::span<const std::vector<uint64_t>> ids) {
  // The first rank that trained each id.
  std::unordered_map<uint64_t, int> owner;
  std::vector<SampleCollision> out;
  for (size_t r = 0; r < ids.size(); ++r) {
    for (const uint64_t id : ids[r]) {
      const auto [it, inserted] = owner.emplace(id, int(r));
      if (!inserted && it->second != int(r)) out.push_back({id, it->second, int(r)});
    }
  }
  // One entry per (sample, extra rank), however often a rank repeats it.
  std::sort(out.begin(), out.end(), [](const SampleCollision& a, const SampleCollision& b) {
    return std::tie(a.rank_a, a.sample, a.rank_b) < std::tie(b.rank_a, b.sample, b.rank_b);
  });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const SampleCollision& a, const SampleCollision& b) {
                          return a.sample == b.sample && a.rank_a == b.rank_a && a.rank_b == b.rank_b;
                        }),
            out.end());
  return out;
}

void check_no_duplicate_samples(int64_t step, std::span<const std::vector<uint64_t>> ids) {
  const auto dup = duplicate_samples(ids);
  if (dup.empty()) return;
  fail(ExitCode::kData,
       "step {}: data-parallel ranks {} and {} both trained sample {} of epoch {} ({} duplicate{} in all); "
       "the data is not sharded by DP rank: check data.* and the reader's rank/world settings",
       step, dup[0].rank_a, dup[0].rank_b, dup[0].sample & ((uint64_t(1) << 48) - 1), dup[0].sample >> 48,
       dup.size(), dup.size() == 1 ? "" : "s");
}

}  // namespace forge::trainer
