// manifest.json: what a checkpoint is (step, layout, spec, data position, checksums). Written last, so
// its presence and COMMITTED's reference to its hash mark a complete checkpoint.
#pragma once

#include "forge/common/json.h"
#include "forge/common/layout.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace forge::ckpt {

inline constexpr int kFormatVersion = 1;

// What the caller tells a save. Fields the checkpoint module checks are typed; the others are stored as
// given (the data cursor and RNG streams belong to the reader and the trainer).
struct CheckpointMeta {
  int64_t step = 0;
  int64_t tokens = 0;
  double loss = 0.0;  // non-finite values are stored as null and read back as NaN
  std::string spec_hash;
  std::string dataset_version;
  Layout layout;
  Json model_config = Json::object();  // compared against the resuming job's model config
  Json data_cursor;                    // opaque
  Json rng;                            // opaque
  // The post-load verification step: how to rebuild the saved batch (opaque) and the loss it gave; the
  // launcher runs it. Raw batch bytes, if any, are stored as the file verify-batch.bin.
  Json verification;
  std::string verification_bytes;
  Json extra = Json::object();
};

struct FileEntry {
  uint64_t bytes = 0;
  std::string xxh3;
};

struct Manifest {
  int format = kFormatVersion;
  std::string tier;
  CheckpointMeta meta;  // meta.verification_bytes stays in its file
  int world_size = 1;   // ranks that wrote it
  double created_unix = 0;
  double stall_s = 0;  // the training loop's wait for this save
  double write_s = 0;  // background write until commit
  std::map<std::string, FileEntry> files;
  Json promotion;  // release tier: {"source", "verdict", "promoted_unix"}

  Json to_json() const;
  // `where` names the file in errors (forge::Error(kData)).
  static Manifest from_json(const Json& j, const std::string& where);
};

// What a resuming job requires of a checkpoint. Unset fields are not checked.
struct Expectations {
  std::optional<Json> model_config;
  std::optional<std::string> dataset_version;
};

// Differences between two JSON documents as "path: checkpoint X, expected Y" lines.
std::vector<std::string> json_differences(const Json& have, const Json& want, const std::string& path = "");

// Throws forge::Error naming every difference: kUsage (64) for another model config (the spec does not
// fit this checkpoint), kData (65) for another dataset version.
void check_expectations(const Manifest& manifest, const Expectations& expect, const std::string& where);

}  // namespace forge::ckpt
