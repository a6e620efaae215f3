// Approval of large requests (docs/ADMISSION.md, "Approvals"): a team member asks for a job bigger than
// the [approval] rules allow (request), an approver of the team decides (decide), and job_submit.lua
// spends one use of the approval for each job it admits (admit). Kept in the ledger database. Every call
// takes the caller's Identity explicitly; forge-quota passes the one the OS gives (identity.h).
#pragma once

#include "forge/quota/policy.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::sqlite {
class Db;  // forge/common/sqlite.h
}

namespace forge::quota {

enum class ApprovalState { kPending, kApproved, kDenied };
const char* state_name(ApprovalState state);  // "pending", "approved", "denied"

struct Approval {
  std::string id;  // "apr-" and 12 lowercase hex digits
  std::string team, tier;
  int gpus = 0;              // the most GPUs a job may take with it
  int64_t time_limit_s = 0;  // the longest time limit a job may have with it
  std::string reason, requester;
  int64_t requested_at = 0;
  ApprovalState state = ApprovalState::kPending;
  std::string decided_by, note;
  int64_t decided_at = 0;  // 0 while pending
  int64_t expires_at = 0;  // 0 unless approved
  int uses_allowed = 0, uses_left = 0;
  std::vector<std::string> job_ids;  // jobs admitted with it, as far as `sync` has learnt them
};

// An approver's answer to a request.
struct Verdict {
  bool approve = false;
  int uses = 1;                           // jobs it admits, 1..100
  std::optional<int64_t> expires_in_s{};  // default: [approval] ttl
  std::string note{};
};

// A training job as job_submit.lua sees it. All text is untrusted.
struct JobRequest {
  std::string team, tier;
  int gpus = 0;
  int64_t time_limit_s = 0;
  std::string partition{};                   // empty: the job named none
  std::optional<std::string> approval_id{};  // the approval the user gave, if any
  // A change to an admitted job (job_submit.lua's slurm_job_modify): the job already holds a use of
  // `approval_id`, which must still cover it; no use is taken and its expiry does not matter.
  bool approval_held = false;
};

struct AdmitResult {
  bool admitted = false;
  std::string message;      // why not (one sentence for the user), or what admitted it
  std::string partition;    // the job's partition, or the pool's when the job named none
  std::string approval_id;  // the approval a use was taken from; empty when none was needed
};

// "apr-" followed by exactly 12 lowercase hex digits.
bool is_approval_id(std::string_view text);

class ApprovalStore {
 public:
  // The ledger at `ledger_path`, opened (and created, with the approval tables, if needed) on first use:
  // a job that needs no approval is admitted without touching it (job_submit.lua runs admit for every
  // training job).
  explicit ApprovalStore(const std::string& ledger_path);
  ~ApprovalStore();
  ApprovalStore(const ApprovalStore&) = delete;
  ApprovalStore& operator=(const ApprovalStore&) = delete;

  // Records a pending request and returns its new id. forge::Error(kUsage), one actionable line, when
  // `who` is not a member of `team`, the team may not use `tier`, the time is over the tier's max wall,
  // gpus is outside 1..1048576 or over the team's max_gpus, or the reason is empty, over 500 bytes or holds
  // control characters.
  std::string request(const Policy& policy, const Identity& who, const std::string& team,
                      const std::string& tier, int gpus, int64_t time_limit_s, const std::string& reason,
                      int64_t now);

  // Approves or denies a pending request and returns it as decided. forge::Error(kUsage) when the id is
  // malformed or unknown, `who` is not an approver of the request's team, `who` asked for it (four eyes),
  // it is not pending, or uses / expiry are out of range.
  Approval decide(const Policy& policy, const Identity& who, const std::string& id, const Verdict& verdict,
                  int64_t now);

  // Admits a training job or says why not (never throws for bad input, only for ledger failures). In
  // order: `who` is a member of the team and the team may use the tier; the job's partition is in a pool
  // that takes the tier (when the policy has pools; a job without one gets the first such pool's); an
  // approval, when approval_needed says so, that exists, is approved, has not expired, has uses left, is
  // for this team and tier and covers the job's GPUs and time. Taking a use is one BEGIN IMMEDIATE
  // transaction, so two jobs cannot both take an approval's last use. A held approval (JobRequest::
  // approval_held) is checked for cover only.
  AdmitResult admit(const Policy& policy, const Identity& who, const JobRequest& job, int64_t now);

  // `sacct -o JobID,AdminComment` lines: for each job whose comment holds "forge-approval=<id>" (the
  // controller appends it), the earliest use of that approval without a job id gets the job's. A job
  // already recorded is skipped, so syncing again changes nothing. Returns the uses updated.
  size_t record_job_ids(const std::string& sacct_text);

  // The requests `who` may see, oldest first: admins all, others those of the teams they belong to or
  // approve for.
  std::vector<Approval> list(const Policy& policy, const Identity& who) const;
  std::vector<Approval> list_all() const;
  std::optional<Approval> find(const std::string& id) const;

 private:
  sqlite::Db& db() const;
  std::string path_;
  mutable std::unique_ptr<sqlite::Db> db_;
};

}  // namespace forge::quota
