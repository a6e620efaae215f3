// Reading a committed checkpoint: its manifest, its tensor index, pieces of its logical tensors for any
// layout, and verification of every file against the manifest's checksums.
#pragma once

#include "forge/ckpt/manifest.h"
#include "forge/ckpt/slice.h"
#include "forge/ckpt/store.h"

#include <map>
#include <string>
#include <vector>

namespace forge::ckpt {

// A stored piece: a slice of a logical tensor at byte `at` of a data file of the checkpoint.
struct StoredPiece {
  Slice slice;  // normalized
  std::string file;
  uint64_t at = 0;
  std::vector<Run> runs;
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<StoredPiece> pieces;
};

// A piece the caller wants, in the new layout's terms, and where its row-major elements go.
struct TensorRequest {
  Slice slice;
  void* data = nullptr;
};

class Checkpoint {
 public:
  // Opens a committed checkpoint and holds a shared lock on it until destroyed, so retention skips it.
  // Throws forge::Error(kData) naming the file when COMMITTED, the manifest or the index is missing,
  // does not match its checksum, or describes tensors that are not exactly covered by their pieces.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  uint64_t bytes() const;  // all files listed in the manifest

  // Fills every request from the stored pieces that overlap it. Throws forge::Error(kData) naming the
  // tensor when it is absent or has another dtype or shape; kIo on read errors.
  void read(const std::vector<TensorRequest>& requests) const;

  // The raw verification batch saved with the checkpoint (empty when none).
  std::string verification_bytes() const;

  // Checks size and xxh3 of the manifest's files number part, part + parts, ... (all by default).
  // Throws forge::Error(kData) naming the checkpoint and the first damaged or missing file.
  void verify(int part = 0, int parts = 1) const;
  // The same for one file the manifest lists; returns its path, "" when the manifest lists no such file.
  std::string verify_file(const std::string& name) const;

 private:
  Checkpoint(std::string dir, DirLock lock) : dir_(std::move(dir)), lock_(std::move(lock)) {}
  std::string dir_;
  DirLock lock_;
  Manifest manifest_;
  std::map<std::string, TensorEntry> tensors_;
};

// The run directory a checkpoint directory belongs to (<run>/checkpoints/<tier>/step-N).
std::string run_dir_of(const std::string& checkpoint_dir);

}  // namespace forge::ckpt
