#include "fs.h"

#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/json.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

namespace forge::ckpt::detail {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_error(const std::string& path, const char* what, int err) {
  if (err == ENOSPC || err == EDQUOT)
    fail(ExitCode::kIo,
         "cannot write '{}': the disk is full ({} failed: {}); free space or lower ckpt.recovery_keep", path,
         what, std::strerror(err));
  fail(ExitCode::kIo, "cannot write '{}' ({} failed: {})", path, what, std::strerror(err));
}

}  // namespace

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error(path, "write", errno);
    if (n == 0) io_error(path, "write", ENOSPC);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void fsync_or_throw(int fd, const std::string& path) {
  if (::fsync(fd) != 0) io_error(path, "fsync", errno);
}

std::string write_new_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_error(path, "open", errno);
  try {
    write_all(fd, bytes.data(), bytes.size(), path);
    fsync_or_throw(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) io_error(path, "close", errno);
  return xxh3_64_hex(bytes);
}

void publish_dir(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    fsync_dir(fs::path(to).parent_path().string());
    return;
  }
  if (errno != EEXIST) io_error(to, "rename", errno);
  // A checkpoint of this step exists (a run resumed from an older one and got here again). Swap only
  // when nobody reads it.
  auto lock = DirLock::try_exclusive(to);
  if (!lock) fail(ExitCode::kIo, "cannot replace '{}': another process is reading it", to);
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0)
    io_error(to, "rename (exchange)", errno);
  fsync_dir(fs::path(to).parent_path().string());
  remove_tree(from);  // now the replaced checkpoint
}

void remove_tree(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::string random_nonce() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  return to_hex64(v);
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string committed_text(const std::string& manifest_xxh3) {
  return "forge-ckpt committed; manifest.json xxh3 " + manifest_xxh3 + "\n";
}

}  // namespace forge::ckpt::detail
