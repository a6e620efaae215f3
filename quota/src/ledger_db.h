// Opening the ledger database: shared by the usage ledger (ledger.cpp) and the approval store
// (approvals.cpp), which keep their tables in the same file. Internal to forge_quota.
#pragma once

#include "forge/common/sqlite.h"

#include <memory>
#include <string>

namespace forge::quota {

// Opens (creating if needed, with its directory) the ledger at `path`, in WAL mode with every table in
// place (CREATE IF NOT EXISTS, so an older ledger gains the newer tables). Throws forge::Error naming the
// file: kData when it is damaged, kIo otherwise.
std::unique_ptr<sqlite::Db> open_ledger(const std::string& path);

}  // namespace forge::quota
