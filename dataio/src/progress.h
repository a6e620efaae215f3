// The live progress line of `prepare` (documents, MB, rate, ETA), drawn only when stderr is a terminal so
// logs and test output stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace forge::data {

class Progress {
 public:
  // total_bytes: the stage's expected input, for the ETA (0: unknown).
  Progress(std::string stage, uint64_t total_bytes);
  ~Progress();
  void add(uint64_t docs, uint64_t bytes);
  void finish();
  double seconds() const;

 private:
  void draw(bool final);

  std::string stage_;
  uint64_t total_bytes_, docs_ = 0, bytes_ = 0;
  bool tty_, done_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace forge::data
