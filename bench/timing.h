// Shared by the benchmarks: the best wall time of a call.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace forge::bench {

// The best of `reps` timed calls of f after one warm-up call: the least disturbed by other processes.
inline double best_seconds(const std::function<void()>& f, int reps = 3) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace forge::bench
