// The timeline of chosen steps (run.trace_steps, forge-train --trace): where one rank's time went, as a
// Chrome/Perfetto trace (docs/ARCHITECTURE.md, "Traces"). Spans on the training thread (track 0): each
// step, its data fetch, forward and backward of every layer per micro-batch, the optimizer, the checkpoint
// snapshot, and every blocking wait on a communicator. Collectives and pipeline send/recv are asynchronous
// events from issue to completion, with their group and bytes, on tracks of their own.
//
// Recording is process-wide and done by the thread that drives training only (the kernels' OpenMP
// workers never record). Off, a span costs one load of a flag and a branch.
#pragma once

#include <cstdint>
#include <string>

namespace forge {

class Trace {
 public:
  static bool on() { return on_; }
  // Starts recording (drops anything recorded before).
  static void start();
  // Stops recording and writes what was recorded as <dir>/rank-NNNNN.json, atomically; `label` names the
  // process in the viewer. Throws forge::Error(kIo) naming the file.
  static void stop_and_write(const std::string& dir, int rank, const std::string& label);
  // Spans: strictly nested, `name` a string that outlives the process (a literal or interned); `index`
  // (a layer, a micro-batch, a step) is appended to the name when >= 0.
  static void begin(const char* name, const char* cat, int index = -1);
  static void end();
  // An operation in flight: returns its id (0 when not recording), ended once with that id.
  static uint64_t async_begin(const char* name, uint64_t bytes, int peer);
  static void async_end(uint64_t id, const char* name);
  // Events recorded since start() (the benchmark's count of what tracing costs).
  static size_t events();

 private:
  inline static bool on_ = false;
};

class TraceSpan {
 public:
  TraceSpan(const char* name, const char* cat, int index = -1) : on_(Trace::on()) {
    if (on_) Trace::begin(name, cat, index);
  }
  ~TraceSpan() {
    if (on_) Trace::end();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  bool on_;
};

// Puts every rank-*.json under `dir` on one timeline (pid = rank, times from the earliest event) in
// <dir>/merged.json, atomically; returns the number of ranks merged. forge::Error(kData) names a file
// that is not a trace, kIo one that cannot be read or written.
int merge_traces(const std::string& dir);

}  // namespace forge
