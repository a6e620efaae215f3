// What the forge-quota commands share: the caller's identity, the privilege model of a setgid install
// (docs/ADMISSION.md, "Privilege model") and writing output.
#pragma once

#include "forge/quota/approvals.h"
#include "forge/quota/policy.h"

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace forge::quota::cli {

int64_t now_s();

// The process-wide part (umask 007, giving the group up) is forge/common/privilege.h's.
// Refuses commands a setgid forge-quota does not run (apply, sync: root runs the plain binary).
void check_command_allowed(const std::string& command);

// The policy file to read: `given` (--policy, else $FORGE_QUOTA_POLICY, else the system policy). When
// privileged, only the system policy, owned by root and writable by no one else (kUsage otherwise).
Policy load_run_policy(const std::string& given);
// When privileged, --ledger/--snapshot must name the policy's own files (kUsage otherwise); and the
// ledger's files must exist and belong to root, so that no user owns a file of it (kIo otherwise).
std::string ledger_path(const Policy& policy, const std::string& given);
std::string snapshot_path(const Policy& policy, const std::string& given);
// The policy a plain run defaults to.
std::string default_policy_path();

// The caller, from the OS (real uid).
Identity caller();
// Policy admins and root see every team; others the teams they belong to or approve for.
bool sees_all(const Policy& policy, const Identity& who);
std::vector<std::string> visible_teams(const Policy& policy, const Identity& who);
// "(showing teams team-a; admins see all)".
std::string filter_note(const std::vector<std::string>& teams);

// Writes `text` to stdout, or atomically to `path`, as the caller (privilege dropped, caller's umask).
void write_output(const std::string& path, const std::string& text);

// The approval commands (approval_commands.cpp); `args` follow the command's name.
int cmd_request(const std::vector<std::string>& args);
int cmd_decide(bool approve, const std::vector<std::string>& args);
int cmd_admit(const std::vector<std::string>& args);
// `report --approvals` as a table, CSV or JSON (docs/ADMISSION.md).
std::string render_approvals(const std::vector<Approval>& approvals, const std::string& format, int64_t now);

}  // namespace forge::quota::cli
