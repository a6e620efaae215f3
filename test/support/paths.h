// Where a test finds the checkout and the programs it runs: from the environment ctest gives every test
// (test/CMakeLists.txt), not from compile definitions, so that an object compiled in one checkout is the
// same as in another and the compiler cache can share it (cmake/ForgeCcache.cmake).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace forge::test {

// The value of the environment variable `name`; throws, naming it, when the test was not run by ctest.
inline std::string env_path(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) + " is not set: run this test through ctest (it sets it)");
  }
  return value;
}

// The source checkout's root (FORGE_SOURCE_DIR), to which `relative` is appended.
inline std::string source_path(const std::string& relative) {
  return env_path("FORGE_SOURCE_DIR") + "/" + relative;
}

}  // namespace forge::test
