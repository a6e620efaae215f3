#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <iostream>
#include <sstream>

TEST_CASE("run_cli maps errors to their exit codes and one stderr line") {
  std::ostringstream captured;
  auto* old = std::cerr.rdbuf(captured.rdbuf());
  const int usage =
      forge::run_cli("forge-x", []() -> int { forge::fail(forge::ExitCode::kUsage, "bad {}", 1); });
  const int data =
      forge::run_cli("forge-x", []() -> int { throw forge::Error(forge::ExitCode::kData, "corrupt"); });
  const int internal = forge::run_cli("forge-x", []() -> int { throw std::runtime_error("boom"); });
  const int ok = forge::run_cli("forge-x", [] { return 0; });
  const int quiet =
      forge::run_cli("forge-x", []() -> int { throw forge::Error(forge::ExitCode::kPreempted, ""); });
  std::cerr.rdbuf(old);
  CHECK(usage == 64);
  CHECK(data == 65);
  CHECK(internal == 1);
  CHECK(ok == 0);
  CHECK(quiet == 75);
  CHECK(captured.str() == "forge-x: error: bad 1\nforge-x: error: corrupt\nforge-x: internal error: boom\n");
  CHECK(forge::exit_class_name(forge::ExitCode::kPreempted) == "preempted");
}
