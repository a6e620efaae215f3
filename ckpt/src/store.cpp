#include "forge/ckpt/store.h"

#include "fs.h"

#include "forge/common/error.h"
#include "forge/common/json.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace forge::ckpt {

namespace fs = std::filesystem;

std::string tier_dir(const std::string& run_dir, Tier tier) {
  return (fs::path(run_dir) / "checkpoints" / std::string(tier_name(tier))).string();
}

std::string checkpoint_dir(const std::string& run_dir, Tier tier, int64_t step) {
  return (fs::path(tier_dir(run_dir, tier)) / fmt::format("step-{:08d}", step)).string();
}

std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.size() < 13 || name.rfind("step-", 0) != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || i > 23) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<Entry> list_checkpoints(const std::string& run_dir, Tier tier) {
  std::vector<Entry> out;
  const fs::path dir = tier_dir(run_dir, tier);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = parse_step_dir(e.path().filename().string());
    if (!step || !fs::exists(e.path() / kCommittedFile, ec)) continue;
    out.push_back(Entry{tier, *step, e.path().string()});
  }
  if (ec) fail(ExitCode::kIo, "cannot list '{}': {}", dir.string(), ec.message());
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  return out;
}

std::vector<Entry> list_checkpoints(const std::string& run_dir) {
  std::vector<Entry> out;
  for (Tier t : {Tier::kRecovery, Tier::kMilestone, Tier::kRelease}) {
    auto part = list_checkpoints(run_dir, t);
    out.insert(out.end(), part.begin(), part.end());
  }
  std::stable_sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  return out;
}

namespace {

int open_dir(const std::string& dir) {
  return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

}  // namespace

DirLock DirLock::shared(const std::string& dir) {
  const int fd = open_dir(dir);
  if (fd < 0) fail(ExitCode::kIo, "cannot open checkpoint '{}': {}", dir, std::strerror(errno));
  while (::flock(fd, LOCK_SH) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    fail(ExitCode::kIo, "cannot lock checkpoint '{}': {}", dir, std::strerror(err));
  }
  return DirLock(fd);
}

std::optional<DirLock> DirLock::try_exclusive(const std::string& dir) {
  const int fd = open_dir(dir);
  if (fd < 0) return std::nullopt;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return DirLock(fd);
}

bool DirLock::is_locked(const std::string& dir) {
  const int fd = open_dir(dir);
  if (fd < 0) return false;
  const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);  // closing drops the probe's own lock, if it got one
  return locked;
}

bool DirLock::still_at(const std::string& dir) const {
  struct stat held {
  }, now{};
  return ::fstat(fd_, &held) == 0 && ::stat(dir.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
         held.st_ino == now.st_ino;
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

bool remove_checkpoint(const std::string& dir) {
  auto lock = DirLock::try_exclusive(dir);
  if (!lock) return !fs::exists(dir);
  const fs::path p(dir);
  const fs::path trash = p.parent_path() / (".trash-" + p.filename().string() + "-" + detail::random_nonce());
  if (::rename(dir.c_str(), trash.c_str()) != 0)
    fail(ExitCode::kIo, "cannot remove checkpoint '{}' (rename failed: {})", dir, std::strerror(errno));
  fsync_dir(p.parent_path().string());
  detail::remove_tree(trash.string());
  return true;
}

std::vector<std::string> apply_retention(const std::string& run_dir, int recovery_keep,
                                         std::optional<CkptRef> newest_valid) {
  std::vector<CkptRef> refs;
  for (const auto& e : list_checkpoints(run_dir))
    refs.push_back(CkptRef{e.tier, e.step, DirLock::is_locked(e.path)});
  std::vector<std::string> removed;
  for (const auto& v : retention_victims(refs, recovery_keep, newest_valid)) {
    const std::string dir = checkpoint_dir(run_dir, v.tier, v.step);
    if (remove_checkpoint(dir)) removed.push_back(dir);
  }
  return removed;
}

}  // namespace forge::ckpt
