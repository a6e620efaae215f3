#include "forge/common/progress_line.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace forge {

namespace {

std::chrono::steady_clock::duration interval(bool tty) {
  if (tty) return std::chrono::milliseconds(100);
  const char* env = std::getenv("FORGE_PROGRESS_S");
  char* end = nullptr;
  const double s = env != nullptr ? std::strtod(env, &end) : 10.0;
  const double every = env != nullptr && end != env && *end == '\0' && s >= 0 ? s : 10.0;
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(every));
}

}  // namespace

ProgressLine::ProgressLine(std::string what, std::string unit, uint64_t total_items, uint64_t total_bytes)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_items_(total_items),
      total_bytes_(total_bytes),
      tty_(::isatty(STDERR_FILENO) == 1),
      every_(interval(tty_)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressLine::~ProgressLine() {
  finish();
}

double ProgressLine::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressLine::add(uint64_t items, uint64_t bytes) {
  items_ += items;
  bytes_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < every_) return;
  last_draw_ = now;
  draw(false);
}

void ProgressLine::finish() {
  if (done_) return;
  done_ = true;
  if (drawn_ || tty_) draw(true);
}

void ProgressLine::draw(bool final) {
  drawn_ = true;
  const double s = seconds();
  std::string line = fmt::format("{}: {}", what_, items_);
  if (total_items_ > 0) line += fmt::format("/{}", total_items_);
  line += " " + unit_;
  if (bytes_ > 0)
    line += fmt::format(", {:.1f} MB, {:.1f} MB/s", bytes_ / 1e6, s > 0 ? bytes_ / 1e6 / s : 0.0);
  // The ETA from whichever total is known, at the rate so far.
  double left = -1;
  if (total_items_ > items_ && items_ > 0)
    left = s * double(total_items_ - items_) / double(items_);
  else if (total_bytes_ > bytes_ && bytes_ > 0)
    left = s * double(total_bytes_ - bytes_) / double(bytes_);
  if (final)
    line += fmt::format(", done in {:.1f} s", s);
  else if (left >= 0)
    line += fmt::format(", ETA {:.0f} s", left);
  if (tty_)
    std::fprintf(stderr, "\r%-78s%s", line.c_str(), final ? "\n" : "");
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace forge
