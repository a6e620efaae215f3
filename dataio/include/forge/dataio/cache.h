// The node-local shard cache (docs/DATA.md, "Node-local cache"): copies of a dataset's shards on a node's
// own disk, staged at job start, verified against the manifest's xxh3, shared by the jobs of the node and
// kept across jobs, keyed by dataset version and shard path, evicted least recently used first.
//
// Processes share it through flock, two locks per entry: a stager holds the entry's stage lock (`.stage`)
// exclusively while it copies into a temporary name, verifies, fsyncs and renames into place; a reader
// holds the entry's lock (`.lock`) shared for as long as it reads, and eviction only takes entries whose
// lock it gets exclusively without waiting. (One lock for both deadlocks: a stager waiting for it
// exclusively waits forever behind a rank that found the entry staged and reads it for its whole job.) A
// stager killed mid-copy leaves a temporary file, never an entry. The cache never fails a job: a cache it
// cannot write (read-only, full) costs one warning line and the shared copy is read.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/manifest.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::data {

struct CacheOptions {
  std::string dir;  // node-local directory; "" = no cache
  // Bytes the entries may take, all dataset versions together; 0 = as much as leaves 10% of the
  // filesystem free.
  uint64_t max_bytes = 0;
};

// What one process's cache did, for the run's metrics and summary.
struct CacheStats {
  uint64_t hits = 0;          // shards read from an entry this process did not stage
  uint64_t misses = 0;        // shards this process staged (absent when it looked)
  uint64_t fallbacks = 0;     // shards read from the shared copy because the cache could not serve them
  uint64_t bytes_staged = 0;  // bytes this process copied into the cache
  double staging_s = 0;       // wall time in ShardCache::open, waits on other stagers included
  Json to_json() const;
};

// One process's use of the cache for one dataset. Entries it opened stay locked (shared) until it is
// destroyed, so no eviction removes a file it reads.
class ShardCache {
 public:
  ShardCache(const CacheOptions& options, const Manifest& manifest, std::string dataset_dir);
  ~ShardCache();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  // For each entry, the directory to read its `file` from: the cache's copy (staged first when absent, or
  // waited for while another process stages it) or, when the cache cannot serve it, the dataset
  // directory. The ranks of a node start at different shards, so they stage in parallel. Throws nothing
  // for the cache's own trouble.
  std::vector<std::string> open(std::span<const ShardEntry* const> entries);
  // A cached copy that failed the reader's checks (`why`): warns, drops the entry unless another process
  // holds it, counts a fallback and returns the dataset directory.
  std::string reject(const ShardEntry& entry, const std::string& why);
  const CacheStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The admin's view (forge-data cache status | evict).
struct CacheEntryInfo {
  std::string version, file;  // dataset version, shard path in the dataset
  uint64_t bytes = 0;
  double idle_s = 0;    // since its last use
  bool in_use = false;  // some process holds its lock
};
struct CacheListing {
  std::vector<CacheEntryInfo> entries;            // least recently used first
  uint64_t partial_files = 0, partial_bytes = 0;  // temporary files of stagers (running or killed)
};
CacheListing list_cache(const std::string& dir);

struct EvictResult {
  uint64_t evicted = 0, evicted_bytes = 0, kept_in_use = 0, stale_partials = 0;
};
// Evicts entries not in use, least recently used first, until the entries take at most `keep_bytes`
// (only those of dataset `version` when it is not empty), and removes stale temporary files.
EvictResult evict_cache(const std::string& dir, uint64_t keep_bytes, const std::string& version = "");

}  // namespace forge::data
