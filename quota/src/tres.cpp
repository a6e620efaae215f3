// TRES strings are read by both the ledger (sacct AllocTRES) and the SPANK plugin (the job record's
// tres_alloc_str), so this lives in forge_quota_core.
#include "forge/common/ini.h"
#include "forge/common/text.h"
#include "forge/quota/usage.h"

#include <charconv>

namespace forge::quota {

int gpus_in_tres(const std::string& tres, std::string* type) {
  int untyped = -1, typed = 0;
  for (const auto& item : split_list(tres)) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = item.substr(0, eq);
    int n = 0;
    const std::string v = item.substr(eq + 1);
    if (std::from_chars(v.data(), v.data() + v.size(), n).ec != std::errc()) continue;
    if (key == "gres/gpu")
      untyped = n;
    else if (key.rfind("gres/gpu:", 0) == 0) {
      typed += n;
      if (type && type->empty()) *type = key.substr(9);
    }
  }
  return untyped >= 0 ? untyped : typed;
}

}  // namespace forge::quota
