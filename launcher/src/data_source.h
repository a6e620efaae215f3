// Where a rank's micro-batches come from: the deterministic synthetic stream, or a prepared dataset
// directory through the data layer's reader. Each rank reads only its data-parallel slice.
#pragma once

#include "forge/comm/comm.h"
#include "forge/common/batch.h"
#include "forge/common/json.h"
#include "forge/dataio/cache.h"
#include "forge/trainer/spec.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace forge::trainer {
class ParallelTrainer;
}

namespace forge::launcher {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills `out` with this rank's micro-batches of optimizer step `step` (0-based): spec.microbatches of
  // them, each spec.batch rows of data-parallel rank dp_rank's slice. Micro-batch i of the step is global
  // rows [i x dp x batch, (i + 1) x dp x batch) of the step, of which DP rank r trains the r-th part.
  virtual void next(int64_t step, std::vector<MicroBatch>& out) = 0;
  virtual std::string describe() const = 0;
  // The dataset version checkpoints record ("" for the synthetic stream).
  virtual std::string version() const = 0;
  // The SHA-256 of the dataset's tokenizer ("" for the synthetic stream).
  virtual std::string tokenizer() const = 0;
  // Bytes of token data this rank has read from the dataset so far (0 for the synthetic stream).
  virtual uint64_t bytes_read() const = 0;
  // The dataset's domains, which MicroBatch::domains index (empty for the synthetic stream).
  virtual std::vector<std::string> domains() const { return {}; }
  // What the node-local cache did when the data was opened (all zero without one).
  virtual data::CacheStats cache_stats() const { return {}; }
  // The reader's cursor after `steps` optimizer steps, for checkpoints (null for the synthetic stream).
  virtual Json cursor(int64_t /*steps*/) const { return nullptr; }
  // Rollouts (rollouts.h) sample from the model being trained: it is handed over once it is built.
  virtual void set_policy(trainer::ParallelTrainer&) {}
  // What producing the last step's batches did, over the data-parallel group (the rollouts' rewards,
  // lengths, generation speed), for the step's metrics record; null when there is nothing to say.
  virtual Json step_metrics() const { return nullptr; }
};

// Checks the dataset against the spec (vocabulary: a usage error naming model.vocab; the objective's format;
// unreadable or corrupt data: a data error) and opens it for data-parallel rank `dp_rank` of
// spec.layout.dp. run.objective = dpo: the reference log-probabilities are found or computed here, by all
// the ranks of `world` together on `backend` (the run's), or come from a frozen copy of the reference as
// batches are read (dpo.reference_mode = live; dpo_reference.h). run.objective = distill reads a text dataset
// (every token) or a chat one (the replies).
std::unique_ptr<DataSource> open_data(const Config& config, const trainer::TrainSpec& spec, int dp_rank,
                                      comm::Comm& world, trainer::Backend& backend);

}  // namespace forge::launcher
