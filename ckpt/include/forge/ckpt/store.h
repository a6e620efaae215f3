// The checkpoint tree on disk: <run>/checkpoints/<tier>/step-<8 digits>/. A directory is a checkpoint
// only when its name is final (step-N) and it holds COMMITTED; everything else under a tier directory is
// a save in progress (".step-N.partial-<nonce>", locked by its writer) or crash garbage that gc removes.
//
// Locks: flock(2) on the checkpoint directory itself. Readers and promotion hold a shared lock for as
// long as they read; retention and gc delete only what they can lock exclusively (without waiting), and
// first rename it out of readers' sight (".trash-..."). Writers hold an exclusive lock on their staging
// directory. flock needs a filesystem that implements it across nodes (local disks, NFSv4, Lustre
// mounted with -o flock, GPFS).
#pragma once

#include "forge/ckpt/policy.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::ckpt {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kCommittedFile = "COMMITTED";
inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kVerifyBatchFile = "verify-batch.bin";

std::string tier_dir(const std::string& run_dir, Tier tier);
std::string checkpoint_dir(const std::string& run_dir, Tier tier, int64_t step);
// 120 for "step-00000120"; nothing for any other name.
std::optional<int64_t> parse_step_dir(const std::string& name);

struct Entry {
  Tier tier = Tier::kRecovery;
  int64_t step = 0;
  std::string path;
};

// Committed checkpoints of a run, by ascending step (milestone after recovery on the same step).
// A missing checkpoints/ directory is an empty list.
std::vector<Entry> list_checkpoints(const std::string& run_dir);
std::vector<Entry> list_checkpoints(const std::string& run_dir, Tier tier);

class DirLock {
 public:
  // Waits for a shared lock; throws forge::Error(kIo) if the directory can't be opened.
  static DirLock shared(const std::string& dir);
  // An exclusive lock, or nothing when another process holds any lock on it.
  static std::optional<DirLock> try_exclusive(const std::string& dir);
  // Whether some process holds a lock on `dir` now (a missing directory is not locked).
  static bool is_locked(const std::string& dir);
  // Whether `dir` still names the directory this lock holds (it may have been swapped or removed while
  // the lock was awaited).
  bool still_at(const std::string& dir) const;

  DirLock(DirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Deletes a checkpoint unless someone holds its lock: renames it to ".trash-..." in the same tier
// directory (atomic, so readers see it whole or absent), then removes the tree. False when locked.
bool remove_checkpoint(const std::string& dir);

// Applies the retention policy to a run's committed checkpoints; returns the directories removed.
std::vector<std::string> apply_retention(const std::string& run_dir, int recovery_keep,
                                         std::optional<CkptRef> newest_valid);

}  // namespace forge::ckpt
