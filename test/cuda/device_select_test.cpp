#include "forge/common/error.h"
#include "forge/trainer/cuda/device.h"

#include <catch2/catch.hpp>

#include <map>
#include <string>

using forge::trainer::cuda::choose_device;
using forge::trainer::cuda::DeviceEnv;
using forge::trainer::cuda::read_device_env;

namespace {

DeviceEnv env_of(const std::map<std::string, std::string>& vars) {
  return read_device_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The one-line message and exit code of a failing choose_device.
std::pair<forge::ExitCode, std::string> failure(const DeviceEnv& env, int visible, int rank) {
  try {
    choose_device(env, visible, rank);
  } catch (const forge::Error& e) {
    return {e.code(), e.what()};
  }
  return {forge::ExitCode::kOk, ""};
}

}  // namespace

TEST_CASE("local rank comes from SLURM_LOCALID before Open MPI's variable") {
  const DeviceEnv env = env_of({{"SLURM_LOCALID", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  CHECK(env.local_rank == 2);
  CHECK(env.local_rank_from == "SLURM_LOCALID");
  const DeviceEnv ompi = env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(ompi.local_rank == 3);
  CHECK(ompi.local_size == 4);
  CHECK(env_of({}).local_rank == -1);
}

TEST_CASE("local rank indexes the visible devices and names the physical GPU") {
  const DeviceEnv env =
      env_of({{"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}, {"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  const auto c = choose_device(env, 4, 9);
  CHECK(c.ordinal == 1);
  CHECK(c.physical == "5");
  // No launcher variables: a single process uses device 0.
  CHECK(choose_device(env_of({}), 8, 0).ordinal == 0);
}

TEST_CASE("SLURM_STEP_GPUS names the GPU when CUDA_VISIBLE_DEVICES is unset") {
  const auto c = choose_device(env_of({{"SLURM_LOCALID", "1"}, {"SLURM_STEP_GPUS", "2,3"}}), 2, 1);
  CHECK(c.ordinal == 1);
  CHECK(c.physical == "3");
}

TEST_CASE("a task Slurm bound to one GPU of the step uses it whatever its local rank") {
  const DeviceEnv env = env_of({{"SLURM_LOCALID", "3"},
                                {"SLURM_NTASKS_PER_NODE", "4"},
                                {"CUDA_VISIBLE_DEVICES", "GPU-7f3a"},
                                {"SLURM_STEP_GPUS", "0,1,2,3"}});
  const auto c = choose_device(env, 1, 3);
  CHECK(c.ordinal == 0);
  CHECK(c.physical == "GPU-7f3a");
}

TEST_CASE("more ranks on a node than GPUs is one usage error naming rank, local rank and GPUs") {
  const DeviceEnv env =
      env_of({{"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4"}, {"CUDA_VISIBLE_DEVICES", "0,1"}});
  const auto [code, msg] = failure(env, 2, 6);
  CHECK(code == forge::ExitCode::kUsage);
  CHECK(msg.find("rank 6") != std::string::npos);
  CHECK(msg.find("local rank 2, SLURM_LOCALID") != std::string::npos);
  CHECK(msg.find("more ranks on this node (4) than GPUs (2 visible") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  // Rank 0 of the same node fails too: every rank of an over-subscribed node reports, none trains.
  const DeviceEnv env0 =
      env_of({{"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "4"}, {"CUDA_VISIBLE_DEVICES", "0,1"}});
  CHECK(failure(env0, 2, 0).first == forge::ExitCode::kUsage);
}

TEST_CASE("no visible device is a usage error") {
  const auto [code, msg] = failure(env_of({{"CUDA_VISIBLE_DEVICES", ""}}), 0, 0);
  CHECK(code == forge::ExitCode::kUsage);
  CHECK(msg.find("no CUDA device is visible") != std::string::npos);
}

TEST_CASE("a malformed local rank names the variable") {
  try {
    env_of({{"SLURM_LOCALID", "one"}});
    FAIL("no error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK(std::string(e.what()).find("SLURM_LOCALID='one'") != std::string::npos);
  }
}

TEST_CASE("ranks share the GPUs round-robin when the communicator allows it (host-staged MPI)") {
  const DeviceEnv env = env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                {"CUDA_VISIBLE_DEVICES", "5,7"}});
  CHECK(failure(env, 2, 3).first == forge::ExitCode::kUsage);  // NCCL: one rank per GPU
  const auto shared = choose_device(env, 2, 3, true);
  CHECK(shared.ordinal == 1);
  CHECK(shared.physical == "7");
  CHECK(choose_device(env_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), 1, 2, true).ordinal == 0);
  CHECK(failure(env, 0, 3).first == forge::ExitCode::kUsage);  // sharing nothing is still no device
}
