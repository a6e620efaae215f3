#include "forge/common/json.h"

#include "forge/common/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace forge {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ExitCode::kIo, "cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json read_json(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail(ExitCode::kData, "'{}' is not valid JSON (byte {}): {}", path, e.byte, e.what());
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(ExitCode::kIo, "cannot open directory '{}': {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(ExitCode::kIo, "fsync of directory '{}' failed: {}", dir, std::strerror(err));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const auto give_up = [&](const char* what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(ExitCode::kIo, "cannot write '{}' ({} failed: {})", path, what, std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) give_up("open");
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      give_up("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    give_up("fsync");
  }
  if (::close(fd) != 0) give_up("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) give_up("rename");
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

void write_json_atomic(const std::string& path, const Json& doc) {
  write_file_atomic(path, doc.dump(2) + "\n");
}

}  // namespace forge
