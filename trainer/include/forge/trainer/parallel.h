// The hybrid-parallel training step: one process's slice of the model (its pipeline stage's layers, its
// tensor-parallel shard), the 1F1B pipeline schedule over micro-batches, data-parallel gradient
// reduction in buckets launched as backward finishes each layer, and ZeRO-1 (optimizer state sharded
// across the data-parallel group: reduce-scatter gradients, update the local shard, all-gather
// parameters). The math is the single-process Trainer's: the same spec gives the same losses on every
// layout, up to floating-point summation order.
#pragma once

#include "forge/trainer/groups.h"
#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"
#include "forge/trainer/spec.h"
#include "forge/trainer/trainer.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer {

// Layer boundaries of `pp` pipeline stages: stage s holds blocks [bounds[s], bounds[s+1]). `counts`
// (blocks per stage) overrides; empty: balanced by forward FLOPs, the classifier counted on the last stage.
// Throws forge::Error(kUsage) when a stage would get no block or the counts do not add up (layout_problem).
std::vector<int> stage_bounds(const ModelConfig& config, int pp, const std::vector<int>& counts = {});

class ParallelTrainer {
 public:
  // Builds this rank's slice, initialized from spec.seed exactly as the whole model would be.
  ParallelTrainer(const TrainSpec& spec, ProcessGroups& groups);
  ~ParallelTrainer();

  GPT& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  ProcessGroups& groups() { return groups_; }
  int64_t steps_taken() const { return optimizer_->steps_taken(); }
  const std::vector<int>& bounds() const { return bounds_; }

  // Token ids of one global step: microbatches x (dp x batch) x (seq_len + 1). Every rank is given the
  // same global step and takes its data-parallel rank's rows of each micro-batch.
  size_t tokens_per_step() const;
  // One optimizer step (collective over the world). loss is the global mean, identical on every rank;
  // a non-finite loss or norm drops the update on every rank (finite = false).
  StepStats step(std::span<const int32_t> tokens);
  // Mean loss of one global micro-batch (dp x batch rows of seq_len + 1 tokens), forward only, through the
  // pipeline (collective; the same value on every rank). Checkpoint resumes verify with it.
  double loss_of(std::span<const int32_t> rows);
  // Rows of the global step (micro-batch major: mb x dp x batch + dp_rank x batch + r) this rank's data
  // parallel replica trains: the duplicate-sample guard exchanges them.
  const std::vector<int64_t>& rows_trained() const { return rows_trained_; }
  // Testing hook (guard.inject_nan_step): the next step's loss is NaN on every rank.
  void inject_nan_once() { inject_nan_ = true; }

  // The plan: ranks per group and node, layers per stage, parameters and memory per rank. Collective;
  // the text on rank 0, empty elsewhere.
  std::string describe_plan();

  // Bytes per rank: parameters (+ gradients) and optimizer state (ZeRO-1: about 1/dp of unsharded).
  size_t parameter_bytes() const;
  size_t optimizer_bytes() const;

 private:
  struct Bucket {
    size_t lo, hi;    // flat range, a multiple of dp long
    int key;          // layer index; -1: embeddings (reduced after the schedule); layers: final LayerNorm
    size_t shard_at;  // where this rank's part sits in shard_
    RequestPtr request;
  };
  // Splits rows `rows` of a (seq_len + 1)-token batch into slot `slot`'s inputs and targets.
  void load_rows(int slot, const int32_t* tokens, std::span<const int64_t> rows);
  void launch(Bucket& bucket);
  void finish_gradients();
  double owned_sum_squares() const;

  TrainSpec spec_;
  ProcessGroups& groups_;
  std::vector<int> bounds_;
  int threads_;
  int slots_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<Bucket> buckets_;
  std::vector<FlatRange> owned_;                        // this rank's shard: part dp_rank of every bucket
  std::vector<FlatRange> norm_ranges_;                  // owned elements counted once in the global norm
  HugeBuffer<float> shard_;                             // reduce-scatter output, back to back
  std::vector<std::vector<int32_t>> inputs_, targets_;  // per slot
  HugeBuffer<float> recv_act_, recv_grad_;
  std::vector<int64_t> rows_trained_;
  bool inject_nan_ = false;
};

}  // namespace forge::trainer
