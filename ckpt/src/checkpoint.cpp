#include "forge/ckpt/checkpoint.h"

#include "index.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace forge::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxSpan = 256u << 20;

std::string file_text(const fs::path& p, const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' is missing", dir, p.filename().string());
  return read_file(p.string());
}

// A data file of the checkpoint that is gone (a rank's shard that never arrived or was removed): the
// damage, named by what it held, so the message says which weights are lost, not only which file.
[[noreturn]] void missing(const std::string& dir, const std::string& name,
                          const std::map<std::string, TensorEntry>& tensors) {
  std::string held;
  size_t pieces = 0;
  for (const auto& [tensor, entry] : tensors)
    for (const StoredPiece& piece : entry.pieces)
      if (piece.file == name && !piece.runs.empty() && pieces++ == 0)
        held = fmt::format("; it held tensor '{}' elements {} to {}", tensor,
                           coords_of(entry.shape, piece.runs.front().lo),
                           coords_of(entry.shape, piece.runs.back().hi - 1));
  if (pieces > 1) held += fmt::format(" and {} more piece(s)", pieces - 1);
  fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' is missing{}", dir, name, held);
}

class Files {
 public:
  Files(const std::string& dir, const std::map<std::string, TensorEntry>& tensors)
      : dir_(dir), tensors_(tensors) {}
  ~Files() {
    for (auto& [name, fd] : fds_) ::close(fd);
  }
  // Reads exactly `size` bytes at `offset`; a short file is damage, not an I/O error.
  void read(const std::string& name, uint64_t offset, void* out, uint64_t size) {
    const int fd = open(name);
    char* p = static_cast<char*>(out);
    while (size > 0) {
      const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(ExitCode::kIo, "cannot read '{}/{}': {}", dir_, name, std::strerror(errno));
      if (n == 0)
        fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' is shorter than its index says (truncated)",
             dir_, name);
      p += n;
      offset += static_cast<uint64_t>(n);
      size -= static_cast<uint64_t>(n);
    }
  }

 private:
  int open(const std::string& name) {
    auto it = fds_.find(name);
    if (it != fds_.end()) return it->second;
    const std::string path = (fs::path(dir_) / name).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) missing(dir_, name, tensors_);
    if (fd < 0) fail(ExitCode::kIo, "cannot read '{}': {}", path, std::strerror(errno));
    fds_[name] = fd;
    return fd;
  }
  std::string dir_;
  const std::map<std::string, TensorEntry>& tensors_;
  std::map<std::string, int> fds_;
};

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      fail(ExitCode::kIo, "checkpoint directory '{}': cannot read it: {}", dir, ec.message());
    fail(ExitCode::kUsage, "no checkpoint directory '{}'", dir);
  }
  DirLock lock = DirLock::shared(dir);
  if (!lock.still_at(dir))
    fail(ExitCode::kData, "checkpoint '{}' was replaced or removed while opening it", dir);
  Checkpoint c(dir, std::move(lock));
  const fs::path p(dir);
  if (!fs::exists(p / kCommittedFile, ec))
    fail(ExitCode::kData,
         "'{}' is not a committed checkpoint (no {}): an interrupted save; `forge-ckpt gc` removes it", dir,
         kCommittedFile);
  const std::string committed = read_file((p / kCommittedFile).string());
  const std::string manifest_text = file_text(p / kManifestFile, dir);
  const std::string hash = xxh3_64_hex(manifest_text);
  if (committed.find(hash) == std::string::npos)
    fail(ExitCode::kData,
         "checkpoint '{}' is damaged: '{}' does not match the checksum recorded in {} (xxh3 {})", dir,
         kManifestFile, kCommittedFile, hash);
  Json mj;
  try {
    mj = Json::parse(manifest_text);
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' is not JSON: {}", dir, kManifestFile, e.what());
  }
  c.manifest_ = Manifest::from_json(mj, (p / kManifestFile).string());
  const auto entry = c.manifest_.files.find(kIndexFile);
  if (entry == c.manifest_.files.end())
    fail(ExitCode::kData, "checkpoint '{}' is damaged: its manifest lists no {}", dir, kIndexFile);
  const std::string index_text = file_text(p / kIndexFile, dir);
  if (index_text.size() != entry->second.bytes || xxh3_64_hex(index_text) != entry->second.xxh3)
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' does not match its checksum", dir, kIndexFile);
  try {
    c.tensors_ = detail::index_from_json(Json::parse(index_text), (p / kIndexFile).string());
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' is not JSON: {}", dir, kIndexFile, e.what());
  }
  return c;
}

uint64_t Checkpoint::bytes() const {
  uint64_t total = 0;
  for (const auto& [name, f] : manifest_.files) total += f.bytes;
  return total;
}

void Checkpoint::read(const std::vector<TensorRequest>& requests) const {
  Files files(dir_, tensors_);
  struct Cut {
    uint64_t dst, src, n;  // bytes
  };
  for (const auto& req : requests) {
    const Slice want = req.slice.normalized();
    const auto it = tensors_.find(want.name);
    if (it == tensors_.end())
      fail(ExitCode::kData, "checkpoint '{}' has no tensor '{}' ({} tensors; see `forge-ckpt inspect`)", dir_,
           want.name, tensors_.size());
    const TensorEntry& t = it->second;
    if (t.dtype != want.dtype || t.shape != want.shape)
      fail(ExitCode::kData, "tensor '{}': the checkpoint holds {} {}, the model asks for {} {}", want.name,
           dtype_name(t.dtype), fmt::format("{}", t.shape), dtype_name(want.dtype),
           fmt::format("{}", want.shape));
    const uint64_t esize = dtype_size(t.dtype);
    const auto want_runs = runs_of(want);
    int64_t covered = 0;
    char* out = static_cast<char*>(req.data);
    for (const StoredPiece& piece : t.pieces) {
      std::vector<Cut> cuts;
      intersect_runs(want_runs, piece.runs, [&](int64_t lo, int64_t hi, int64_t at_want, int64_t at_piece) {
        cuts.push_back(Cut{static_cast<uint64_t>(at_want) * esize, static_cast<uint64_t>(at_piece) * esize,
                           static_cast<uint64_t>(hi - lo) * esize});
        covered += hi - lo;
      });
      if (cuts.empty()) continue;
      const uint64_t first = cuts.front().src, last = cuts.back().src + cuts.back().n;
      if (cuts.size() > 8 && last - first <= kMaxSpan) {
        // Many short runs (a column slice of a row-sharded piece): one read, then copies.
        std::vector<char> span(last - first);
        files.read(piece.file, piece.at + first, span.data(), span.size());
        for (const Cut& c : cuts) std::memcpy(out + c.dst, span.data() + (c.src - first), c.n);
      } else {
        for (const Cut& c : cuts) files.read(piece.file, piece.at + c.src, out + c.dst, c.n);
      }
    }
    if (covered != want.elements())
      fail(ExitCode::kData, "tensor '{}': checkpoint '{}' covers {} of the {} elements asked for", want.name,
           dir_, covered, want.elements());
  }
}

std::string Checkpoint::verification_bytes() const {
  if (!manifest_.files.count(kVerifyBatchFile)) return {};
  return file_text(fs::path(dir_) / kVerifyBatchFile, dir_);
}

void Checkpoint::verify(int part, int parts) const {
  int i = 0;
  for (const auto& entry : manifest_.files)
    if (i++ % parts == part) verify_file(entry.first);
}

std::string Checkpoint::verify_file(const std::string& name) const {
  const auto it = manifest_.files.find(name);
  if (it == manifest_.files.end()) return "";
  const fs::path p = fs::path(dir_) / name;
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) missing(dir_, name, tensors_);
  if (size != it->second.bytes)
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' has {} bytes, the manifest says {}", dir_, name,
         size, it->second.bytes);
  const std::string h = xxh3_file_hex(p.string());
  if (h != it->second.xxh3)
    fail(ExitCode::kData, "checkpoint '{}' is damaged: '{}' has xxh3 {}, the manifest says {}", dir_, name, h,
         it->second.xxh3);
  return p.string();
}

std::string run_dir_of(const std::string& checkpoint_dir) {
  fs::path p = fs::path(checkpoint_dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.parent_path().parent_path().parent_path().string();
}

}  // namespace forge::ckpt
