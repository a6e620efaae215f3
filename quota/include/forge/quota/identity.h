// Who the caller is, from the OS only: the user of a uid and all of that user's groups (passwd and group
// databases, NSS included). forge-quota and the SPANK plugin never take an identity from a flag or the
// environment.
#pragma once

#include "forge/quota/policy.h"

#include <sys/types.h>

#include <string>

namespace forge::quota {

// The user of `uid` and the names of their groups (primary and supplementary, getgrouplist). A uid
// without a passwd entry is "uid N" (no policy name can contain a space) with no groups.
Identity identity_of_uid(uid_t uid);

bool user_exists(const std::string& name);
bool group_exists(const std::string& name);

// Every user and group the policy names must exist on this machine (`forge-quota check-policy`). Throws
// forge::Error(kUsage) for the first that does not: "<file>:<line>: approver 'zed' of team team-a is not a
// user on this machine".
void check_policy_names(const Policy& policy);

}  // namespace forge::quota
