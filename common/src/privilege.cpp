#include "forge/common/privilege.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace forge::privilege {
namespace {

mode_t g_caller_umask = 022;

}  // namespace

void init_umask() {
  g_caller_umask = ::umask(007);
}

mode_t caller_umask() {
  return g_caller_umask;
}

bool privileged() {
  return ::getauxval(AT_SECURE) != 0;
}

void drop_group() {
  if (!privileged()) return;
  const gid_t gid = ::getgid();
  if (::setresgid(gid, gid, gid) != 0)
    fail(ExitCode::kIo, "cannot give up the setgid group: {}", std::strerror(errno));
}

AsCaller::AsCaller() : umask_(::umask(g_caller_umask)) {
  if (!privileged()) return;
  egid_ = ::getegid();
  if (egid_ == ::getgid()) return;  // given up already
  if (::setresgid(static_cast<gid_t>(-1), ::getgid(), static_cast<gid_t>(-1)) != 0) {
    const int err = errno;
    ::umask(umask_);
    fail(ExitCode::kIo, "cannot act as the calling user (effective gid {}): {}", ::getgid(),
         std::strerror(err));
  }
  switched_ = true;
}

AsCaller::~AsCaller() {
  // The saved gid is the group: taking it back cannot fail, and if it did this process would only hold
  // less than before (the registry then refuses it, as it would the caller).
  if (switched_ && ::setresgid(static_cast<gid_t>(-1), egid_, static_cast<gid_t>(-1)) != 0) {
  }
  ::umask(umask_);
}

std::string resolved(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const std::string ra = resolved(a), rb = resolved(b);
  return !ra.empty() && ra == rb;
}

void check_system_path(std::string_view program, std::string_view what, const std::string& system,
                       const std::string& given) {
  if (given.empty() || same_file(given, system)) return;
  fail(ExitCode::kUsage, "{} runs setgid: it uses only the system {} {}, not '{}'", program, what, system,
       printable(given, 256));
}

void require_root_owned_db(std::string_view program, std::string_view noun, const std::string& path,
                           std::string_view how) {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string file = path + suffix;
    struct stat st {};
    const bool exists = ::lstat(file.c_str(), &st) == 0;
    const int err = errno;
    if (exists && S_ISREG(st.st_mode) && st.st_uid == 0) continue;
    const std::string why = !exists
                                ? (err == ENOENT ? std::string("does not exist")
                                                 : fmt::format("cannot be examined ({})", std::strerror(err)))
                                : fmt::format("is not a regular file owned by root (uid {})", st.st_uid);
    fail(ExitCode::kIo,
         "{} runs setgid: the {} file {} {}; root creates the {} and its -wal and -shm files by running '{}' "
         "(the unprivileged binary)",
         program, noun, file, why, noun, how);
  }
}

}  // namespace forge::privilege
