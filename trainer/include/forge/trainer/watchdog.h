// The watchdog: a thread that watches an Activity record (progress.h) and, when no heartbeat arrives
// within the timeout, prints one line naming the rank and the operation that hung and calls an abort
// callback. The multi-rank launcher passes a callback that aborts the communicator (every rank exits 69);
// the default flushes stdio and the logger and _exit(69)s.
#pragma once

#include "forge/common/activity.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace forge::trainer {

struct Hang {
  int rank = 0;
  std::string what;  // the operation last marked
  int peer = -1;     // its peer rank, -1 when none
  double seconds = 0;
  std::string line;  // the message printed (without the program prefix)
};

// Flushes stdout, stderr and the default logger, then _exit(69).
[[noreturn]] void exit_on_hang(const Hang& hang);

// "rank R: no progress for Ns in <what>[ with rank P] — ..." (the watchdog's one line, without prefix).
std::string hang_message(int rank, double seconds, const char* what, int peer);

class Watchdog {
 public:
  using OnHang = std::function<void(const Hang&)>;

  // Starts watching when timeout_s > 0 (0: does nothing). The timeout counts from construction, so
  // start it once the loop is about to beat (after resume). `program` prefixes the printed line.
  Watchdog(double timeout_s, int rank, OnHang on_hang = exit_on_hang, Activity& activity = forge::activity(),
           std::string program = "forge-train");
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Stops the thread (idempotent); a hang after this is not reported.
  void stop();
  bool fired() const;

 private:
  void run();

  double timeout_s_;
  int rank_;
  OnHang on_hang_;
  Activity& activity_;
  std::string program_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace forge::trainer
