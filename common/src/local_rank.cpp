#include "forge/common/local_rank.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <unistd.h>

#include <cstdlib>

namespace forge {

LocalRank local_rank(const std::function<const char*(const char*)>& get_fn) {
  const auto get = [&](const char* name) -> const char* { return get_fn ? get_fn(name) : std::getenv(name); };
  const auto count = [&](const char* name, const char* value) {
    const auto v = parse_int(value);
    if (!v || *v < 0 || *v > (1 << 24))
      fail(ExitCode::kUsage, "{}='{}' is not a non-negative integer; fix the launcher's environment", name,
           printable(value));
    return int(*v);
  };
  LocalRank out;
  for (const char* name : {"SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
    if (const char* v = get(name); v != nullptr && *v != '\0') {
      out.rank = count(name, v);
      out.from = name;
      break;
    }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const char* v = get(name); v != nullptr && *v != '\0') {
      out.size = count(name, v);
      break;
    }
  return out;
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
}

std::string node_name() {
  const char* n = std::getenv("SLURMD_NODENAME");
  return n != nullptr && *n != '\0' ? n : host_name();
}

}  // namespace forge
