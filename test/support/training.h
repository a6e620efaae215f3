// Test helpers for the trainer: micro-batches from plain token arrays, and the one-process trainer
// (ParallelTrainer at layout 1,1,1 over a self communicator).
#pragma once

#include "forge/common/batch.h"
#include "forge/trainer/parallel.h"

#include <memory>
#include <random>
#include <span>
#include <vector>

namespace forge::test {

// `rows` x `seq_len` inputs and targets (targets may be MicroBatch::kIgnore), pretraining defaults.
inline MicroBatch micro_batch(std::span<const int32_t> inputs, std::span<const int32_t> targets, int rows,
                              int seq_len) {
  MicroBatch b;
  b.resize(rows, seq_len);
  std::copy(inputs.begin(), inputs.end(), b.inputs.begin());
  std::copy(targets.begin(), targets.end(), b.targets.begin());
  for (int r = 0; r < rows; ++r) b.sample_ids[size_t(r)] = uint64_t(r);
  return b;
}

// Rows of seq_len + 1 tokens (window r starts at windows[r * (seq_len + 1)]) as one micro-batch.
inline MicroBatch window_batch(std::span<const int32_t> windows, int rows, int seq_len,
                               uint64_t first_id = 0) {
  MicroBatch b;
  b.resize(rows, seq_len);
  for (int r = 0; r < rows; ++r)
    b.set_window(r, windows.data() + size_t(r) * size_t(seq_len + 1), first_id + uint64_t(r), 0);
  return b;
}

// Weights far from the near-uniform initialization (normal with standard deviation `std`): attention is
// sharp and every logit depends on what came before, so comparisons of logits mean something.
inline void randomize_weights(trainer::GPT& m, uint32_t seed, float std) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  for (float& w : m.weights()) w = normal(rng);
  m.weights_changed();
}

// The trainer on one process, with its groups.
class OneProcess {
 public:
  explicit OneProcess(const trainer::TrainSpec& spec, std::shared_ptr<trainer::GPT> teacher = nullptr)
      : groups_(comm::make_groups(comm::self_comm(), spec.layout)),
        trainer_(std::make_unique<trainer::ParallelTrainer>(spec, groups_, trainer::cpu_backend(),
                                                            std::move(teacher))) {}
  trainer::ParallelTrainer& operator*() { return *trainer_; }
  trainer::ParallelTrainer* operator->() { return trainer_.get(); }

 private:
  comm::ProcessGroups groups_;
  std::unique_ptr<trainer::ParallelTrainer> trainer_;
};

}  // namespace forge::test
