// run.objective = dpo: the reference model's log-probabilities of the replies of every training pair
// (docs/TRAINER.md, "Objectives"). They depend on the dataset version, the reference checkpoint and
// seq_len only, so they are computed once, by all the ranks of the first job that needs them, and kept
// beside the dataset (<dataset>/references/<key>.logps with <key>.json; under <run.dir>/references when the
// dataset's directory is read-only); every later run and resume reads them.
#pragma once

#include "forge/comm/comm.h"
#include "forge/dataio/reader.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/model.h"
#include "forge/trainer/spec.h"

#include <memory>
#include <string>
#include <vector>

namespace forge::launcher {

// Two values per training sample (pair) of the run's reader (any DP rank's: the pairs are read by id):
// its chosen and its rejected reply's summed log-probability under the checkpoint at `reference_dir`,
// found or computed (on `backend`, the run's, in FP32). `world` holds every rank of the job. Usage error (64)
// when the reference's model is not the spec's; data error (65) when a stored file does not match its key
// (another dataset version, reference or seq_len) or is damaged.
std::vector<double> reference_logps(const trainer::TrainSpec& spec, const data::Reader& reader,
                                    const std::string& reference_dir, comm::Comm& world,
                                    trainer::Backend& backend);

// A frozen copy of the checkpoint at `dir`, which must hold the spec's model, verified and loaded into a
// whole model of data.batch rows whose loss is `loss` (what the reference computes: ReplyLogps for DPO,
// TokenLogps for GRPO's KL), in FP32 on `backend`.
std::unique_ptr<trainer::GPT> frozen_reference(const trainer::TrainSpec& spec, const std::string& dir,
                                               std::shared_ptr<const trainer::Loss> loss,
                                               trainer::Backend& backend);

// dpo.reference_mode = live: a frozen copy of the reference on this rank computes the log-probabilities of
// each micro-batch's pairs as it is read (every rank: each keeps the batches whole, and a checkpoint's
// verification batch carries them). Costs a reference forward per micro-batch instead of a file read;
// needs no writable place and no pass before the first step. The same checks as reference_logps.
class LiveReference {
 public:
  LiveReference(const trainer::TrainSpec& spec, const std::string& reference_dir, trainer::Backend& backend);
  void fill(MicroBatch& batch);  // batch.reference_logps, two per row

 private:
  std::shared_ptr<trainer::ReplyLogps> logps_;
  std::unique_ptr<trainer::GPT> model_;
};

}  // namespace forge::launcher
