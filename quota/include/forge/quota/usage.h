// Usage as Slurm reports it: sacct rows (one per run of a job; -D keeps requeued runs) and squeue rows
// (running and pending jobs), and the GPU-hour arithmetic on them (FIELD-NOTES: GPU-hours = ElapsedRaw x
// gres/gpu in AllocTRES / 3600).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::quota {

// The sacct columns `sync` asks for, in order. JobName is last: it is the one free-text column, so a
// '|' inside it cannot shift the others.
inline constexpr const char* kSacctFields =
    "JobID,User,Account,QOS,Partition,State,ElapsedRaw,AllocTRES,Start,End,NodeList,JobName";
// The squeue columns (-O) `sync` asks for; tres-alloc is the request while a job pends.
inline constexpr const char* kSqueueFields =
    "JobID:|,UserName:|,Account:|,QOS:|,Partition:|,State:|,TimeUsed:|,TimeLimit:|,tres-alloc:";

struct RunRecord {
  std::string job_id;
  int64_t start = 0;  // Unix seconds (UTC)
  int64_t end = 0;    // 0 while running
  std::string user, account, qos, partition, state, nodelist, job_name;
  int64_t elapsed_s = 0;
  int gpus = 0;
  std::string gpu_type;  // from gres/gpu:<type>=N, empty when untyped
  bool operator==(const RunRecord&) const = default;
};

struct QueuedJob {
  std::string job_id, user, account, qos, partition, state;
  int gpus = 0;
  int64_t elapsed_s = 0;
  int64_t time_limit_s = 0;  // 0 = UNLIMITED
};

// Parses `sacct --parsable2 --noheader -o kSacctFields`. Rows that never started (Start Unknown/None)
// carry no usage and are skipped. A malformed row throws forge::Error(kData) naming the line.
std::vector<RunRecord> parse_sacct(const std::string& text);

// Parses `squeue --noheader -O kSqueueFields` (fields padded with spaces, '|' between them).
std::vector<QueuedJob> parse_squeue(const std::string& text);

// GPUs in a TRES string ("cpu=16,gres/gpu=8,node=1", "gres/gpu:h100=8"); `type` gets the GPU type.
int gpus_in_tres(const std::string& tres, std::string* type = nullptr);

// Slurm's "2026-01-31T12:00:00" read as UTC; nullopt for Unknown, None or malformed text.
std::optional<int64_t> parse_slurm_timestamp(const std::string& text);
std::string format_utc(int64_t t);         // "2026-01-31T12:00:00"
std::string format_utc_minute(int64_t t);  // "2026-01-31 12:00"

// GPU-hours of a run that fall inside [from, to): ElapsedRaw x GPUs / 3600, scaled by the share of the
// run's wall span inside the window (sreport's convention). A running job's row ends at start + elapsed.
double gpu_hours_in(const RunRecord& run, int64_t from, int64_t to);

// Runs whose GPU-hours are lost: failed, preempted, requeued, node failure, out of memory, boot failure.
bool is_wasted_state(const std::string& state);

}  // namespace forge::quota
