// Asynchronous, atomic checkpoint saves. save_async() blocks the training loop only while the ranks agree
// on the save and copy their pieces into host memory (the stall, measured and returned); a background
// thread per rank writes and fsyncs the rank's part file, and rank 0's thread commits: it waits for
// every part, writes index.json and manifest.json, then COMMITTED, and renames the staging directory to
// its final name. A crash at any point leaves no directory that readers take for a checkpoint.
//
// At most one save is in flight; the next one waits for it or is skipped (AsyncPolicy). A failed save
// (disk full, permissions) is reported at the next save_async()/wait() as a kFailed event and the run goes
// on from the previous checkpoint; after `max_consecutive_failures` failures in a row both calls throw
// forge::Error(kIo), which the launcher turns into exit 74.
#pragma once

#include "forge/ckpt/coordinator.h"
#include "forge/ckpt/manifest.h"
#include "forge/ckpt/policy.h"
#include "forge/ckpt/slice.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace forge::ckpt {

enum class AsyncPolicy { kWait, kSkip };
AsyncPolicy parse_async_policy(std::string_view name);  // "wait" or "skip"; throws forge::Error(kUsage)

struct SaverOptions {
  std::string run_dir;
  AsyncPolicy policy = AsyncPolicy::kWait;
  int recovery_keep = 3;             // retention after each committed save
  int max_consecutive_failures = 3;  // then save_async()/wait() throw forge::Error(kIo)
  double commit_timeout_s = 600;     // rank 0 waits this long for the other ranks' parts
  // Pieces in device memory (a GPU backend): how the snapshot reads a piece's bytes (memcpy when unset),
  // and where the snapshot lives (page-locked host memory, so the device copies at full speed; new[] when
  // unset).
  std::function<void(void* host_dst, const void* src, size_t bytes)> read_piece = {};
  std::function<std::shared_ptr<char>(size_t bytes)> allocate_snapshot = {};
};

// A piece the caller holds: `data` points at slice.bytes() row-major bytes (host memory, or what
// SaverOptions::read_piece reads), read only during save_async.
// Replicated pieces (the same slice on several ranks) are written once.
struct TensorData {
  Slice slice;
  const void* data = nullptr;
};

enum class Outcome { kPending, kCommitted, kFailed, kSkipped };
std::string_view outcome_name(Outcome outcome);

// One save, for the metrics. stall_s and copy_s are this rank's; the rest is rank 0's view.
struct SaveEvent {
  int64_t step = -1;
  Tier tier = Tier::kRecovery;
  Outcome outcome = Outcome::kPending;
  double stall_s = 0;  // time the caller spent in save_async
  double copy_s = 0;   // of which the snapshot copy
  double write_s = 0;  // background write, fsync and commit
  uint64_t bytes = 0;  // data bytes of all ranks
  std::string path;
  std::string error;
  Json to_json() const;
};

class Saver {
 public:
  Saver(Coordinator& coord, SaverOptions options);
  ~Saver();  // waits for the background write; no collective call
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Collective. Starts saving `tensors` as checkpoint `meta.step` of `tier`; returns the event so far
  // (kPending with the stall, kSkipped, or kFailed when the save could not even start). Throws
  // forge::Error(kUsage) for pieces that do not tile their tensors, naming tensor and ranks.
  SaveEvent save_async(Tier tier, const CheckpointMeta& meta, const std::vector<TensorData>& tensors);
  // Collective. Waits for the save in flight and returns its final event (nothing if none).
  std::optional<SaveEvent> wait();
  // save_async + wait.
  SaveEvent save(Tier tier, const CheckpointMeta& meta, const std::vector<TensorData>& tensors);

  // Finished saves (committed, failed, skipped) not taken yet, oldest first: write them to the metrics.
  std::vector<SaveEvent> take_events();
  int consecutive_failures() const { return failures_; }
  // Rank 0 only (it commits): the step of the newest checkpoint this saver has published, as soon as the
  // background write commits it, before any collective call reports it (0: none). Any thread.
  int64_t committed_step() const { return committed_step_.load(); }

 private:
  struct Job;
  Json exchange(const Json& mine, const std::function<Json(const std::vector<Json>&)>& decide);
  Json local_state() const;
  Json finish_job_rank0(const std::vector<Json>& states);  // joins rank 0's job; its outcome as JSON
  std::optional<SaveEvent> apply_outcome(const Json& reply);
  void run_job(Job& job);
  void commit(Job& job, const std::string& own_xxh3);
  void record(const SaveEvent& e);

  Coordinator& coord_;
  SaverOptions options_;
  std::unique_ptr<Job> job_;
  std::thread worker_;
  std::atomic<bool> busy_{false};
  std::atomic<bool> abort_{false};
  std::atomic<int64_t> committed_step_{0};
  std::shared_ptr<char> buffer_;
  size_t capacity_ = 0;
  int failures_ = 0;
  std::string last_error_;
  std::string sent_geometry_;                 // hash of the geometry this rank last sent
  std::vector<std::vector<Slice>> geometry_;  // rank 0: every rank's slices
  std::vector<std::string> geometry_hash_;    // rank 0
  std::mutex events_mutex_;
  std::vector<SaveEvent> events_;
};

}  // namespace forge::ckpt
