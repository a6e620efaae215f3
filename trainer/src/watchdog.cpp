#include "forge/trainer/watchdog.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>

namespace forge::trainer {

void exit_on_hang(const Hang&) {
  std::fflush(nullptr);
  if (auto logger = spdlog::default_logger()) logger->flush();
  ::_exit(69);
}

std::string hang_message(int rank, double seconds, const char* what, int peer) {
  const std::string with = peer >= 0 ? fmt::format(" with rank {}", peer) : "";
  return fmt::format(
      "rank {}: no progress for {:.0f}s in {}{} — aborting (exit 69): look for a dead, stuck or "
      "unreachable peer or disk in that rank's log and node, or raise guard.watchdog_s",
      rank, seconds, what != nullptr ? what : "(unknown)", with);
}

Watchdog::Watchdog(double timeout_s, int rank, OnHang on_hang, Activity& activity, std::string program)
    : timeout_s_(timeout_s),
      rank_(rank),
      on_hang_(std::move(on_hang)),
      activity_(activity),
      program_(std::move(program)) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Watchdog::fired() const {
  std::lock_guard lock(mutex_);
  return fired_;
}

void Watchdog::run() {
  using clock = std::chrono::steady_clock;
  // Polling at a tenth of the timeout (at most 1 s) bounds the detection delay to 1.1 x timeout.
  const auto poll = std::chrono::duration<double>(std::clamp(timeout_s_ / 10, 0.001, 1.0));
  uint64_t seen = activity_.beats.load(std::memory_order_relaxed);
  auto last_change = clock::now();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll);
    if (stopping_) return;
    const uint64_t beats = activity_.beats.load(std::memory_order_relaxed);
    const auto now = clock::now();
    if (beats != seen) {
      seen = beats;
      last_change = now;
      continue;
    }
    const double idle = std::chrono::duration<double>(now - last_change).count();
    if (idle < timeout_s_) continue;
    fired_ = true;
    Hang hang;
    hang.rank = rank_;
    const char* what = activity_.what.load(std::memory_order_relaxed);
    hang.what = what != nullptr ? what : "(unknown)";
    hang.peer = activity_.peer.load(std::memory_order_relaxed);
    hang.seconds = idle;
    hang.line = hang_message(rank_, idle, what, hang.peer);
    lock.unlock();
    std::fprintf(stderr, "%s: error: %s\n", program_.c_str(), hang.line.c_str());
    std::fflush(stderr);
    on_hang_(hang);
    return;
  }
}

}  // namespace forge::trainer
