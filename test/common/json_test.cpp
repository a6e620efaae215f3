#include "forge/common/json.h"
#include "forge/common/error.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>

TEST_CASE("atomic JSON write round-trips and leaves no temp file") {
  forge::test::TempDir dir;
  const auto path = dir / "m.json";
  forge::write_json_atomic(path, {{"version", "abc"}, {"n", 3}});
  CHECK(forge::read_json(path)["n"] == 3);
  forge::write_json_atomic(path, {{"version", "def"}});
  CHECK(forge::read_json(path)["version"] == "def");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  CHECK(files == 1);
}

TEST_CASE("a failed atomic write keeps the old file and reports kIo") {
  forge::test::TempDir dir;
  try {
    forge::write_file_atomic(dir / "no/such/dir/x.json", "{}");
    FAIL("expected an error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kIo);
    CHECK(std::string(e.what()).find("x.json") != std::string::npos);
  }
}

TEST_CASE("invalid JSON is a data error naming the file") {
  forge::test::TempDir dir;
  const auto path = dir.write("bad.json", "{\"a\": ");
  try {
    forge::read_json(path);
    FAIL("expected an error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(std::string(e.what()).find("bad.json") != std::string::npos);
  }
}
