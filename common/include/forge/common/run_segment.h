// One forge-train process of a run (a requeue or resume starts the next), as summary.json "segments"
// holds it (written by launcher/src/train_run.cpp): what its time went to and what a failure of it lost.
// The run report and the cost report read it, with one definition of waste (docs/ADMISSION.md, "Waste
// and ETTR").
#pragma once

#include "forge/common/json.h"

#include <string>

namespace forge {

struct RunSegment {
  std::string job_id;         // empty: a process outside Slurm
  double start = 0, end = 0;  // Unix seconds of the process
  bool resumed = false;       // started from a checkpoint: its start-up is restart cost
  double startup_s = 0;       // process start to the first step
  double kept_train_s = 0;    // step time of the steps a committed checkpoint (or the finished run) holds
  double lost_s = 0;          // time after the newest committed checkpoint, when the process did not finish
  std::string exit_class;
  bool operator==(const RunSegment&) const = default;

  // The time this process wasted: what it lost after its newest committed checkpoint, plus its start-up
  // when it resumed (the restart).
  double wasted_s() const { return lost_s + (resumed ? startup_s : 0.0); }

  // From a "segments" entry; nlohmann::json's exceptions name a missing or mistyped field.
  static RunSegment from_json(const Json& g) {
    const Json& id = g.at("job_id");
    return {id.is_null()     ? std::string()
            : id.is_string() ? id.get<std::string>()
                             : std::to_string(id.get<int64_t>()),
            g.at("start").get<double>(),
            g.at("end").get<double>(),
            g.at("resumed_from").get<int64_t>() > 0,
            g.at("startup_s").get<double>(),
            g.at("kept_train_s").get<double>(),
            g.at("lost_s").get<double>(),
            g.at("exit_class").get<std::string>()};
  }
};

}  // namespace forge
