#include "forge/dataio/shard.h"
#include "dataset_fixture.h"
#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/verify.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

using namespace forge::data;
using forge::Error;
using forge::ExitCode;

namespace {

ShardData sample_shard(uint32_t vocab) {
  ShardData d;
  for (uint32_t i = 0; i < 5000; ++i) d.tokens.push_back((i * 2654435761u) % vocab);
  d.doc_offsets = {0, 1000, 1001, 5000};
  d.doc_domains = {0, 1, 0};
  d.doc_licenses = {0, 2, 1};
  return d;
}

std::string error_of(const std::function<void()>& f, ExitCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("shards round-trip uint16 and uint32 tokens") {
  forge::test::TempDir tmp;
  for (uint32_t vocab : {300u, 65535u, 70000u, 1u << 20}) {
    const int width = token_bytes_for_vocab(vocab);
    CHECK(width == (vocab <= 65535 ? 2 : 4));
    const ShardData in = sample_shard(vocab);
    const std::string path = tmp / ("s" + std::to_string(vocab) + ".h5");
    write_shard(path, in, {kShardSchemaVersion, "train", "prose", "abc123", vocab}, width);
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    ShardLayout layout;
    const ShardData out = read_shard(path, &layout);
    CHECK(out.tokens == in.tokens);
    CHECK(out.doc_offsets == in.doc_offsets);
    CHECK(out.doc_domains == in.doc_domains);
    CHECK(out.doc_licenses == in.doc_licenses);
    CHECK(layout.token_bytes == width);
    CHECK(layout.attrs.split == "train");
    CHECK(layout.attrs.domain == "prose");
    CHECK(layout.attrs.tokenizer_sha256 == "abc123");
    CHECK(layout.attrs.vocab_size == vocab);
    // The token bytes sit at H5Dget_offset, little-endian: what the reader reads without HDF5.
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(layout.token_offset + 4 * width));
    uint32_t raw = 0;
    f.read(reinterpret_cast<char*>(&raw), width);
    CHECK(raw == in.tokens[4]);
    // An independent HDF5 tool reads the file.
    const std::string cmd = "h5dump -d /doc_offsets " + path + " > " + path + ".dump 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string dump = forge::read_file(path + ".dump");
    CHECK(dump.find("0, 1000, 1001, 5000") != std::string::npos);
  }
}

TEST_CASE("shard bytes are deterministic") {
  forge::test::TempDir tmp;
  const ShardData in = sample_shard(1000);
  write_shard(tmp / "a.h5", in, {kShardSchemaVersion, "train", "d", "x", 1000}, 2);
  write_shard(tmp / "b.h5", in, {kShardSchemaVersion, "train", "d", "x", 1000}, 2);
  CHECK(forge::read_file(tmp / "a.h5") == forge::read_file(tmp / "b.h5"));
}

TEST_CASE("a truncated or garbage shard is a data error naming the file") {
  forge::test::TempDir tmp;
  const std::string path = tmp / "t.h5";
  write_shard(path, sample_shard(1000), {kShardSchemaVersion, "train", "d", "x", 1000}, 2);
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 2000);  // inside the token data
  ExitCode code = ExitCode::kOk;
  const std::string msg = error_of([&] { read_shard_layout(path); }, &code);
  CHECK(code == ExitCode::kData);
  CHECK(msg.find(path) != std::string::npos);
  tmp.write("g.h5", "this is not hdf5");
  CHECK(error_of([&] { read_shard_layout(tmp / "g.h5"); }, &code).find("not an HDF5 file") !=
        std::string::npos);
  CHECK(code == ExitCode::kData);
}

TEST_CASE("manifest version covers its content; verify checks every shard") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  Manifest m = forge::test::make_fixture_dataset(dir, {{"a", {100, 200}, 1}, {"b", {50}, 1}});
  CHECK(load_manifest(dir).version == m.version);
  CHECK(m.version == m.compute_version());
  const VerifyResult ok = verify_dataset(dir);
  CHECK(ok.shards == m.shards.size());
  CHECK(ok.tokens == 100 + 200 + 50 + 40 + 40);

  SECTION("hand-edited manifest") {
    std::string text = forge::read_file(dir + "/manifest.json");
    const auto pos = text.find("\"tokens\": 200");
    REQUIRE(pos != std::string::npos);
    text.replace(pos, 13, "\"tokens\": 201");
    forge::write_file_atomic(dir + "/manifest.json", text);
    ExitCode code = ExitCode::kOk;
    CHECK(error_of([&] { verify_dataset(dir); }, &code).find("does not match its content") !=
          std::string::npos);
    CHECK(code == ExitCode::kData);
  }
  SECTION("corrupted shard") {
    const std::string shard = dir + "/" + m.shards[1].file;
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x55');
    f.close();
    const std::string msg = error_of([&] { verify_dataset(dir); });
    CHECK(msg.find(m.shards[1].file) != std::string::npos);
    CHECK(msg.find("xxh3") != std::string::npos);
  }
  SECTION("token outside the vocabulary with a consistent checksum") {
    ShardData bad = read_shard(dir + "/" + m.shards[0].file);
    bad.tokens[7] = 5000;  // vocab is 1000
    const std::string path = dir + "/" + m.shards[0].file;
    write_shard(path, bad, {kShardSchemaVersion, "train", "a", m.tokenizer_sha256, 1000}, 2);
    m.shards[0].xxh3 = forge::xxh3_file_hex(path);
    m.shards[0].bytes = std::filesystem::file_size(path);
    write_manifest(dir, m);
    CHECK(error_of([&] { verify_dataset(dir); }).find("outside the vocabulary") != std::string::npos);
  }
  SECTION("missing manifest") {
    std::filesystem::remove(dir + "/manifest.json");
    CHECK(error_of([&] { load_manifest(dir); }).find("no manifest.json") != std::string::npos);
  }
  SECTION("tokenizer replaced") {
    forge::write_file_atomic(dir + "/tokenizer.model", "another model");
    CHECK(error_of([&] { verify_dataset(dir); }).find("tokenizer") != std::string::npos);
  }
}
