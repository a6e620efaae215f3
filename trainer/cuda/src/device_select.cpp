#include "forge/common/error.h"
#include "forge/common/local_rank.h"
#include "forge/common/text.h"
#include "forge/trainer/cuda/device.h"

#include <cstdlib>

namespace forge::trainer::cuda {

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ",") + i;
  return s;
}

}  // namespace

DeviceEnv read_device_env(const std::function<const char*(const char*)>& get_fn) {
  const auto get = [&](const char* name) -> const char* { return get_fn ? get_fn(name) : std::getenv(name); };
  DeviceEnv env;
  const LocalRank local = local_rank(get);
  if (!local.from.empty()) {
    env.local_rank = local.rank;
    env.local_rank_from = local.from;
  }
  env.local_size = local.size;
  if (const char* v = get("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    env.has_visible = true;
    env.visible = split_list(v);
  }
  if (const char* v = get("SLURM_STEP_GPUS"); v != nullptr) env.step_gpus = split_list(v);
  return env;
}

DeviceChoice choose_device(const DeviceEnv& env, int visible_count, int rank, bool share) {
  const int local = env.local_rank >= 0 ? env.local_rank : 0;
  const std::string from =
      env.local_rank_from.empty() ? "no launcher variable, assumed" : env.local_rank_from;
  const std::string seen = env.has_visible ? "CUDA_VISIBLE_DEVICES='" + join(env.visible) + "'"
                                           : std::string("CUDA_VISIBLE_DEVICES unset");
  if (visible_count <= 0)
    fail(ExitCode::kUsage,
         "rank {} (local rank {}, {}): no CUDA device is visible ({}); request GPUs for the job "
         "(--gpus-per-node "
         "or --gres=gpu:N)",
         rank, local, from, seen);
  // Slurm bound this task to one GPU of several in the step: it is this task's, whatever the local rank.
  const bool bound_to_one = visible_count == 1 && env.visible.size() == 1 && env.step_gpus.size() > 1;
  DeviceChoice choice;
  if (bound_to_one) {
    choice.ordinal = 0;
  } else if (share) {
    choice.ordinal = local % visible_count;
  } else {
    const int ranks_here = std::max(env.local_size, local + 1);
    if (local >= visible_count || (env.local_size > visible_count && visible_count > 1))
      fail(ExitCode::kUsage,
           "rank {} (local rank {}, {}): more ranks on this node ({}) than GPUs ({} visible, {}); start at "
           "most {} "
           "tasks per node or request more GPUs",
           rank, local, from, ranks_here, visible_count, seen, visible_count);
    choice.ordinal = local;
  }
  const size_t i = size_t(choice.ordinal);
  if (env.has_visible && i < env.visible.size())
    choice.physical = env.visible[i];
  else if (!env.has_visible && i < env.step_gpus.size())
    choice.physical = env.step_gpus[i];
  else
    choice.physical = std::to_string(choice.ordinal);
  return choice;
}

}  // namespace forge::trainer::cuda
