// The privilege model of the tools installed setgid so that users write a group's database only through
// them: forge-quota (the ledger; docs/ADMISSION.md, "Privilege model") and forge-ckpt (the model registry;
// docs/CHECKPOINTS.md, "Registry"). Such a tool runs privileged (AT_SECURE), uses only its compile-time
// system files, wants them created by root beforehand, and writes the caller's own files as the caller.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace forge::privilege {

// Called first thing: umask 007 (files made in the group's setgid directory stay group-writable); the
// caller's umask is kept for the files written for the caller (caller_umask, AsCaller).
void init_umask();
mode_t caller_umask();

// True when the kernel started us with privileges we must not lend (AT_SECURE: setgid or setuid, even
// when root runs it).
bool privileged();

// Gives the setgid group up for good (real, effective and saved gid = the real gid); kIo when the kernel
// refuses. A no-op when not privileged.
void drop_group();

// While alive, files are made as the caller: the effective gid is the real gid (when privileged; the
// saved gid keeps the group, which comes back afterwards) and the umask is the caller's. For what is the
// caller's, not the group's: a copy, an export, an output file.
class AsCaller {
 public:
  AsCaller();
  ~AsCaller();
  AsCaller(const AsCaller&) = delete;
  AsCaller& operator=(const AsCaller&) = delete;

 private:
  mode_t umask_;
  gid_t egid_ = 0;
  bool switched_ = false;
};

// The file a path names after every symlink, or "" when it does not resolve.
std::string resolved(const std::string& path);
// The same path, or two paths that resolve to the same file.
bool same_file(const std::string& a, const std::string& b);

// A privileged tool may be handed paths to the group's files; it uses only the system's. Unless `given`
// is empty or the same file as `system`: kUsage, "<program> runs setgid: it uses only the system <what>
// <system>, not '<given>'".
void check_system_path(std::string_view program, std::string_view what, const std::string& system,
                       const std::string& given);

// A database file a user owns could be written past the tool: the SQLite database `path` and its -wal and
// -shm files must exist as regular files owned by root, since SQLite would create a missing -wal or -shm
// owned by the user who runs the tool. kIo otherwise, naming the file and `how` root creates them (a
// command of the unprivileged binary).
void require_root_owned_db(std::string_view program, std::string_view noun, const std::string& path,
                           std::string_view how);

}  // namespace forge::privilege
