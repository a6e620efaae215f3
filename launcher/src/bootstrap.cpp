#include "bootstrap.h"

#include "forge/common/error.h"
#include "forge/quota/layout.h"

#include <fmt/format.h>

#include <cstdlib>

namespace forge::launcher {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 ? int(n) : fallback;
}

}  // namespace

std::string layout_mismatch(const char* forge_layout, const trainer::ParallelConfig& p) {
  if (forge_layout == nullptr || *forge_layout == '\0') return {};
  std::string why;
  const auto declared = quota::parse_layout(forge_layout, &why);
  if (!declared) return fmt::format("FORGE_LAYOUT='{}' is not a layout: {}", forge_layout, why);
  if (declared->tp == p.tp && declared->pp == p.pp && declared->dp == p.dp) return {};
  return fmt::format(
      "the job was submitted with --train-layout={} (FORGE_LAYOUT) but the spec's [parallel] is "
      "tp{},pp{},dp{}; make them agree (edit the spec, or pass --parallel.tp=... overrides)",
      declared->str(), p.tp, p.pp, p.dp);
}

Bootstrap bootstrap(const trainer::TrainSpec& spec) {
  Bootstrap b;
  b.world = trainer::mpi_world();
  b.rank = b.world->rank();
  b.size = b.world->size();
  b.node = trainer::mpi_host_name();
  b.local_rank = env_int("SLURM_LOCALID", env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
  // GPUs a step was given (Slurm sets CUDA_VISIBLE_DEVICES for real GPUs): local rank -> device index.
  if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) b.gpu = b.local_rank;
  if (const std::string problem = layout_mismatch(std::getenv("FORGE_LAYOUT"), spec.parallel);
      !problem.empty())
    fail(ExitCode::kUsage, "{}", problem);
  const int want = spec.parallel.tp * spec.parallel.pp * spec.parallel.dp;
  if (b.size != want)
    fail(ExitCode::kUsage,
         "the spec's layout tp{},pp{},dp{} needs {} ranks but {} were started (srun -n {} / mpirun -np {}, "
         "or change "
         "[parallel])",
         spec.parallel.tp, spec.parallel.pp, spec.parallel.dp, want, b.size, want, want);
  return b;
}

std::string Bootstrap::describe() const {
  return fmt::format("rank {}/{} on {} (local rank {}{})", rank, size, node, local_rank,
                     gpu >= 0 ? fmt::format(", GPU {}", gpu) : std::string());
}

}  // namespace forge::launcher
