// One process writing a whole checkpoint piece by piece: imports and conversions, which stream a model
// from elsewhere and never hold it in memory. The result is an ordinary committed checkpoint (one part
// file, index.json, manifest.json, COMMITTED) that appears under its name only when complete, as a
// Saver's does: it is written in a locked staging directory next to it and renamed.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/manifest.h"
#include "forge/ckpt/policy.h"
#include "forge/ckpt/slice.h"
#include "forge/ckpt/store.h"
#include "forge/common/hash.h"

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace forge::ckpt {

class CheckpointWriter {
 public:
  // Fills `out` with the piece's row-major elements [first, first + out.size() / dtype size).
  using Fill = std::function<void(int64_t first, std::span<std::byte> out)>;

  // Stages the checkpoint directory `dir`. An existing `dir` that is not empty is kUsage unless
  // `replace`: then commit() swaps it in one rename.
  CheckpointWriter(std::string dir, bool replace);
  ~CheckpointWriter();  // not committed: the staging directory is removed
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends a piece of a logical tensor (a hyperslab; pieces of one tensor share its dtype and shape),
  // filled in chunks of a few MiB.
  void add(const Slice& piece, const Fill& fill);
  // A file kept with the checkpoint (listed in its manifest and verified like the rest), e.g. a tokenizer.
  void add_file(const std::string& name, std::string_view bytes);
  // Checks that the pieces cover every tensor exactly once (kUsage naming the tensor otherwise), writes
  // index.json, manifest.json and COMMITTED, and publishes the directory.
  void commit(Tier tier, const CheckpointMeta& meta, const Json& promotion = Json());

  const std::string& staging() const { return staging_; }

 private:
  std::string dir_, staging_;
  std::optional<DirLock> lock_;
  int fd_ = -1;
  uint64_t written_ = 0;
  Xxh3Stream xxh3_;
  std::vector<std::byte> buffer_;  // one chunk, reused
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, FileEntry> files_;
  bool committed_ = false;
};

}  // namespace forge::ckpt
