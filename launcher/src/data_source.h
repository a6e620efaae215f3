// Where a run's token rows come from: the deterministic synthetic stream, or a prepared dataset
// directory through the data layer's reader.
#pragma once

#include "forge/trainer/spec.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace forge::launcher {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills `out` (rows x (seq_len + 1)) with the rows of optimizer step `step` (0-based), in order.
  virtual void next(int64_t step, std::span<int32_t> out) = 0;
  virtual std::string describe() const = 0;
  // The dataset version checkpoints record ("" for the synthetic stream).
  virtual std::string version() const = 0;
};

// Checks the dataset against the spec (vocabulary: a usage error naming model.vocab; unreadable or corrupt
// data: a data error) and opens it. Rows per step: the global batch, microbatches x dp x batch.
std::unique_ptr<DataSource> open_data(const Config& config, const trainer::TrainSpec& spec);

}  // namespace forge::launcher
