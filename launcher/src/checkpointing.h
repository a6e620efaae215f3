// The run's checkpoints inside forge-train: the [ckpt] keys, resume from the newest valid checkpoint
// (with the post-load verification step), scheduled recovery/milestone saves, and the save on
// preemption.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/coordinator.h"
#include "forge/ckpt/manifest.h"
#include "forge/ckpt/policy.h"
#include "forge/ckpt/saver.h"
#include "forge/comm/coordinator.h"
#include "forge/common/config.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/parallel.h"

#include "data_source.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace forge::launcher {

void add_checkpoint_keys(ConfigSchema& schema);

class RunCheckpoints {
 public:
  // Collective over the trainer's world: every rank saves its pieces and loads what it holds.
  RunCheckpoints(const Config& config, const trainer::TrainSpec& spec, trainer::ParallelTrainer& trainer,
                 const DataSource& data);

  // Loads the newest valid checkpoint of the run directory (or, on a fresh run, ckpt.init_from's
  // weights and ckpt.init_vision_from's vision tower) and returns the number of steps already done. A
  // checkpoint of another model or dataset stops the run (64/65); one whose verification step disagrees is a
  // data error (65).
  int64_t resume();

  // guard.nonfinite = rewind: waits for the save in flight, reloads the newest valid checkpoint (with
  // its verification step) and returns its step. No checkpoint to go back to is exit 71.
  int64_t rewind();

  // After a finished step: saves a recovery or milestone checkpoint when one is due. `batches` are this
  // rank's micro-batches of the step (the first one, gathered over the data-parallel group, becomes the
  // verification batch).
  void after_step(const trainer::StepStats& stats, int64_t tokens_so_far,
                  std::span<const MicroBatch> batches);

  // Saves a recovery checkpoint of the current state now and waits for it to commit (preemption).
  void save_now(const trainer::StepStats& stats, int64_t tokens_so_far, std::span<const MicroBatch> batches);

  // Waits for the save in flight; saves a final milestone unless the last step has one.
  void finish(const trainer::StepStats& stats, int64_t tokens_so_far, std::span<const MicroBatch> batches);

  // Finished save events (for metrics).
  std::vector<ckpt::SaveEvent> take_events() { return saver_.take_events(); }
  // The step of the newest checkpoint saved or started (or resumed from).
  int64_t last_saved_step() const { return last_saved_step_; }
  // Rank 0: the step of the newest checkpoint this process has committed, as soon as it is on disk.
  int64_t committed_step() const { return saver_.committed_step(); }
  // The step outcome (metrics.h) saved with the checkpoint last loaded; null before a load, or for a
  // checkpoint that kept none.
  const Json& loaded_outcome() const { return loaded_outcome_; }

 private:
  ckpt::Expectations expectations() const;
  int64_t load(const ckpt::Checkpoint& checkpoint, const char* verb);
  // A fresh run: ckpt.init_from's weights (and moments), then ckpt.init_vision_from's vision tower.
  void start_from_parent();
  void start_vision_from();
  ckpt::CheckpointMeta meta(const trainer::StepStats& stats, int64_t tokens, const MicroBatch& first);
  ckpt::SaveEvent save(ckpt::Tier tier, const trainer::StepStats& stats, int64_t tokens,
                       std::span<const MicroBatch> batches, bool wait);

  const Config& config_;
  const trainer::TrainSpec& spec_;
  trainer::ParallelTrainer& trainer_;
  const DataSource& data_;
  trainer::SaveRole role_;
  std::string dataset_version_, tokenizer_, init_from_, init_vision_from_;
  // Where the run's weights came from (ckpt.init_from): that checkpoint, its dataset version and spec, and
  // its own lineage; with ckpt.init_vision_from, "vision_from": the tower's origin (trainer::
  // load_hf_vision_tower). Kept in every checkpoint's manifest (extra.lineage) and carried across resumes.
  Json lineage_;
  // The digest of the image the ranks run in ("" outside one): every checkpoint records it (extra.image).
  std::string image_;
  Json loaded_outcome_;
  ckpt::TierPolicy tiers_;
  comm::CommCoordinator coord_;
  ckpt::Saver saver_;
  int64_t last_saved_step_ = 0;
  std::chrono::steady_clock::time_point last_save_time_ = std::chrono::steady_clock::now();
};

}  // namespace forge::launcher
