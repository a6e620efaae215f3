// The node-local shard cache against the shared copy, in one run: how fast a job's reader opens (reads and
// verifies) its shards from each. Every open reads each shard's bytes whole (the xxh3 check) and maps them.
// Usage: bench_cache [DIR] [MTOKENS]
// DIR is scratch space (default /tmp/forge-bench-cache): DIR/shared is the dataset (MTOKENS million uint16
// tokens, default 128 = 256 MiB), DIR/cache the cache. "Cold" drops the page cache first (root only; said
// when it cannot), so the bytes come from the disk; "hot" reads them from the page cache.
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/synthetic.h"
#include "synthetic_dataset.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

namespace fs = std::filesystem;
using namespace forge::data;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes back dirty pages and empties the page cache; false when this process may not.
bool drop_page_cache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  return f.good();
}

// Seconds to open a reader (every shard read, verified and mapped), and what its cache did.
std::pair<double, CacheStats> open_reader(const std::string& dir, const std::string& cache) {
  ReaderOptions o;
  o.seq_len = 1024;
  o.global_batch = 8;
  o.prefetch = 0;
  o.cache = {cache, 0};
  const double t0 = now();
  Reader r(dir, o);
  return {now() - t0, r.cache_stats()};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/forge-bench-cache";
  const uint64_t tokens = uint64_t(argc > 2 ? std::stod(argv[2]) : 128.0) * 1000000ull;
  const std::string shared = dir + "/shared", cache = dir + "/cache";
  fs::remove_all(dir);
  forge::bench::write_synthetic_dataset(shared, tokens, 32000, 16ull << 20);
  const Manifest m = load_manifest(shared);
  uint64_t bytes = 0;
  for (const auto& s : m.shards) bytes += s.bytes;
  const double mib = double(bytes) / double(1 << 20);
  const bool cold = drop_page_cache();
  if (!cold) fmt::print("page cache NOT dropped (not root?): the cold figures below are from memory\n");
  const auto [shared_cold, s0] = open_reader(shared, "");
  const auto [shared_hot, s1] = open_reader(shared, "");
  drop_page_cache();
  const auto [staging, st] = open_reader(shared, cache);
  const auto [hit_hot, h0] = open_reader(shared, cache);
  drop_page_cache();
  const auto [hit_cold, h1] = open_reader(shared, cache);
  if (st.misses != m.shards.size() || h0.hits != m.shards.size() || h1.hits != m.shards.size())
    fmt::print("unexpected cache counts: staged {}, hits {} and {} of {} shards\n", st.misses, h0.hits,
               h1.hits, m.shards.size());
  const auto rate = [&](double s) { return mib / s; };
  fmt::print("{} shards, {:.0f} MiB; reader open = read + xxh3-verify + map every shard\n", m.shards.size(),
             mib);
  fmt::print("  shared copy, cold:          {:8.0f} MiB/s  ({:.2f} s)\n", rate(shared_cold), shared_cold);
  fmt::print("  shared copy, hot:           {:8.0f} MiB/s  ({:.2f} s)\n", rate(shared_hot), shared_hot);
  fmt::print("  staging (cold shared read, copy, fsync, then open): {:.0f} MiB/s ({:.2f} s)\n", rate(staging),
             staging);
  fmt::print("  cache hit, hot:             {:8.0f} MiB/s  ({:.2f} s)\n", rate(hit_hot), hit_hot);
  fmt::print("  cache hit, cold:            {:8.0f} MiB/s  ({:.2f} s)\n", rate(hit_cold), hit_cold);
  fmt::print("ratio cache hit (hot) / shared copy (cold): {:.2f}\n", shared_cold / hit_hot);
  fmt::print("ratio cache hit (cold) / shared copy (cold): {:.2f} (same disk here: ~1 expected)\n",
             shared_cold / hit_cold);
  fs::remove_all(dir);
  return 0;
}
