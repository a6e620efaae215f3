// One training run, on every rank: data, the parallel trainer, metrics, summary, progress lines.
#pragma once

#include "forge/comm/bootstrap.h"
#include "forge/common/config.h"
#include "forge/trainer/spec.h"

namespace forge::launcher {

// Trains spec.steps steps on the ranks `boot` found (the layout's process groups are built from its world
// communicator). Writes <run.dir>/metrics/rank-K.jsonl per rank (a line per step), rank 0 the plan and
// <run.dir>/summary.json (also when a step fails: its exit class says how). Returns the exit code;
// failures are thrown as forge::Error after the summary is written. Refuses (64) to resume checkpoints
// of another spec unless `force_new`, which moves the old run's files aside first (spec_check.h).
// Guards ([guard]) act after every step; the watchdog runs from the first step to the last save.
int train(const Config& config, const trainer::TrainSpec& spec, bool force_new, comm::Bootstrap& boot);

}  // namespace forge::launcher
