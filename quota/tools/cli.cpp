#include "cli.h"

#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/privilege.h"
#include "forge/common/text.h"
#include "forge/quota/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>

#ifndef FORGE_SYSTEM_POLICY
#define FORGE_SYSTEM_POLICY "/etc/forge/quota.ini"
#endif

namespace forge::quota::cli {
namespace {

using privilege::privileged;
using privilege::same_file;

// A setgid forge-quota may be handed paths to the group's files (the ledger); it uses only the ones the
// system policy names (forge/common/privilege.h).
void check_system_path(const char* what, const std::string& system, const std::string& given) {
  privilege::check_system_path("forge-quota", what, system, given);
}

}  // namespace

int64_t now_s() {
  return static_cast<int64_t>(std::time(nullptr));
}

void check_command_allowed(const std::string& command) {
  if (!privileged()) return;
  static const char* const kAllowed[] = {"request", "approve", "deny",         "report",
                                         "status",  "admit",   "check-policy", "layout"};
  for (const char* c : kAllowed)
    if (command == c) return;
  if (command == "apply" || command == "sync")
    fail(
        ExitCode::kUsage,
        "forge-quota runs setgid: '{}' needs the unprivileged forge-quota (not the setgid copy), run by root",
        command);
  fail(ExitCode::kUsage, "forge-quota runs setgid: '{}' is not one of its commands", printable(command));
}

std::string default_policy_path() {
  if (const char* env = std::getenv("FORGE_QUOTA_POLICY"); env && *env) return env;
  return FORGE_SYSTEM_POLICY;
}

Policy load_run_policy(const std::string& given) {
  if (!privileged()) return load_policy(given);
  const std::string system = FORGE_SYSTEM_POLICY;
  if (!same_file(given, system))
    fail(ExitCode::kUsage, "forge-quota runs setgid: it reads only the system policy {}, not '{}'", system,
         printable(given, 256));
  // Read through one descriptor that was checked, so the file checked is the file read.
  const int fd = ::open(system.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ExitCode::kUsage, "cannot read the system policy '{}': {}", system, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0) {
    ::close(fd);
    fail(ExitCode::kUsage,
         "forge-quota runs setgid: the system policy {} must be a file owned by root and writable by no one "
         "else (it is uid {}, mode {:o}); fix it with chown root {} && chmod go-w {}",
         system, st.st_uid, st.st_mode & 07777, system, system);
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(ExitCode::kUsage, "cannot read the system policy '{}': {}", system, std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return parse_policy(text, system);
}

std::string ledger_path(const Policy& policy, const std::string& given) {
  if (!privileged()) return given.empty() ? policy.ledger_path : given;
  check_system_path("ledger", policy.ledger_path, given);
  // A ledger file a user owns could be written past forge-quota: the files must be root's, and exist,
  // since SQLite would create a missing -wal or -shm owned by this user (docs/ADMISSION.md).
  privilege::require_root_owned_db("forge-quota", "ledger", policy.ledger_path, "forge-quota sync");
  return policy.ledger_path;
}

std::string snapshot_path(const Policy& policy, const std::string& given) {
  if (privileged()) check_system_path("snapshot", policy.snapshot_path, given);
  return given.empty() ? policy.snapshot_path : given;
}

Identity caller() {
  return identity_of_uid(::getuid());
}

bool sees_all(const Policy& policy, const Identity& who) {
  return ::getuid() == 0 || policy.is_admin(who);
}

std::vector<std::string> visible_teams(const Policy& policy, const Identity& who) {
  std::vector<std::string> out;
  for (const auto& [name, team] : policy.teams)
    if (sees_all(policy, who) || policy.sees_team(who, team)) out.push_back(name);
  return out;
}

std::string filter_note(const std::vector<std::string>& teams) {
  if (teams.empty()) return "(showing no teams: you belong to and approve for none; admins see all)";
  return fmt::format("(showing teams {}; admins see all)", fmt::join(teams, ", "));
}

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    return;
  }
  // The file is the caller's: written with their rights and umask, never with the setgid group's.
  privilege::drop_group();
  ::umask(privilege::caller_umask());
  write_file_atomic(path, text);  // a reader (a browser, node_exporter) never sees half a file
}

}  // namespace forge::quota::cli
