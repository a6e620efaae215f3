// `forge-data verify`: every check a dataset must pass, each failure a forge::Error(kData) naming the
// file and what differs.
#pragma once

#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"

#include <cstdint>
#include <string>

namespace forge::data {

// One shard against its manifest entry: size, xxh3 (when `checksum`), HDF5 structure and attributes.
ShardLayout check_shard(const std::string& dataset_dir, const Manifest& manifest, const ShardEntry& entry,
                        bool checksum);

struct VerifyResult {
  uint64_t shards = 0, tokens = 0, documents = 0;
};

// Manifest version, tokenizer file hash, every shard (checksum, structure, document offsets, token range).
VerifyResult verify_dataset(const std::string& dataset_dir);

}  // namespace forge::data
