// Runs a shell command for a CLI test: its exit code and its stdout and stderr together.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace forge::test {

struct CommandResult {
  int code = -1;  // the exit status; -1 when a signal ended it
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + command);
  CommandResult r;
  char buf[4096];
  while (const size_t n = std::fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace forge::test
