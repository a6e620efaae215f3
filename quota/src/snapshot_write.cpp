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
  // The plugin (any user) must reach and read the snapshot from the moment it is renamed into place:
  // directories made here 0755 and the file 0644, whatever the umask (forge-quota runs under 007 for the
  // ledger's sake, which would hide both).
  struct Umask022 {
    mode_t before = ::umask(022);
    ~Umask022() { ::umask(before); }
  } umask022;
  const auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  write_file_atomic(path, snapshot_to_json(s));
  if (::chmod(path.c_str(), 0644) != 0)  // as created; explicit should write_file_atomic change
    fail(ExitCode::kIo, "cannot make '{}' world-readable: {}", path, std::strerror(errno));
}

}  // namespace forge::quota
