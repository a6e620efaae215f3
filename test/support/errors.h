// The forge::Error a call throws, for tests of bad input: its exit code and what its message names.
#pragma once

#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <string>

namespace forge::test {

// Runs fn and returns the forge::Error it throws (fails the test when it throws nothing).
template <typename Fn>
forge::Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const forge::Error& e) {
    return e;
  }
  FAIL("expected a forge::Error");
  return forge::Error(forge::ExitCode::kOk, "");
}

inline bool mentions(const forge::Error& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

}  // namespace forge::test
