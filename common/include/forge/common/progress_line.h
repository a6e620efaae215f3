// The progress line of a long operation (prepare's stages, evaluation, export): items, MB, rate, ETA. On a
// terminal it is redrawn in place (every 100 ms); in a log (stderr not a terminal: batch jobs) a line is
// written every FORGE_PROGRESS_S seconds (default 10), plus a closing line when any was written, so a
// short operation leaves a log untouched and a long one shows it is alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace forge {

class ProgressLine {
 public:
  // `what` names the operation, `unit` its items ("docs", "sequences", "tensors"); the totals, when known
  // (else 0), give "n/total" and the ETA.
  ProgressLine(std::string what, std::string unit, uint64_t total_items = 0, uint64_t total_bytes = 0);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void add(uint64_t items, uint64_t bytes = 0);
  // The closing line (also written by the destructor).
  void finish();
  double seconds() const;

 private:
  void draw(bool final);

  std::string what_, unit_;
  uint64_t total_items_, total_bytes_, items_ = 0, bytes_ = 0;
  bool tty_, done_ = false, drawn_ = false;
  std::chrono::steady_clock::duration every_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace forge
