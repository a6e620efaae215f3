// The node-local shard cache on real files, real processes and real locks: concurrent stagers, a stager
// killed mid-copy, a damaged copy, LRU eviction around entries in use, and caches that cannot take more.
#include "forge/dataio/cache.h"
#include "dataset_fixture.h"
#include "forge/common/hash.h"
#include "forge/dataio/reader.h"
#include "support/temp_dir.h"

#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using forge::MicroBatch;
using forge::data::CacheStats;
using forge::data::Manifest;
using forge::data::Reader;
using forge::data::ReaderOptions;

namespace {

using forge::test::two_domains;

ReaderOptions options(const std::string& cache = "", uint64_t max_bytes = 0, const std::string& domain = "") {
  ReaderOptions o;
  o.seq_len = 16;
  o.global_batch = 8;
  o.seed = 7;
  o.prefetch = 0;
  o.domain = domain;
  o.cache = {cache, max_bytes};
  return o;
}

// What a reader delivers in its first batches, as one digest, and what its cache did.
struct Read {
  std::string digest;
  CacheStats stats;
};
Read read(const std::string& dir, const ReaderOptions& o, int batches = 12) {
  Reader r(dir, o);
  forge::Xxh3Stream h;
  MicroBatch b;
  for (int i = 0; i < batches; ++i) {
    r.next(b);
    h.update(b.inputs.data(), b.inputs.size() * sizeof(int32_t));
    h.update(b.targets.data(), b.targets.size() * sizeof(int32_t));
    h.update(b.next_tokens.data(), b.next_tokens.size() * sizeof(int32_t));
  }
  return {h.hex(), r.cache_stats()};
}

// Runs `body` in a child process; its exit status is body's result (1 on an exception).
pid_t spawn(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (...) {
    }
    ::_exit(rc);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A child's read, reported through a file.
void save(const std::string& path, const Read& r) {
  std::ofstream(path) << r.digest << " " << r.stats.hits << " " << r.stats.misses << " " << r.stats.fallbacks;
}
Read load(const std::string& path) {
  Read r;
  std::ifstream(path) >> r.digest >> r.stats.hits >> r.stats.misses >> r.stats.fallbacks;
  return r;
}

std::string entry_path(const std::string& cache, const Manifest& m, const std::string& file) {
  return (fs::path(cache) / m.version / file).string();
}

// Every entry in the cache is a verified copy of its shard, and no temporary file is left.
void require_clean(const std::string& cache, const Manifest& m) {
  const forge::data::CacheListing l = forge::data::list_cache(cache);
  CHECK(l.partial_files == 0);
  for (const auto& e : l.entries) {
    REQUIRE(e.version == m.version);
    const auto it =
        std::find_if(m.shards.begin(), m.shards.end(), [&](const auto& s) { return s.file == e.file; });
    REQUIRE(it != m.shards.end());
    CHECK(forge::xxh3_file_hex(entry_path(cache, m, e.file)) == it->xxh3);
  }
}

// The warnings logged while it lives (spdlog's default logger, restored after).
class CaptureLog {
 public:
  CaptureLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~CaptureLog() { spdlog::set_default_logger(previous_); }
  // Lines that mention `what`.
  int lines_with(const std::string& what) const {
    std::istringstream in(text_.str());
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
    return n;
  }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

// A tmpfs mounted for the test (root only); unmounted when it ends.
class Tmpfs {
 public:
  Tmpfs(const std::string& path, const std::string& size, bool read_only) : path_(path) {
    fs::create_directories(path);
    ok_ = ::mount("forge-test", path.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, ("size=" + size).c_str()) ==
          0;
  }
  ~Tmpfs() {
    if (ok_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }

 private:
  std::string path_;
  bool ok_ = false;
};

void set_age(const std::string& path, int seconds) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const timespec t{std::chrono::duration_cast<std::chrono::seconds>(now).count() - seconds, 0};
  const timespec times[2] = {t, t};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

}  // namespace

TEST_CASE("cache: two processes stage one dataset together and read identical verified data") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds", cache = tmp / "cache";
  const Manifest m = forge::test::make_fixture_dataset(dir, two_domains());
  const uint64_t shards = m.shards_of("train").size();
  const std::string expected = read(dir, options()).digest;
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i)
    pids.push_back(spawn([&, i] {
      save(tmp / ("out-" + std::to_string(i)), read(dir, options(cache)));
      return 0;
    }));
  for (const pid_t pid : pids) REQUIRE(wait_exit(pid) == 0);
  uint64_t staged = 0;
  for (int i = 0; i < 2; ++i) {
    const Read r = load(tmp / ("out-" + std::to_string(i)));
    CHECK(r.digest == expected);
    CHECK(r.stats.fallbacks == 0);
    CHECK(r.stats.hits + r.stats.misses == shards);
    staged += r.stats.misses;
  }
  CHECK(staged == shards);  // each shard copied once, by one of them
  CHECK(forge::data::list_cache(cache).entries.size() == shards);
  require_clean(cache, m);
  // A later job on the same dataset version reads every shard from the cache.
  const Read again = read(dir, options(cache));
  CHECK(again.digest == expected);
  CHECK(again.stats.hits == shards);
  CHECK(again.stats.misses == 0);
}

TEST_CASE("cache: a stager killed mid-copy leaves no entry; the process waiting behind it stages and reads") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds", cache = tmp / "cache";
  // One shard of 64 MiB: its copy takes long enough to be caught in the act.
  const Manifest m = forge::test::make_fixture_dataset(dir, {{"big", {32u << 20}, 1}});
  const forge::data::ShardEntry& shard = *m.shards_of("train").front();
  const std::string entry = entry_path(cache, m, shard.file), partial = entry + ".partial";
  const std::string expected = read(dir, options(), 2).digest;
  // Starts a stager and kills it once its temporary file exists; false when the copy was over first.
  const auto stage_and_kill = [&](const std::function<void()>& meanwhile) {
    fs::remove_all(cache);
    const pid_t stager = spawn([&] {
      forge::data::ShardCache c({cache, 0}, m, dir);
      const std::vector<const forge::data::ShardEntry*> entries{&shard};
      c.open(entries);
      return 0;
    });
    int status = 0;
    while (!fs::exists(partial) && ::waitpid(stager, &status, WNOHANG) == 0) {
    }
    meanwhile();
    ::kill(stager, SIGKILL);
    return wait_exit(stager) == 128 + SIGKILL && !fs::exists(entry);
  };
  bool caught = false;
  for (int attempt = 0; attempt < 5 && !caught; ++attempt) caught = stage_and_kill([] {});
  REQUIRE(caught);
  // Only the temporary file remains: nothing that looks like an entry.
  CHECK(fs::exists(partial));
  CHECK_FALSE(fs::exists(entry));
  CHECK(forge::data::list_cache(cache).entries.empty());
  // Again, with a reader starting while the stager copies: it waits on the staging lock, finds no entry
  // when the stager dies, stages the shard itself and reads verified data.
  pid_t reader = -1;
  caught = false;
  for (int attempt = 0; attempt < 5 && !caught; ++attempt) {
    caught = stage_and_kill([&] {
      reader = spawn([&] {
        save(tmp / "reader", read(dir, options(cache), 2));
        return 0;
      });
    });
    if (!caught) REQUIRE(wait_exit(reader) == 0);
  }
  REQUIRE(caught);
  REQUIRE(wait_exit(reader) == 0);
  const Read r = load(tmp / "reader");
  CHECK(r.digest == expected);
  CHECK(r.stats.fallbacks == 0);
  CHECK(r.stats.misses == 1);
  REQUIRE(fs::exists(entry));
  require_clean(cache, m);
}

TEST_CASE("cache: a damaged cached copy is detected, dropped and read from the shared copy") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds", cache = tmp / "cache";
  const Manifest m = forge::test::make_fixture_dataset(dir, two_domains());
  const uint64_t shards = m.shards_of("train").size();
  const std::string expected = read(dir, options()).digest;
  REQUIRE(read(dir, options(cache)).stats.misses == shards);
  // One bit flipped in the middle of a cached copy, its size unchanged.
  const std::string damaged = entry_path(cache, m, m.shards_of("train")[1]->file);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(fs::file_size(damaged) / 2));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(std::streamoff(fs::file_size(damaged) / 2));
    f.write(&c, 1);
  }
  Read r;
  {
    CaptureLog log;
    r = read(dir, options(cache));
    CHECK(log.lines_with("failed verification") == 1);
  }
  CHECK(r.digest == expected);
  CHECK(r.stats.fallbacks == 1);
  CHECK(r.stats.hits == shards - 1);
  CHECK_FALSE(fs::exists(damaged));  // no one else held it: dropped
  // The next reader stages it afresh.
  const Read next = read(dir, options(cache));
  CHECK(next.stats.misses == 1);
  CHECK(next.stats.hits == shards - 1);
  CHECK(next.digest == expected);
  require_clean(cache, m);
}

TEST_CASE("cache: LRU eviction under the limit takes the least recently used entry not in use") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds", cache = tmp / "cache";
  const Manifest m =
      forge::test::make_fixture_dataset(dir, {{"a", {2000}, 1}, {"b", {2100}, 1}, {"c", {2200}, 1}});
  std::map<std::string, std::string> entry;
  uint64_t all = 0;
  for (const char* d : {"a", "b", "c"}) {
    const auto* e = m.shards_of("train", d).front();
    entry[d] = entry_path(cache, m, e->file);
    all += e->bytes;
  }
  const uint64_t limit = all - 1;                                      // any two entries fit, not three
  auto a = std::make_unique<Reader>(dir, options(cache, limit, "a"));  // a: staged and in use
  REQUIRE(a->cache_stats().misses == 1);
  REQUIRE(read(dir, options(cache, limit, "b"), 1).stats.misses == 1);  // b: staged, then released
  set_age(entry["a"], 300);  // a is the least recently used, but in use
  set_age(entry["b"], 200);
  auto c = std::make_unique<Reader>(dir, options(cache, limit, "c"));
  CHECK(c->cache_stats().misses == 1);
  CHECK(c->cache_stats().fallbacks == 0);
  CHECK(fs::exists(entry["a"]));
  CHECK_FALSE(fs::exists(entry["b"]));
  CHECK(fs::exists(entry["c"]));
  // Nothing in use: b comes back and a, now the least recently used, goes.
  a.reset();
  c.reset();
  set_age(entry["a"], 300);
  set_age(entry["c"], 100);
  auto b = std::make_unique<Reader>(dir, options(cache, limit, "b"));
  CHECK(b->cache_stats().misses == 1);
  CHECK_FALSE(fs::exists(entry["a"]));
  CHECK(fs::exists(entry["b"]));
  CHECK(fs::exists(entry["c"]));
  // The admin's view and eviction (forge-data cache status | evict) agree: b is in use and stays.
  const auto listing = forge::data::list_cache(cache);
  REQUIRE(listing.entries.size() == 2);
  for (const auto& e : listing.entries)
    CHECK(e.in_use == (e.file == m.shards_of("train", "b").front()->file));
  const auto evicted = forge::data::evict_cache(cache, 0);
  CHECK(evicted.evicted == 1);
  CHECK(evicted.kept_in_use == 1);
  CHECK(fs::exists(entry["b"]));
  CHECK_FALSE(fs::exists(entry["c"]));
  require_clean(cache, m);
}

TEST_CASE("cache: a full, limited or read-only cache costs one warning and the shared copy is read") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  // Two shards of about 200 KB.
  const Manifest m = forge::test::make_fixture_dataset(dir, {{"big", {100000, 100000}, 1}});
  const std::string expected = read(dir, options()).digest;
  SECTION("a cache_max_bytes smaller than a shard") {
    CaptureLog log;
    const Read r = read(dir, options(tmp / "cache", 1000));
    CHECK(r.digest == expected);
    CHECK(r.stats.fallbacks == 2);
    CHECK(log.lines_with("data cache") == 1);
    CHECK(log.lines_with("no room") == 1);
    require_clean(tmp / "cache", m);
  }
  SECTION("a full filesystem (a 256 KiB tmpfs: one shard fits)") {
    Tmpfs small(tmp / "small", "256k", false);
    if (!small.ok()) {
      WARN("not run: cannot mount a tmpfs here (needs root)");
      return;
    }
    CaptureLog log;
    const Read r = read(dir, options(tmp / "small", uint64_t(1) << 40));
    CHECK(r.digest == expected);
    CHECK(r.stats.misses == 1);
    CHECK(r.stats.fallbacks == 1);
    CHECK(log.lines_with("data cache") == 1);
    CHECK(log.lines_with(std::strerror(ENOSPC)) == 1);
    require_clean(tmp / "small", m);
  }
  SECTION("a read-only filesystem") {
    Tmpfs ro(tmp / "ro", "1m", true);
    if (!ro.ok()) {
      WARN("not run: cannot mount a tmpfs here (needs root)");
      return;
    }
    CaptureLog log;
    const Read r = read(dir, options(tmp / "ro"));
    CHECK(r.digest == expected);
    CHECK(r.stats.fallbacks == 2);
    CHECK(log.lines_with("data cache") == 1);
    CHECK(log.lines_with(std::strerror(EROFS)) == 1);
  }
}
