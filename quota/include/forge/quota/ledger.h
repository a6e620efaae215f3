// The usage ledger: an SQLite database (WAL) of every run sacct reported, the jobs squeue holds now,
// and the runs' summaries (tokens, MFU). A sync is one transaction and keyed so that syncing the same
// window again changes nothing: a run is (JobID, Start) — a requeued job's runs stay apart.
#pragma once

#include "forge/common/run_segment.h"
#include "forge/quota/usage.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace forge::sqlite {
class Db;  // forge/common/sqlite.h
}

namespace forge::quota {

using forge::RunSegment;  // common/include/forge/common/run_segment.h

struct RunSummary {
  double tokens = 0;
  std::optional<double> mfu;         // fraction of peak, 0..1
  std::vector<RunSegment> segments;  // scanned: the file's; from the ledger: this job's
};

class Ledger {
 public:
  // Opens (creating if needed) the ledger at `path`. Throws forge::Error naming the file: kData when it
  // is damaged, kIo otherwise.
  explicit Ledger(const std::string& path);
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Records one sync in one transaction: runs are upserted by (JobID, Start), the queue is replaced,
  // summaries are upserted by job id, their segments by (their own job id, start).
  void record(const std::vector<RunRecord>& runs, const std::vector<QueuedJob>& queue,
              const std::map<std::string, RunSummary>& summaries, int64_t synced_at);

  // Runs whose span overlaps [from, to).
  std::vector<RunRecord> runs(int64_t from, int64_t to) const;
  std::vector<QueuedJob> queue() const;
  // Keyed by job id; a job with segments but no summary of its own (an earlier job of a run directory
  // that a later job continued) has tokens 0 and no MFU.
  std::map<std::string, RunSummary> summaries() const;
  int64_t last_sync() const;  // 0 if never synced

 private:
  std::unique_ptr<sqlite::Db> db_;
};

// summary.json files under `dirs` (searched up to three levels deep), keyed by their job id. Files that
// do not parse or carry no job id are skipped; `skipped` gets one line per such file.
std::map<std::string, RunSummary> scan_summaries(const std::vector<std::string>& dirs,
                                                 std::vector<std::string>* skipped);

// `sacct --parsable2 --noheader -o JobID,Comment`: the summaries the batch scripts leave in job comments
// ("forge:" + compact JSON with tokens and mfu, scripts/sbatch/common.sh), for runs whose directories
// `sync` cannot see. Other comments are not ours and are ignored; so is a comment that does not parse.
std::map<std::string, RunSummary> parse_job_comments(const std::string& text);

}  // namespace forge::quota
