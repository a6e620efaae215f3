// One training run in this process: data, trainer, metrics, summary, progress lines.
#pragma once

#include "forge/common/config.h"
#include "forge/trainer/spec.h"

namespace forge::launcher {

// Trains spec.steps steps. Writes <run.dir>/metrics/rank-0.jsonl (a line per step) and
// <run.dir>/summary.json (also when a step fails: its exit class says how). Returns the exit code;
// failures are thrown as forge::Error after the summary is written.
int train(const Config& config, const trainer::TrainSpec& spec);

}  // namespace forge::launcher
