#include "forge/comm/bootstrap.h"

#include "forge/comm/groups.h"
#include "forge/common/error.h"
#include "forge/common/local_rank.h"

#include <fmt/format.h>

#include <cstdlib>

namespace forge::comm {

std::string layout_mismatch(const char* forge_layout, const Layout& spec) {
  if (forge_layout == nullptr || *forge_layout == '\0') return {};
  std::string why;
  const auto declared = parse_layout(forge_layout, &why);
  if (!declared) return "FORGE_LAYOUT: " + why;
  if (*declared == spec) return {};
  return fmt::format(
      "the job was submitted with --train-layout={} (FORGE_LAYOUT) but the spec's [parallel] is {}; make "
      "them agree (edit the spec, or pass --parallel.tp=... overrides)",
      declared->str(), spec.str());
}

Bootstrap bootstrap() {
  Bootstrap b;
  b.world = mpi_world();
  b.rank = b.world->rank();
  b.size = b.world->size();
  b.node = mpi_host_name();
  b.local_rank = local_rank().rank;
  // GPUs a step was given (Slurm sets CUDA_VISIBLE_DEVICES for real GPUs): local rank -> device index.
  if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) b.gpu = b.local_rank;
  return b;
}

void check_layout_of_job(const Layout& layout) {
  if (const std::string problem = layout_mismatch(std::getenv("FORGE_LAYOUT"), layout); !problem.empty())
    fail(ExitCode::kUsage, "{}", problem);
}

void check_layout(const Bootstrap& b, const Layout& layout) {
  check_layout_of_job(layout);
  const int want = layout.world();
  if (b.size != want)
    fail(ExitCode::kUsage,
         "the spec's layout {} needs {} ranks but {} were started (srun -n {} / mpirun -np {}, or change "
         "[parallel])",
         layout.str(), want, b.size, want, want);
}

std::string Bootstrap::describe() const {
  return fmt::format("rank {}/{} on {} (local rank {}{})", rank, size, node, local_rank,
                     gpu >= 0 ? fmt::format(", GPU {}", gpu) : std::string());
}

}  // namespace forge::comm
