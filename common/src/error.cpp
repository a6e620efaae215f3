#include "forge/common/error.h"

#include <boost/program_options/errors.hpp>

#include <iostream>

namespace forge {

std::string_view exit_class_name(ExitCode code) {
  switch (code) {
    case ExitCode::kOk:
      return "ok";
    case ExitCode::kFailure:
      return "failure";
    case ExitCode::kUsage:
      return "usage";
    case ExitCode::kData:
      return "data";
    case ExitCode::kComm:
      return "comm";
    case ExitCode::kNumeric:
      return "numeric";
    case ExitCode::kIo:
      return "io";
    case ExitCode::kPreempted:
      return "preempted";
  }
  return "unknown";
}

int run_cli(std::string_view program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    // An empty message: the program already said what happened (forge-train's preemption, once per job).
    if (*e.what() != '\0') std::cerr << program << ": error: " << e.what() << '\n';
    return static_cast<int>(e.code());
  } catch (const boost::program_options::error& e) {
    std::cerr << program << ": error: " << e.what() << " (see --help)\n";
    return static_cast<int>(ExitCode::kUsage);
  } catch (const std::exception& e) {
    std::cerr << program << ": internal error: " << e.what() << '\n';
    return static_cast<int>(ExitCode::kFailure);
  }
}

}  // namespace forge
