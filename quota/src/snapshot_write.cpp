// Writing the snapshot is `forge-quota sync`'s job; it lives apart from reading it so the SPANK
// plugin, which only reads, carries none of the file-writing code.
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/quota/snapshot.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace forge::quota {

void write_snapshot(const std::string& path, const UsageSnapshot& s) {
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  write_file_atomic(path, snapshot_to_json(s));
  // write_file_atomic creates with 0644 under the umask; the plugin needs world-readable regardless.
  if (::chmod(path.c_str(), 0644) != 0)
    fail(ExitCode::kIo, "cannot make '{}' world-readable: {}", path, std::strerror(errno));
}

}  // namespace forge::quota
