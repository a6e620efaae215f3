// Running Slurm's client commands (sacct, squeue, sacctmgr) and reading their output. Found on PATH, so
// tests can stand fake ones in front of the real ones.
#pragma once

#include <string>
#include <vector>

namespace forge::quota {

struct CommandResult {
  int status = 0;  // exit status; 128+N when killed by signal N
  std::string out, err;
};

// Runs `argv` (argv[0] looked up on PATH) with `env` ("NAME=value") added to the environment.
// Throws forge::Error(kComm) only if the program cannot be started.
CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// Runs and returns stdout; a non-zero exit throws forge::Error(kComm) with the command and its stderr.
std::string run_checked(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

}  // namespace forge::quota
