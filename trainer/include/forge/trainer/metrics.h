// The metrics schema: one JSON object per optimizer step, one line each in <run>/metrics/rank-<r>.jsonl.
//   step         1-based optimizer step
//   loss         mean training loss of the step
//   grad_norm    global gradient L2 norm before clipping
//   lr           learning rate applied
//   tokens       tokens trained so far (all steps up to this one)
//   step_ms      wall time of the step
//   tokens_per_s tokens of this step / its wall time
//   mfu          model FLOPs utilisation against peak_gflops (6N + 12LTd FLOPs per token)
// forge-train adds to every record:
//   spec_hash     Config::hash of the resolved spec
//   data_wait_ms  time spent fetching the step's tokens
//   ckpt_stall_ms time the step waited for a checkpoint save to start
//   compute_ms, comm_ms, bubble_ms  the step's time split; comm_bytes what it sent
//   peak_rss_mib  the process's peak resident memory so far
//   device_mem_mib  (GPU runs) the most device memory in use after a step so far
// and, only when they apply:
//   skipped       true: the step was non-finite and its update dropped (guard.nonfinite = skip)
//   resumed_from  the checkpoint step this process resumed from (first record after a resume)
//   restored      true: the process that trained this step ended after its checkpoint committed and before
//                 it wrote the record; the resumed run restored the step's outcome (step_outcome) from the
//                 checkpoint, without the rest
//   ckpt_events   finished checkpoint saves (ckpt::SaveEvent::to_json)
//   guard_events  guard.h StepGuard events: {"kind": "nonfinite" | "loss_spike" | "rewind", ...}
//   stragglers    ranks flagged by the straggler detector (multi-rank runs)
#pragma once

#include "forge/common/json.h"
#include "forge/trainer/step_stats.h"

#include <cstdint>
#include <fstream>
#include <string>

namespace forge::trainer {

Json metrics_record(const StepStats& stats, int64_t tokens_so_far, double flops_per_token,
                    double peak_gflops);
// The part of a step's record that is the same on every rank (step, loss, grad_norm, lr, tokens,
// scored_tokens, the objective's figures): what a checkpoint keeps of its step (RunCheckpoints).
Json step_outcome(const StepStats& stats, int64_t tokens_so_far);

// Appends records to a JSONL file, one flushed line per step, so a reader never sees half a line of a
// step that finished. Throws forge::Error(kIo) naming the file when it cannot be written.
class MetricsWriter {
 public:
  // A run resumed after step `resumed_step` keeps the records of steps up to it and appends after
  // them, so the file tells one continuous story; a fresh run (0) starts an empty file. When the file has
  // no record of `resumed_step` itself and `resumed_outcome` (the checkpoint's step_outcome) is given, it
  // is written in its place, marked restored.
  explicit MetricsWriter(const std::string& path, int64_t resumed_step = 0, const Json& resumed_outcome = {});
  void write(const Json& record);
  const std::string& path() const { return path_; }
  // The record written in place of the resumed step's missing one; null when none was.
  const Json& restored() const { return restored_; }

 private:
  std::string path_;
  Json restored_;
  std::ofstream out_;
};

}  // namespace forge::trainer
