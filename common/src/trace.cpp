#include "forge/common/trace.h"

#include "forge/common/error.h"
#include "forge/common/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

namespace forge {

namespace {

namespace fs = std::filesystem;

struct Event {
  int64_t ns;  // steady clock
  const char* name;
  const char* cat;
  uint64_t id, bytes;
  int index, peer;
  char ph;  // B/E span, b/e operation in flight
};

struct Recording {
  std::vector<Event> events;
  uint64_t next_id = 1;
  int64_t steady0_ns = 0;
  int64_t wall0_ns = 0;  // the wall clock at steady0: ranks on different nodes share it (NTP)
};

Recording& recording() {
  static Recording r;
  return r;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string json_string(std::string_view s) {
  return Json(s).dump();
}

}  // namespace

void Trace::start() {
  Recording& r = recording();
  r.events.clear();
  r.events.reserve(1 << 14);
  r.steady0_ns = now_ns();
  r.wall0_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  on_ = true;
}

void Trace::begin(const char* name, const char* cat, int index) {
  recording().events.push_back({now_ns(), name, cat, 0, 0, index, -1, 'B'});
}

void Trace::end() {
  // A span open when recording stopped is closed by the writer.
  if (on_) recording().events.push_back({now_ns(), nullptr, nullptr, 0, 0, -1, -1, 'E'});
}

uint64_t Trace::async_begin(const char* name, uint64_t bytes, int peer) {
  if (!on_) return 0;
  Recording& r = recording();
  const uint64_t id = r.next_id++;
  r.events.push_back({now_ns(), name, "comm", id, bytes, -1, peer, 'b'});
  return id;
}

void Trace::async_end(uint64_t id, const char* name) {
  // An operation issued while recording may complete after stop: its end is then not recorded, and the
  // writer closes it at the last event.
  if (on_) recording().events.push_back({now_ns(), name, "comm", id, 0, -1, -1, 'e'});
}

size_t Trace::events() {
  return recording().events.size();
}

void Trace::stop_and_write(const std::string& dir, int rank, const std::string& label) {
  on_ = false;
  Recording& r = recording();
  // Microseconds with three decimals, printed from integer nanoseconds: a double of today's epoch time
  // in microseconds has a resolution of 0.25 us, and two ways of rounding it (one contracted into an
  // FMA, one not) once put an event before the one it followed.
  const auto ts = [&](int64_t ns) {
    const int64_t t = r.wall0_ns + (ns - r.steady0_ns);
    return fmt::format("{}.{:03d}", t / 1000, t % 1000);
  };
  std::string out = fmt::format(
      "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
      "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":{1}}}}},\n"
      "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}}"
      ",\n"
      "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"training "
      "thread\"}}}}",
      rank, json_string(label));
  std::vector<const Event*> open_async;
  int depth = 0;
  int64_t last = r.steady0_ns;
  for (const Event& e : r.events) {
    last = std::max(last, e.ns);
    const std::string where = fmt::format("\"pid\":{},\"tid\":0,\"ts\":{}", rank, ts(e.ns));
    if (e.ph == 'E') {
      --depth;
      out += fmt::format(",\n{{\"ph\":\"E\",{}}}", where);
      continue;
    }
    const std::string name = e.index >= 0 ? fmt::format("{} {}", e.name, e.index) : std::string(e.name);
    if (e.ph == 'B') {
      ++depth;
      out +=
          fmt::format(",\n{{\"ph\":\"B\",\"name\":{},\"cat\":\"{}\",{}}}", json_string(name), e.cat, where);
    } else {
      std::string args;
      if (e.ph == 'b') {
        args = fmt::format(",\"args\":{{\"bytes\":{}{}}}", e.bytes,
                           e.peer >= 0 ? fmt::format(",\"peer\":{}", e.peer) : std::string());
        open_async.push_back(&e);
      } else {
        std::erase_if(open_async, [&](const Event* o) { return o->id == e.id; });
      }
      out += fmt::format(",\n{{\"ph\":\"{}\",\"name\":{},\"cat\":\"comm\",\"id2\":{{\"local\":{}}},{}{}}}",
                         e.ph, json_string(name), e.id, where, args);
    }
  }
  // Balanced whatever happened: spans still open (an exception unwound past them) and operations that
  // completed after recording stopped end at the last event.
  const std::string at = fmt::format("\"pid\":{},\"tid\":0,\"ts\":{}", rank, ts(last));
  for (const Event* o : open_async)
    out += fmt::format(",\n{{\"ph\":\"e\",\"name\":{},\"cat\":\"comm\",\"id2\":{{\"local\":{}}},{}}}",
                       json_string(o->name), o->id, at);
  for (; depth > 0; --depth) out += fmt::format(",\n{{\"ph\":\"E\",{}}}", at);
  out += "\n]}\n";
  r.events.clear();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ExitCode::kIo, "cannot create trace directory {}: {}", dir, ec.message());
  write_file_atomic((fs::path(dir) / fmt::format("rank-{:05d}.json", rank)).string(), out);
}

int merge_traces(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && entry.path().extension() == ".json") files.push_back(entry.path());
  }
  if (ec) fail(ExitCode::kIo, "cannot list trace directory {}: {}", dir, ec.message());
  if (files.empty())
    fail(ExitCode::kData, "no rank-*.json traces in {} (run forge-train with --trace or run.trace_steps)",
         dir);
  std::sort(files.begin(), files.end());
  Json events = Json::array();
  double t0 = std::numeric_limits<double>::infinity();
  for (const fs::path& f : files) {
    Json doc = read_json(f.string());
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      fail(ExitCode::kData, "{} is not a trace (no traceEvents array); remove it or write it again",
           f.string());
    for (Json& e : doc["traceEvents"]) {
      if (e.contains("ts")) t0 = std::min(t0, e["ts"].get<double>());
      events.push_back(std::move(e));
    }
  }
  for (Json& e : events)
    if (e.contains("ts")) e["ts"] = std::round((e["ts"].get<double>() - t0) * 1e3) / 1e3;
  Json merged{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  write_file_atomic((fs::path(dir) / "merged.json").string(), merged.dump() + "\n");
  return int(files.size());
}

}  // namespace forge
