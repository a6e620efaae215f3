// The run's metrics in TensorBoard (<run>/tb/): rank 0 writes every scalar of the metrics record and the
// guard and checkpoint events as text; each rank writes its own timings under rank/ in tb/rank-<r>/, so
// TensorBoard overlays the ranks (stragglers) without every rank writing everything. Best effort: a
// directory that cannot be written costs one warning, never the run.
#pragma once

#include "forge/common/json.h"
#include "forge/trainer/event_file.h"

#include <cstdint>
#include <optional>
#include <string>

namespace forge::launcher {

class TensorBoardLog {
 public:
  // `resumed_step` > 0: the run continues after that step; TensorBoard drops the older events after it.
  TensorBoardLog(const std::string& run_dir, int rank, int64_t resumed_step);
  void write(const Json& record);  // one metrics record (trainer/metrics.h)
  void restart(int64_t step);      // a guard rewind to the checkpoint of `step`

 private:
  template <typename F>
  void guarded(std::optional<trainer::EventFileWriter>& file, F&& body);

  std::optional<trainer::EventFileWriter> run_, rank_;
};

}  // namespace forge::launcher
