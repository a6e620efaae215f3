// run.objective = dpo: the reference model's log-probabilities of the replies of every training pair
// (docs/TRAINER.md, "Objectives"). They depend on the dataset version, the reference checkpoint and
// seq_len only, so they are computed once, by all the ranks of the first job that needs them, and kept
// beside the dataset (<dataset>/references/<key>.logps with <key>.json; under <run.dir>/references when the
// dataset's directory is read-only); every later run and resume reads them.
#pragma once

#include "forge/dataio/reader.h"
#include "forge/trainer/comm.h"
#include "forge/trainer/spec.h"

#include <string>
#include <vector>

namespace forge::launcher {

// Two values per training sample (pair) of the run's reader (any DP rank's: the pairs are read by id):
// its chosen and its rejected reply's summed log-probability under the checkpoint at `reference_dir`,
// found or computed. `world` holds every rank of the job. Usage error (64) when the reference's model is
// not the spec's; data error (65) when a stored file does not match its key (another dataset version,
// reference or seq_len) or is damaged.
std::vector<double> reference_logps(const trainer::TrainSpec& spec, const data::Reader& reader,
                                    const std::string& reference_dir, trainer::Comm& world);

}  // namespace forge::launcher
