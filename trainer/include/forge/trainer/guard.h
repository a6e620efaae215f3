// Guards against silent errors in a training run: the [guard] job-spec keys, the per-step decision on
// non-finite losses (skip or rewind, exit 71 when it persists), loss spikes by z-score, and pure helpers
// the multi-rank loop feeds with gathered values: stragglers from per-rank step times, DP replicas whose
// parameter checksums diverge, and samples trained by more than one DP rank. No MPI here: the caller
// gathers, these functions decide.
#pragma once

#include "forge/common/batch.h"
#include "forge/common/config.h"
#include "forge/common/json.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer {

struct StepStats;

enum class NonFinitePolicy { kSkip, kRewind };

struct GuardConfig {
  NonFinitePolicy policy = NonFinitePolicy::kSkip;
  int max_bad_steps = 3;          // consecutive non-finite steps tolerated; one more exits 71
  int spike_window = 50;          // finite losses the spike z-score is computed over
  double spike_z = 6.0;           // a loss this many standard deviations above the window's mean is a spike
  double straggler_margin = 0.2;  // slower than the median step time by this fraction...
  int straggler_steps = 20;       // ...for this many consecutive steps: flagged
  int64_t checksum_every = 0;     // steps between DP-replica parameter checksum comparisons (0: off)
  double watchdog_s = 600;        // no heartbeat for this long: exit 69 (0: no watchdog)
  // Mixture of Experts: an expert that gets no token for dead_expert_steps consecutive steps is dead
  // (reported, or exit 71 when dead_expert_stop); a block whose busiest expert gets more than
  // expert_imbalance x the mean is logged when it crosses the threshold (0: off).
  int dead_expert_steps = 100;
  bool dead_expert_stop = false;
  double expert_imbalance = 2.0;
  // Testing hooks: the first inject_nan_count step computations from the first computation of step
  // inject_nan_step get a NaN loss; step inject_hang_step hangs in "forward_backward"; in step
  // inject_duplicate_step every data-parallel rank reports sample 0 of epoch 0 as its first (0: off).
  int64_t inject_nan_step = 0;
  int inject_nan_count = 1;
  int64_t inject_hang_step = 0;
  int inject_hang_rank = -1;  // the rank that hangs (-1: all)
  int64_t inject_duplicate_step = 0;
  // Testing hook (guard.inject_dead_expert = "L/E"): the router of block L never chooses expert E.
  int inject_dead_layer = -1, inject_dead_expert = -1;
};

// Registers the [guard] keys (called by add_trainer_keys).
void add_guard_keys(ConfigSchema& schema);
// Validated [guard] section (usage errors name the key).
GuardConfig guard_config(const Config& config);

// What the loop does with a step it just computed.
enum class GuardAction {
  kApply,   // the step's update stands
  kSkip,    // non-finite: the update was dropped (weights and moments unchanged); carry on
  kRewind,  // non-finite: reload the newest recovery checkpoint and train on from there
};

// Loss z-score over a sliding window of finite losses. Upward deviations only: a falling loss is the point.
class SpikeDetector {
 public:
  SpikeDetector(int window, double z);
  // Adds `loss` to the window; returns its z-score when it is a spike. Judges only once the window is
  // full, so the first `window` steps never count.
  std::optional<double> observe(double loss);

 private:
  size_t window_;
  double z_;
  std::deque<double> values_;
  double sum_ = 0, sum_sq_ = 0;
};

// The per-step guard of one run: non-finite policy, spike detection, the NaN test hook and the counters
// that go into metrics and summary.json. The same on every rank, given the same StepStats.
class StepGuard {
 public:
  explicit StepGuard(const GuardConfig& config);

  // The test hooks ([guard] inject_*) of the computation of `step` (1-based), called once before it with
  // the batches it will train on, on rank `rank`: reports sample 0 of epoch 0 as the first row's
  // (inject_duplicate_step), hangs for good in "forward_backward" (inject_hang_step on inject_hang_rank,
  // for the watchdog), and returns whether to poison the computation's loss with a NaN (inject_nan).
  bool before_step(int64_t step, int rank, std::span<MicroBatch> batches);
  // The NaN hook alone: true for the inject_nan_count computations from the first of inject_nan_step on.
  bool inject_nan(int64_t step);

  // Decides what to do with a computed step. Non-finite steps count as consecutive until a finite step
  // at or past the last bad one (so a rewind that replays good steps and fails again at the same place
  // still counts); more than max_bad_steps of them throw forge::Error(kNumeric) naming the step and
  // what to do. Records events for the step's metrics record.
  GuardAction after_step(const StepStats& stats);

  // Events since the last call, as JSON objects for the "guard_events" field of a metrics record:
  // {"kind": "nonfinite", "step", "loss", "grad_norm", "action": "skip"|"rewind"},
  // {"kind": "loss_spike", "step", "loss", "z"}, {"kind": "dead_expert", "step", "layer", "expert",
  // "idle_steps"} (once per expert until it gets tokens again) or {"kind": "expert_imbalance", "step",
  // "layer", "max_over_mean"} (when a block crosses guard.expert_imbalance).
  std::vector<Json> take_events();
  // A rewind landed on `step`: recorded as an event {"kind": "rewind", "to_step"}.
  void rewound_to(int64_t step);

  int64_t skipped() const { return skipped_; }
  int64_t rewinds() const { return rewinds_; }
  int64_t spikes() const { return spikes_; }
  int consecutive_bad() const { return consecutive_bad_; }
  // {"skipped_steps", "rewinds", "loss_spikes"} for summary.json.
  Json summary() const;

 private:
  void watch_experts(const StepStats& stats);

  GuardConfig config_;
  SpikeDetector spikes_detector_;
  std::vector<std::vector<int64_t>>
      idle_steps_;                // per MoE block and expert: consecutive steps without tokens
  std::vector<char> imbalanced_;  // per MoE block: above guard.expert_imbalance last step
  int consecutive_bad_ = 0;
  int64_t last_bad_step_ = 0;
  int64_t skipped_ = 0, rewinds_ = 0, spikes_ = 0;
  int injections_left_;
  bool injecting_ = false;
  std::vector<Json> events_;
};

// Ranks slower than the median step time by more than `margin` (a fraction) for `steps` consecutive
// steps. Feed it every step with all ranks' step times (gathered on one rank or everywhere).
class StragglerDetector {
 public:
  StragglerDetector(double margin, int steps);
  // Returns the ranks flagged at this step (streak >= steps), ascending. The rank count may not change.
  std::vector<int> observe(std::span<const double> step_seconds);

 private:
  double margin_;
  int steps_;
  std::vector<int> streak_;
};

// True when the DP replicas' parameter checksums are compared after step `step` (every > 0).
inline bool checksum_due(int64_t step, int64_t every) {
  return every > 0 && step > 0 && step % every == 0;
}
// xxh3-64 of a replica's parameters (bitwise: replicas of one model must agree exactly).
uint64_t parameter_checksum(std::span<const float> weights);
// The DP ranks whose checksum differs from the majority's (ties: the value rank 0's group holds).
std::vector<int> diverging_replicas(std::span<const uint64_t> checksums);
// Throws forge::Error(kNumeric) naming the step, the diverging ranks and both checksums when any
// replica diverges.
void check_replicas(int64_t step, std::span<const uint64_t> checksums);

// How the duplicate-sample guard names a trained sample: its dataset-global id (below 2^48) and the epoch
// it was drawn in, since a sample legitimately recurs once per epoch.
constexpr uint64_t sample_key(uint64_t sample_id, uint32_t epoch) {
  return uint64_t(epoch) << 48 | (sample_id & ((uint64_t(1) << 48) - 1));
}

// A sample key trained by two DP ranks in the same window.
struct SampleCollision {
  uint64_t sample = 0;
  int rank_a = 0, rank_b = 0;  // rank_a < rank_b
};
// `ids[r]` holds the sample keys DP rank r trained (a step or a window of steps). Returns every
// id found on more than one rank (one entry per extra rank), in order of rank_a, then sample.
std::vector<SampleCollision> duplicate_samples(std::span<const std::vector<uint64_t>> ids);
// Throws forge::Error(kData) naming the step, the first collision's ranks and sample, and the count.
void check_no_duplicate_samples(int64_t step, std::span<const std::vector<uint64_t>> ids);

}  // namespace forge::trainer
