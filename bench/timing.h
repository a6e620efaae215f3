// Shared by the benchmarks: clocks, and the best wall time of a call.
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>

namespace forge::bench {

// Seconds on the monotonic clock.
inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process: a background thread's work (a reader's prefetch) counts too.
inline double process_cpu_now() {
  timespec t;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

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
