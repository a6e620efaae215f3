// The loss seam (docs/ARCHITECTURE.md, "The loss"): an objective computed from the classifier's logits
// chunk by chunk of positions, and normalised by the GLOBAL number of scored tokens — the sum of the loss
// weights over every micro-batch of the step and every data-parallel rank — not by a mean of per-batch
// means. Weighted language-model cross-entropy is the first objective; preference and distillation
// objectives implement the same interface.
#pragma once

#include "forge/trainer/backend.h"

#include <cstdint>
#include <memory>
#include <string>

namespace forge {
struct MicroBatch;
}

namespace forge::trainer {

// What a loss adds up: the weighted sum of per-token losses and the weight that normalises it. A step's
// loss is the sum of `loss` over its micro-batches and data-parallel ranks divided by the sum of `weight`.
struct LossSums {
  double loss = 0, weight = 0;
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss;
    weight += o.weight;
    return *this;
  }
};

// A micro-batch (forge/common/batch.h) in a backend's memory: what the layers and the loss read. An
// optional field is null when the batch leaves it at its default; doc_start (derived from the segments)
// is the first position of each position's document, what attention needs.
struct DeviceBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  const float* weights = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* doc_start = nullptr;
};

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  // The summed loss of positions [row0, row0 + rows) of the batch from their logits [rows, V] (this rank's
  // vocabulary shard, columns from vocab_begin, combined across the shards through `group` when not null).
  // When `backward`, the logits are replaced by the gradient of scale x that sum.
  virtual double chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows, int V,
                       int vocab_begin, float scale, bool backward, VocabGroup* group) const = 0;
};

// Cross-entropy of every target, weighted by the batch's loss weights (pretraining: all 1).
class LmCrossEntropy final : public Loss {
 public:
  std::string name() const override { return "lm"; }
  double chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows, int V,
               int vocab_begin, float scale, bool backward, VocabGroup* group) const override;
};

}  // namespace forge::trainer
