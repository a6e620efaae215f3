// Refusing to resume a run directory whose checkpoints another spec wrote. Checkpoints record the
// resolved spec (manifest extra.spec) and its hash; keys that legitimately change across resumes
// (run.steps, run.threads, run.peak_gflops, run.dir, parallel.tp/pp/dp/zero/stage_layers, ckpt.*,
// guard.*) may differ. --force-new starts afresh instead, moving the old run's files aside (never deleting
// them).
#pragma once

#include "forge/common/config.h"

#include <map>
#include <string>
#include <vector>

namespace forge::launcher {

// True for keys a resumed run may change without changing what it trains.
bool may_change_on_resume(const std::string& key);

// "key: old -> new" for every key that differs between a checkpoint's spec and the current one,
// except keys that may change on resume and keys the checkpoint lacks that the current spec leaves at
// their default (keys added to the schema after the checkpoint was written).
std::vector<std::string> spec_differences(const std::map<std::string, std::string>& saved, const Config& now);

// Before resuming: compares the newest committed checkpoint of `run_dir` with `config`; a different
// spec is a usage error (64) listing the keys. With force_new, moves checkpoints/, metrics/ and
// summary.json to <run_dir>/superseded/<UTC time>/ so the run starts fresh (74 when it cannot).
void check_resume_spec(const Config& config, const std::string& run_dir, bool force_new);

}  // namespace forge::launcher
