// Errors that end a program carry the exit code the sbatch scripts act on (docs/ARCHITECTURE.md,
// "Exit codes").
#pragma once

#include <fmt/format.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace forge {

enum class ExitCode : int {
  kOk = 0,
  kFailure = 1,     // a check that ran and said no (e.g. the gate's verdict)
  kUsage = 64,      // bad spec, option or policy
  kData = 65,       // corrupt or mismatched data (shard, checkpoint, checksum)
  kComm = 69,       // communication failure or hang
  kNumeric = 71,    // NaN/Inf beyond the guard's policy
  kIo = 74,         // I/O failure (checkpoint write, disk full, permissions)
  kPreempted = 75,  // preempted or time limit; checkpoint saved; requeue me
};

// Short lower-case name of an exit class, as printed in summaries ("usage", "data", ...).
std::string_view exit_class_name(ExitCode code);

// What broke, where the exit code cannot say it: memory or a device. The failure record
// (launcher/failure_record.h) and the batch scripts act on it: a GPU fault drains the node, an OOM asks for
// a smaller plan. kNone: the exit code says all.
enum class Fault : unsigned char { kNone, kOomHost, kOomDevice, kGpu };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, std::string message, Fault fault = Fault::kNone)
      : std::runtime_error(std::move(message)), code_(code), fault_(fault) {}
  ExitCode code() const { return code_; }
  Fault fault() const { return fault_; }

 private:
  ExitCode code_;
  Fault fault_;
};

template <typename... Args>
[[noreturn]] void fail(ExitCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Runs a CLI body and turns any exception into one line on stderr, "<program>: error: <what>", and the
// matching exit code. Exceptions that are not forge::Error are internal failures (exit 1). An Error with
// an empty message prints nothing: the program said it its own way (forge-train's preemption line).
int run_cli(std::string_view program, const std::function<int()>& body);

}  // namespace forge
