#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace forge::data {

Progress::Progress(std::string stage, uint64_t total_bytes)
    : stage_(std::move(stage)),
      total_bytes_(total_bytes),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  finish();
}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(uint64_t docs, uint64_t bytes) {
  docs_ += docs;
  bytes_ += bytes;
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  if (done_) return;
  done_ = true;
  if (tty_) draw(true);
}

void Progress::draw(bool final) {
  const double s = seconds();
  const double mb = bytes_ / 1e6;
  const double rate = s > 0 ? mb / s : 0;
  std::string eta = "";
  if (!final && total_bytes_ > bytes_ && rate > 0)
    eta = fmt::format(", ETA {:.0f}s", (total_bytes_ - bytes_) / 1e6 / rate);
  const std::string line =
      fmt::format("\r{:<12} {:>9} docs {:>9.1f} MB {:>7.1f} MB/s{}", stage_, docs_, mb, rate, eta);
  std::fprintf(stderr, "%-78s%s", line.c_str(), final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace forge::data
