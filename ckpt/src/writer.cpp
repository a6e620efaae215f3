#include "forge/ckpt/writer.h"

#include "fs.h"
#include "index.h"
#include "plan.h"

#include "forge/common/error.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

namespace forge::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 8 << 20;

}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, bool replace) : dir_(std::move(dir)) {
  std::error_code ec;
  if (fs::exists(dir_, ec) && !(fs::is_directory(dir_, ec) && fs::is_empty(dir_, ec)) && !replace)
    fail(ExitCode::kUsage,
         "'{}' exists and is not empty: choose another --out, or give --force to replace it", dir_);
  fs::path final_path = fs::absolute(dir_).lexically_normal();
  if (!final_path.has_filename()) final_path = final_path.parent_path();
  dir_ = final_path.string();
  fs::create_directories(final_path.parent_path(), ec);
  staging_ = (final_path.parent_path() /
              fmt::format(".{}.partial-{}", final_path.filename().string(), detail::random_nonce()))
                 .string();
  if (!fs::create_directory(staging_, ec))
    fail(ExitCode::kIo, "cannot create '{}': {}", staging_, ec ? ec.message() : "it exists");
  lock_ = DirLock::try_exclusive(staging_);
  const std::string part = (fs::path(staging_) / detail::part_file_name(0)).string();
  fd_ = ::open(part.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    detail::remove_tree(staging_);
    fail(ExitCode::kIo, "cannot create '{}': {}", part, std::strerror(errno));
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) detail::remove_tree(staging_);
}

void CheckpointWriter::add(const Slice& given, const Fill& fill) {
  const Slice piece = given.normalized();
  auto [it, fresh] = tensors_.try_emplace(piece.name);
  TensorEntry& t = it->second;
  if (fresh) {
    t.name = piece.name;
    t.dtype = piece.dtype;
    t.shape = piece.shape;
  } else if (t.dtype != piece.dtype || t.shape != piece.shape) {
    fail(ExitCode::kUsage, "tensor '{}': a piece of {} {} after pieces of {} {}", piece.name,
         dtype_name(piece.dtype), fmt::format("{}", piece.shape), dtype_name(t.dtype),
         fmt::format("{}", t.shape));
  }
  const std::string part = detail::part_file_name(0);
  static const std::byte zeros[detail::kPieceAlign] = {};
  const uint64_t at = detail::align_up(written_);
  detail::write_all(fd_, zeros, at - written_, part);
  xxh3_.update(zeros, at - written_);
  const size_t esize = dtype_size(piece.dtype);
  const int64_t n = piece.elements();
  buffer_.resize(kChunk);
  for (int64_t first = 0; first < n;) {
    const int64_t k = std::min<int64_t>(n - first, static_cast<int64_t>(kChunk / esize));
    const std::span<std::byte> out(buffer_.data(), static_cast<size_t>(k) * esize);
    fill(first, out);
    detail::write_all(fd_, out.data(), out.size(), part);
    xxh3_.update(out.data(), out.size());
    first += k;
  }
  written_ = at + piece.bytes();
  t.pieces.push_back({piece, part, at, runs_of(piece)});
}

void CheckpointWriter::add_file(const std::string& name, std::string_view bytes) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' || name == kIndexFile ||
      name == kManifestFile || name == kCommittedFile || name == detail::part_file_name(0))
    fail(ExitCode::kUsage, "'{}' cannot be a file of a checkpoint", name);
  files_[name] = FileEntry{bytes.size(), detail::write_new_file((fs::path(staging_) / name).string(), bytes)};
}

void CheckpointWriter::commit(Tier tier, const CheckpointMeta& meta, const Json& promotion) {
  for (const auto& [name, t] : tensors_)
    detail::check_coverage(t, ExitCode::kUsage, [&](size_t i) { return fmt::format("piece {}", i); });
  const std::string part = detail::part_file_name(0);
  detail::fsync_or_throw(fd_, part);
  ::close(fd_);
  fd_ = -1;
  Manifest m;
  m.files = files_;
  m.files[part] = FileEntry{written_, xxh3_.hex()};
  const std::string index = detail::index_to_json(tensors_).dump() + "\n";
  m.files[kIndexFile] =
      FileEntry{index.size(), detail::write_new_file((fs::path(staging_) / kIndexFile).string(), index)};
  m.tier = std::string(tier_name(tier));
  m.meta = meta;
  m.meta.verification_bytes.clear();
  m.created_unix = detail::now_unix();
  m.promotion = promotion;
  const std::string manifest = m.to_json().dump(2) + "\n";
  write_file_atomic((fs::path(staging_) / kManifestFile).string(), manifest);
  detail::write_new_file((fs::path(staging_) / kCommittedFile).string(),
                         detail::committed_text(xxh3_64_hex(manifest)));
  fsync_dir(staging_);
  lock_.reset();
  detail::publish_dir(staging_, dir_);
  committed_ = true;
}

}  // namespace forge::ckpt
