// What one training step reports (ParallelTrainer::step): the guards, metrics and the launcher read it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace forge::trainer {

// What the router of one MoE block (moe.h) did, summed over forward passes (a step's: over every
// micro-batch and data-parallel rank).
struct RouterStats {
  int layer = 0;
  std::vector<double> tokens;  // [experts]: assignments each expert computed (after capacity)
  double assignments = 0;      // tokens x top_k, before capacity
  double dropped = 0;          // assignments capacity dropped
  double entropy = 0;          // sum over tokens of the router distribution's entropy (nats)
  double aux = 0, z = 0;       // sums of the micro-batches' losses (coefficients applied)
  double token_count = 0, micro_batches = 0;
};

struct StepStats {
  int64_t step = 0;      // 1-based index of the step just taken
  double loss = 0;       // the step's loss: weighted sum over every micro-batch and rank / scored weight
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double seconds = 0;
  int64_t tokens = 0;  // positions trained in this step, over all data-parallel ranks
  // The loss's normaliser: the scored targets' summed weight over every micro-batch and data-parallel rank
  // (pretraining: the positions less the ones opening a document; fine-tuning: the masked replies).
  double scored = 0;
  // The objective's own figures, per unit of `scored` (DPO: per pair), e.g. reward_margin, accuracy.
  std::vector<std::pair<std::string, double>> objective = {};
  // False when the loss or the gradient norm is NaN/Inf: the update was dropped (weights and optimizer
  // moments unchanged) but the step still counts (its data is consumed and the schedule advances). The
  // guard (guard.h) decides what happens next. The same on every rank.
  bool finite = true;
  // Where the step's time went: communication (time in tensor/data-parallel communicator calls, issuing
  // and blocked), pipeline bubble (time in calls to the neighbouring stages), and the bytes this rank sent.
  double comm_s = 0;
  double bubble_s = 0;
  double bubble_analytic = 0;  // the schedule's bubble fraction (schedule.h simulate; 0 without pipeline)
  uint64_t comm_bytes = 0;
  // Mixture of Experts: every MoE block's router, in block order; the time in and the bytes this rank sent
  // through the token all-to-all (part of comm_s; exposed: the exchange waits for it).
  std::vector<RouterStats> moe = {};
  double expert_comm_s = 0;
  uint64_t expert_comm_bytes = 0;
  // Context parallelism: the time in and the bytes this rank sent through the ring (part of comm_s; the
  // time is the exposed part: what the attention blocks did not hide).
  double cp_comm_s = 0;
  uint64_t cp_comm_bytes = 0;
  // The most memory the training state (weights, gradients, the gradient shard, AdamW's moments) held
  // during the step: resident bytes as the backend counts them (Backend::resident_bytes), sampled at
  // the step's start and end and, under ZeRO-2/3, at every layer of its passes.
  uint64_t state_bytes = 0;
  // ZeRO-3: the time in and the bytes this rank sent through the weights' all-gathers (part of comm_s;
  // the time is the exposed part: what prefetching did not hide).
  double gather_s = 0;
  uint64_t gather_bytes = 0;
};

}  // namespace forge::trainer
