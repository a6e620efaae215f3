#include "forge/common/hash.h"
#include "forge/common/error.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

TEST_CASE("sha256 matches the published test vectors") {
  CHECK(forge::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(forge::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("xxh3 streaming equals one-shot, and files hash like their bytes") {
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  forge::Xxh3Stream s;
  s.update(data.data(), 1000);
  s.update(data.data() + 1000, data.size() - 1000);
  CHECK(s.hex() == forge::xxh3_64_hex(data));
  CHECK(forge::xxh3_64_hex(data) != forge::xxh3_64_hex(data.substr(1)));
  CHECK(forge::xxh3_128_hex("abc").size() == 32);

  forge::test::TempDir dir;
  const auto path = dir.write("blob", data);
  CHECK(forge::xxh3_file_hex(path) == forge::xxh3_64_hex(data));
  CHECK(forge::sha256_file_hex(path) == forge::sha256_hex(data));
  try {
    forge::sha256_file_hex(dir / "missing");
    FAIL("expected an error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kIo);
    CHECK(std::string(e.what()).find("missing") != std::string::npos);
  }
}
