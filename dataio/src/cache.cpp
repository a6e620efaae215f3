#include "forge/dataio/cache.h"

#include "forge/common/hash.h"
#include "forge/common/local_rank.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

using Clock = std::chrono::steady_clock;

// <dir>/<dataset version>/<shard path in the dataset> is an entry. Beside it: <entry>.lock, held shared by
// its readers for as long as they read and taken exclusively (without waiting) by an evictor; and, while a
// stager copies, <entry>.stage, held exclusively by that stager, and the copy <entry>.partial. Staging has
// a lock of its own because readers hold theirs for the life of a job: a stager waiting for the entry's
// lock would wait for the job to end. <dir>/.cache.lock serialises accounting and eviction.
constexpr std::string_view kLockSuffix = ".lock", kStageSuffix = ".stage", kPartialSuffix = ".partial";
constexpr const char* kCacheLock = ".cache.lock";

// The cache cannot take more (read-only, full, no room under its limit): staging stops for this process,
// the shared copy is read.
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The shared copy did not read back as the manifest says: not the cache's business; the reader's own
// checks on the shared copy report it.
struct SourceProblem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int err) {
  return std::strerror(err);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Opens `path` (created when `create` and the filesystem allows) and flocks it with `op`. An evictor
// unlinks an entry's lock file while it holds it, so a lock taken on an inode no longer at `path` is
// retaken on the new one. Returns the descriptor, or -errno (EWOULDBLOCK: LOCK_NB and held elsewhere).
int lock_path(const std::string& path, int op, bool create) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0 && create && (errno == EROFS || errno == EACCES || errno == EPERM)) {
      const int why = errno;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a read-only cache still serves its entries
      if (fd < 0) return errno == ENOENT ? -why : -errno;
    }
    if (fd < 0) return -errno;
    int rc;
    while ((rc = ::flock(fd, op)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      return -err;
    }
    struct stat held {
    }, now{};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev)
      return fd;
    ::close(fd);
  }
  return -EAGAIN;
}

bool present(const std::string& path, uint64_t bytes) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) == bytes;
}

// Removes empty directories from `dir` up to (not including) `root`.
void prune_dirs(fs::path dir, const fs::path& root) {
  while (dir != root && dir.string().size() > root.string().size()) {
    if (::rmdir(dir.c_str()) != 0) return;
    dir = dir.parent_path();
  }
}

// Removes the entry at `data` when its lock is free (no reader): the data, then the lock file, while
// holding it. False when in use (or the cache is read-only).
bool try_remove(const std::string& data, const fs::path& root) {
  const std::string lock = data + std::string(kLockSuffix);
  const int fd = lock_path(lock, LOCK_EX | LOCK_NB, true);
  if (fd < 0) return false;
  ::unlink(data.c_str());
  ::unlink(lock.c_str());
  ::close(fd);
  prune_dirs(fs::path(data).parent_path(), root);
  return true;
}

struct Found {
  std::string path;  // of the entry's data (for a partial: the entry it is becoming)
  uint64_t bytes = 0;
  struct timespec mtime {};
};
struct Scan {
  std::vector<Found> entries, partials;
  uint64_t entry_bytes = 0, partial_bytes = 0;
};

// Every entry and temporary file under `root`, entries least recently used first. Files come and go
// while other processes work: what vanishes under the walk is skipped.
Scan scan(const fs::path& root) {
  Scan s;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    if (it->path().parent_path() == root) continue;  // .cache.lock and the version directories
    if (ends_with(path, kLockSuffix) || ends_with(path, kStageSuffix)) continue;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    Found f{path, uint64_t(st.st_size), st.st_mtim};
    if (ends_with(path, kPartialSuffix)) {
      f.path.resize(path.size() - kPartialSuffix.size());
      // Stagers reserve the whole file at once (fallocate): count what it will take.
      f.bytes = std::max(f.bytes, uint64_t(st.st_blocks) * 512);
      s.partial_bytes += f.bytes;
      s.partials.push_back(std::move(f));
    } else {
      s.entry_bytes += f.bytes;
      s.entries.push_back(std::move(f));
    }
  }
  std::sort(s.entries.begin(), s.entries.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.path) <
           std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.path);
  });
  return s;
}

// A temporary file whose staging lock is free belongs to a stager that died (the kernel released its
// lock): removed (true).
bool remove_if_stale(const Found& partial, const fs::path& root) {
  const std::string lock = partial.path + std::string(kStageSuffix);
  const int fd = lock_path(lock, LOCK_EX | LOCK_NB, true);
  if (fd < 0) return false;
  ::unlink((partial.path + std::string(kPartialSuffix)).c_str());
  ::unlink(lock.c_str());
  ::close(fd);
  prune_dirs(fs::path(partial.path).parent_path(), root);
  return true;
}

// Bytes the cache may hold: the configured limit, or what leaves 10% of the filesystem free.
uint64_t limit_bytes(const fs::path& root, uint64_t max_bytes, uint64_t used) {
  if (max_bytes > 0) return max_bytes;
  struct statvfs v {};
  if (::statvfs(root.c_str(), &v) != 0) return UINT64_MAX;
  const uint64_t size = uint64_t(v.f_blocks) * v.f_frsize, avail = uint64_t(v.f_bavail) * v.f_frsize;
  return used + (avail > size / 10 ? avail - size / 10 : 0);
}

double idle_seconds(const struct timespec& t) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count() - double(t.tv_sec) - double(t.tv_nsec) * 1e-9;
}

// The cache directory as one spelling (no trailing separator), so that paths under it compare.
fs::path normal_root(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  return p.has_filename() || p == p.root_path() ? p : p.parent_path();
}

bool safe_relative(const std::string& file) {
  const fs::path p(file);
  if (file.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == ".." || part == ".") return false;
  return true;
}

}  // namespace

Json CacheStats::to_json() const {
  return {{"hits", hits},
          {"misses", misses},
          {"fallbacks", fallbacks},
          {"bytes_staged", bytes_staged},
          {"staging_s", staging_s}};
}

struct ShardCache::Impl {
  CacheOptions opt;
  fs::path root, version_dir;
  std::string dataset_dir;
  bool staging = true;  // false after the cache said it cannot take more
  bool warned = false;
  CacheStats stats;
  struct Held {
    Fd lock;
    bool staged = false;  // counted as a miss (else a hit)
  };
  std::map<std::string, Held> held;  // shard file -> its entry's shared lock

  void unavailable(const std::string& why) {
    staging = false;
    if (warned) return;
    warned = true;
    spdlog::warn(
        "data cache {}: {}; reading the shared copy in {} for the shards the cache does not hold (the job "
        "goes "
        "on without staging)",
        opt.dir, why, dataset_dir);
  }
  std::string open_one(const ShardEntry& e);
  // Copies the shared shard into the entry under its exclusive lock; throws Unavailable or SourceProblem.
  void stage(const ShardEntry& e, const std::string& data);
  Fd reserve(const std::string& data, uint64_t bytes);
};

Fd ShardCache::Impl::reserve(const std::string& data, uint64_t bytes) {
  const int lock = lock_path((root / kCacheLock).string(), LOCK_EX, true);
  if (lock < 0)
    throw Unavailable(fmt::format("cannot lock {}: {}", (root / kCacheLock).string(), errno_text(-lock)));
  const Fd cache_lock(lock);
  Scan s = scan(root);
  uint64_t partial_bytes = s.partial_bytes;
  // Ours (left by a stager killed before us) is about to be replaced; others go when their stager is gone.
  for (const Found& p : s.partials)
    if (p.path == data || remove_if_stale(p, root)) partial_bytes -= p.bytes;
  uint64_t used = s.entry_bytes + partial_bytes;
  const uint64_t limit = limit_bytes(root, opt.max_bytes, used);
  for (const Found& f : s.entries) {
    if (used + bytes <= limit) break;
    if (try_remove(f.path, root)) used -= f.bytes;
  }
  if (used + bytes > limit)
    throw Unavailable(fmt::format(
        "no room for {} ({} bytes): its limit is {} bytes ({}) and {} bytes are held by entries in use", data,
        bytes, limit, opt.max_bytes > 0 ? "data.cache_max_bytes" : "all but 10% of the filesystem", used));
  Fd out(
      ::open((data + std::string(kPartialSuffix)).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.ok())
    throw Unavailable(fmt::format("cannot create {}{}: {}", data, kPartialSuffix, errno_text(errno)));
  // The whole file at once: a full disk says so now, and the next stager's accounting sees the space taken.
  if (const int rc = ::posix_fallocate(out.get(), 0, off_t(bytes));
      rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
    throw Unavailable(fmt::format("cannot reserve {} bytes for {}: {}", bytes, data, errno_text(rc)));
  return out;
}

void ShardCache::Impl::stage(const ShardEntry& e, const std::string& data) {
  const std::string partial = data + std::string(kPartialSuffix);
  Fd out = reserve(data, e.bytes);
  const std::string source = (fs::path(dataset_dir) / e.file).string();
  const Fd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.ok()) throw SourceProblem(fmt::format("cannot open {}: {}", source, errno_text(errno)));
  ::posix_fadvise(in.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  // Hashed as copied: what lands in the entry is what the manifest names, or nothing does.
  Xxh3Stream hash;
  std::vector<char> buf(size_t(8) << 20);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SourceProblem(fmt::format("cannot read {}: {}", source, errno_text(errno)));
    if (n == 0) break;
    hash.update(buf.data(), size_t(n));
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(out.get(), buf.data() + done, size_t(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw Unavailable(fmt::format("cannot write {}: {}", partial, errno_text(errno)));
      done += w;
    }
    total += uint64_t(n);
  }
  if (total != e.bytes || hash.hex() != e.xxh3)
    throw SourceProblem(fmt::format("{} read back {} bytes with xxh3 {}, the manifest says {} bytes, xxh3 {}",
                                    source, total, hash.hex(), e.bytes, e.xxh3));
  if (::ftruncate(out.get(), off_t(total)) != 0 || ::fsync(out.get()) != 0)
    throw Unavailable(fmt::format("cannot sync {}: {}", partial, errno_text(errno)));
  if (::rename(partial.c_str(), data.c_str()) != 0)
    throw Unavailable(fmt::format("cannot rename {} into place: {}", partial, errno_text(errno)));
  const Fd dir(::open(fs::path(data).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.ok()) ::fsync(dir.get());
  stats.bytes_staged += total;
}

std::string ShardCache::Impl::open_one(const ShardEntry& e) {
  if (!safe_relative(e.file)) {
    ++stats.fallbacks;
    return dataset_dir;
  }
  const std::string data = (version_dir / e.file).string();
  const std::string lock = data + std::string(kLockSuffix), stage_lock = data + std::string(kStageSuffix);
  const fs::path parent = fs::path(data).parent_path();
  bool staged = false;
  // A few rounds: an evictor may remove the entry between staging and use (a cache far too small), or the
  // directories between their creation and the lock's.
  for (int round = 0; round < 4; ++round) {
    int fd = lock_path(lock, LOCK_SH, staging);
    if (fd == -ENOENT && staging) {
      std::error_code ec;
      fs::create_directories(parent, ec);
      if (ec) {
        unavailable(fmt::format("cannot create {}: {}", parent.string(), ec.message()));
        break;
      }
      continue;
    }
    if (fd < 0) {
      if (fd != -ENOENT) unavailable(fmt::format("cannot lock {}: {}", lock, errno_text(-fd)));
      break;
    }
    Fd use(fd);
    if (present(data, e.bytes)) {
      ::utimensat(AT_FDCWD, data.c_str(), nullptr, 0);  // least recently used goes first
      ++(staged ? stats.misses : stats.hits);
      held[e.file] = Held{std::move(use), staged};
      return version_dir.string();
    }
    use = Fd();
    if (!staging) break;
    // Absent: stage it, or wait for the process staging it and find it staged.
    const int sfd = lock_path(stage_lock, LOCK_EX, true);
    if (sfd == -ENOENT) continue;
    if (sfd < 0) {
      unavailable(fmt::format("cannot lock {}: {}", stage_lock, errno_text(-sfd)));
      break;
    }
    const Fd staging_lock(sfd);
    bool failed = false;
    if (!present(data, e.bytes)) {
      try {
        stage(e, data);
        staged = true;
      } catch (const Unavailable& u) {
        unavailable(u.what());
        failed = true;
      } catch (const SourceProblem& p) {
        spdlog::warn("data cache {}: not staging {}: {}", opt.dir, e.file, p.what());
        failed = true;
      }
    }
    if (failed) ::unlink((data + std::string(kPartialSuffix)).c_str());
    // Done with it: stagers waiting on it retake a new one and find the entry there (or try themselves).
    ::unlink(stage_lock.c_str());
    if (failed) break;
  }
  ++stats.fallbacks;
  return dataset_dir;
}

ShardCache::ShardCache(const CacheOptions& options, const Manifest& manifest, std::string dataset_dir)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opt = options;
  s.root = normal_root(options.dir);
  s.version_dir = s.root / manifest.version;
  s.dataset_dir = std::move(dataset_dir);
  if (manifest.version.empty() || !safe_relative(manifest.version))
    s.unavailable("the dataset has no version");
}

ShardCache::~ShardCache() = default;

std::vector<std::string> ShardCache::open(std::span<const ShardEntry* const> entries) {
  Impl& s = *impl_;
  const auto t0 = Clock::now();
  std::vector<std::string> dirs(entries.size());
  // The ranks of a node start at different shards: each stages its share while the others stage theirs,
  // then finds theirs staged (or waits on the lock of one still being copied).
  size_t start = 0;
  try {
    const LocalRank me = local_rank();
    if (!entries.empty())
      start = me.size > 0 ? entries.size() * size_t(me.rank % me.size) / size_t(me.size)
                          : size_t(me.rank) % entries.size();
  } catch (const std::exception&) {
    start = 0;  // a launcher variable that does not parse: order does not matter for correctness
  }
  for (size_t k = 0; k < entries.size(); ++k) {
    const size_t i = (start + k) % entries.size();
    dirs[i] = s.open_one(*entries[i]);
  }
  s.stats.staging_s += std::chrono::duration<double>(Clock::now() - t0).count();
  return dirs;
}

std::string ShardCache::reject(const ShardEntry& e, const std::string& why) {
  Impl& s = *impl_;
  spdlog::warn("data cache {}: the copy of {} failed verification ({}); reading the shared copy in {}",
               s.opt.dir, e.file, why, s.dataset_dir);
  if (const auto it = s.held.find(e.file); it != s.held.end()) {
    --(it->second.staged ? s.stats.misses : s.stats.hits);
    // Dropped now unless another process reads it too (it will find the damage itself); the next stager
    // then copies it afresh.
    const std::string data = (s.version_dir / e.file).string();
    if (::flock(it->second.lock.get(), LOCK_EX | LOCK_NB) == 0) {
      ::unlink(data.c_str());
      ::unlink((data + std::string(kLockSuffix)).c_str());
    }
    s.held.erase(it);
  }
  ++s.stats.fallbacks;
  return s.dataset_dir;
}

const CacheStats& ShardCache::stats() const {
  return impl_->stats;
}

CacheListing list_cache(const std::string& dir) {
  CacheListing out;
  const fs::path root = normal_root(dir);
  const Scan s = scan(root);
  for (const Found& f : s.entries) {
    CacheEntryInfo info;
    const fs::path rel = fs::path(f.path).lexically_relative(root);
    info.version = rel.begin()->string();
    info.file = fs::path(f.path).lexically_relative(root / info.version).string();
    info.bytes = f.bytes;
    info.idle_s = idle_seconds(f.mtime);
    const int fd = lock_path(f.path + std::string(kLockSuffix), LOCK_EX | LOCK_NB, false);
    info.in_use = fd == -EWOULDBLOCK;
    if (fd >= 0) ::close(fd);
    out.entries.push_back(std::move(info));
  }
  out.partial_files = s.partials.size();
  out.partial_bytes = s.partial_bytes;
  return out;
}

EvictResult evict_cache(const std::string& dir, uint64_t keep_bytes, const std::string& version) {
  EvictResult r;
  const fs::path root = normal_root(dir);
  const int lock = lock_path((root / kCacheLock).string(), LOCK_EX, true);
  const Fd cache_lock(lock >= 0 ? lock : -1);
  const Scan s = scan(root);
  for (const Found& p : s.partials)
    if (remove_if_stale(p, root)) ++r.stale_partials;
  const auto selected = [&](const Found& f) {
    return version.empty() || fs::path(f.path).lexically_relative(root).begin()->string() == version;
  };
  uint64_t total = 0;
  for (const Found& f : s.entries)
    if (selected(f)) total += f.bytes;
  for (const Found& f : s.entries) {
    if (total <= keep_bytes) break;
    if (!selected(f)) continue;
    if (try_remove(f.path, root)) {
      ++r.evicted;
      r.evicted_bytes += f.bytes;
      total -= f.bytes;
    } else {
      ++r.kept_in_use;
    }
  }
  return r;
}

}  // namespace forge::data
