#include "forge/common/error.h"
#include "forge/trainer/cuda/device.h"

#include <charconv>
#include <cstdlib>

namespace forge::trainer::cuda {

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    std::string item = s.substr(start, end - start);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int parse_count(const char* name, const char* value) {
  int v = 0;
  const char* end = value + std::char_traits<char>::length(value);
  const auto [ptr, ec] = std::from_chars(value, end, v);
  if (ec != std::errc() || ptr != end || v < 0)
    fail(ExitCode::kUsage,
         "device selection: {}='{}' is not a non-negative integer; fix the launcher's environment", name,
         value);
  return v;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ",") + i;
  return s;
}

}  // namespace

DeviceEnv read_device_env(const std::function<const char*(const char*)>& get_fn) {
  const auto get = [&](const char* name) -> const char* { return get_fn ? get_fn(name) : std::getenv(name); };
  DeviceEnv env;
  for (const char* name : {"SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
    if (const char* v = get(name); v != nullptr && *v != '\0') {
      env.local_rank = parse_count(name, v);
      env.local_rank_from = name;
      break;
    }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const char* v = get(name); v != nullptr && *v != '\0') {
      env.local_size = parse_count(name, v);
      break;
    }
  if (const char* v = get("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    env.has_visible = true;
    env.visible = split_list(v);
  }
  if (const char* v = get("SLURM_STEP_GPUS"); v != nullptr) env.step_gpus = split_list(v);
  return env;
}

DeviceChoice choose_device(const DeviceEnv& env, int visible_count, int rank) {
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
