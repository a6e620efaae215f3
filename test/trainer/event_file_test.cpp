// TensorBoard event files: the checksum against the published CRC-32C check value; the files themselves
// are decoded by an independent reader in test/launcher/tensorboard_test.sh.
#include "forge/trainer/event_file.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

TEST_CASE("CRC-32C and its TFRecord mask", "[tensorboard]") {
  CHECK(forge::trainer::crc32c("123456789") == 0xE3069283u);  // the Castagnoli check value (RFC 3720 B.4)
  CHECK(forge::trainer::crc32c("") == 0u);
  // ((c >> 15) | (c << 17)) + 0xa282ead8 of the check value, computed by hand from the TFRecord format.
  CHECK(forge::trainer::masked_crc32c("123456789") == 0xC78AB0E5u);
}

TEST_CASE("an event file is framed records whose checksums hold", "[tensorboard]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "forge-event-file-test";
  fs::remove_all(dir);
  std::string path;
  {
    forge::trainer::EventFileWriter w(dir.string());
    w.scalar("train/loss", 1, 2.5);
    w.text("events/guard", 1, "spike");
    w.restart(1);
    w.flush();
    path = w.path();
  }
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    uint64_t n = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&n, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    REQUIRE(bytes.size() - at >= 16 + n);
    std::memcpy(&data_crc, bytes.data() + at + 12 + n, 4);
    CHECK(length_crc == forge::trainer::masked_crc32c(bytes.substr(at, 8)));
    CHECK(data_crc == forge::trainer::masked_crc32c(bytes.substr(at + 12, n)));
    at += 16 + n;
    ++records;
  }
  CHECK(records == 4);  // file version, scalar, text, restart
  fs::remove_all(dir);
}

TEST_CASE("an event file that cannot be created names its path", "[tensorboard]") {
  CHECK_THROWS_WITH(forge::trainer::EventFileWriter("/proc/forge-no-such-dir"),
                    Catch::Contains("/proc/forge-no-such-dir"));
}
