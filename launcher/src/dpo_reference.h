// run.objective = dpo: the reference model's log-probabilities of the replies of every training pair
// (docs/TRAINER.md, "Objectives"). They depend on the dataset version, the reference checkpoint and
// seq_len only, so they are computed once, by all the ranks of the first job that needs them, and kept
// beside the dataset (<dataset>/references/<key>.logps with <key>.json; under <run.dir>/references when the
// dataset's directory is read-only); every later run and resume reads them.
#pragma once

#include "forge/trainer/comm.h"
#include "forge/trainer/spec.h"

#include <string>
#include <vector>

namespace forge::launcher {

// Two values per training sample (pair) of `spec`'s dataset: its chosen and its rejected reply's summed
// log-probability under the checkpoint at `reference_dir`, found or computed. `world` holds every rank of
// the job. Usage error (64) when the reference's model is not the spec's; data error (65) when a stored
// file does not match its key (another dataset version, reference or seq_len) or is damaged.
std::vector<double> reference_logps(const trainer::TrainSpec& spec, const std::string& reference_dir,
                                    trainer::Comm& world);

// The file reference_logps keeps them in, for this spec and reference ("" when neither place is writable
// and nothing is stored yet).
std::string reference_logps_path(const trainer::TrainSpec& spec, const std::string& reference_dir);

}  // namespace forge::launcher
