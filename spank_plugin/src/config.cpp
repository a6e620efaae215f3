#include "plugin.h"

#include "forge/common/text.h"

#include <string_view>

namespace forge::spank {

std::optional<PluginConfig> parse_config(int ac, char** av, std::string* why) {
  PluginConfig c;
  bool have_policy = false;
  for (int i = 0; i < ac; ++i) {
    const std::string_view arg = av[i];
    const auto value = [&](std::string_view key) { return std::string(arg.substr(key.size())); };
    if (arg.rfind("policy=", 0) == 0) {
      c.policy_path = value("policy=");
      have_policy = true;
    } else if (arg.rfind("snapshot=", 0) == 0) {
      c.snapshot_path = value("snapshot=");
    } else if (arg == "mode=enforce") {
      c.enforce = true;
    } else if (arg == "mode=warn") {
      c.enforce = false;
    } else if (arg == "fail-open") {
      c.on_snapshot_problem = quota::SnapshotFailure::kOpen;
    } else if (arg == "fail-closed") {
      c.on_snapshot_problem = quota::SnapshotFailure::kClosed;
    } else if (arg.rfind("job_tmp=", 0) == 0) {
      c.job_tmp = value("job_tmp=");
      if (c.job_tmp.size() < 2 || c.job_tmp[0] != '/') {
        *why = "plugstack.conf: job_tmp= needs an absolute directory";
        return std::nullopt;
      }
    } else if (arg == "controller_fallback=trust-plugin") {
      // job_submit.lua's, for when slurmctld cannot read the policy (docs/ADMISSION.md); nothing here.
    } else {
      *why =
          "plugstack.conf: unknown argument '" + printable(arg) +
          "' for forge_spank.so; allowed: policy=PATH snapshot=PATH mode=enforce|warn fail-open|fail-closed "
          "job_tmp=DIR controller_fallback=trust-plugin";
      return std::nullopt;
    }
  }
  if (have_policy && c.policy_path.empty()) {
    *why = "plugstack.conf: policy= needs the path of the policy file";
    return std::nullopt;
  }
  return c;
}

}  // namespace forge::spank
