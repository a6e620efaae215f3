#include "forge/quota/identity.h"

#include "forge/common/error.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace forge::quota {
namespace {

// getpw*_r/getgr*_r want a caller's buffer; a large group (many members) needs more than the usual size.
template <typename Lookup>
bool with_buffer(Lookup lookup) {
  std::vector<char> buf(16384);
  for (;;) {
    const int rc = lookup(buf);
    if (rc != ERANGE || buf.size() >= (1u << 24)) return rc == 0;
    buf.resize(buf.size() * 4);
  }
}

std::string group_name(gid_t gid) {
  std::string name;
  with_buffer([&](std::vector<char>& buf) {
    group gr{}, *found = nullptr;
    const int rc = getgrgid_r(gid, &gr, buf.data(), buf.size(), &found);
    if (rc == 0 && found) name = found->gr_name;
    return rc;
  });
  return name;
}

}  // namespace

Identity identity_of_uid(uid_t uid) {
  Identity who;
  std::string name;
  gid_t primary = 0;
  bool known = false;
  with_buffer([&](std::vector<char>& buf) {
    passwd pw{}, *found = nullptr;
    const int rc = getpwuid_r(uid, &pw, buf.data(), buf.size(), &found);
    if (rc == 0 && found) name = found->pw_name, primary = found->pw_gid, known = true;
    return rc;
  });
  if (!known) {
    who.user = "uid " + std::to_string(uid);
    return who;
  }
  who.user = name;
  std::vector<gid_t> gids(64);
  int n = static_cast<int>(gids.size());
  if (getgrouplist(name.c_str(), primary, gids.data(), &n) < 0) {
    gids.resize(static_cast<size_t>(n));
    if (getgrouplist(name.c_str(), primary, gids.data(), &n) < 0) n = 0;
  }
  for (int i = 0; i < n; ++i)
    if (std::string g = group_name(gids[static_cast<size_t>(i)]); !g.empty())
      who.groups.push_back(std::move(g));
  return who;
}

bool user_exists(const std::string& name) {
  bool found_it = false;
  with_buffer([&](std::vector<char>& buf) {
    passwd pw{}, *found = nullptr;
    const int rc = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
    found_it = rc == 0 && found;
    return rc;
  });
  return found_it;
}

bool group_exists(const std::string& name) {
  bool found_it = false;
  with_buffer([&](std::vector<char>& buf) {
    group gr{}, *found = nullptr;
    const int rc = getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
    found_it = rc == 0 && found;
    return rc;
  });
  return found_it;
}

void check_policy_names(const Policy& policy) {
  for (const PolicyName& n : policy.names) {
    if (n.group ? group_exists(n.name) : user_exists(n.name)) continue;
    const std::string shown = (n.group && n.role != "group" ? "@" : "") + n.name;
    const std::string of_team = n.team.empty() ? "" : " of team " + n.team;
    fail(ExitCode::kUsage, "{}:{}: {} '{}'{} is not a {} on this machine", policy.path, n.line, n.role, shown,
         of_team, n.group ? "group" : "user");
  }
}

}  // namespace forge::quota
