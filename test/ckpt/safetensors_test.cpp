// safetensors files (read, checked, written) and the streaming CheckpointWriter of imports.
#include "support/errors.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/safetensors.h"
#include "forge/ckpt/writer.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

using namespace forge::ckpt;
namespace fs = std::filesystem;

using forge::test::error_of;
using forge::test::mentions;

namespace {

// A file of `header` (JSON text) and `data` bytes, with `size` as the header size field (default: right).
std::string file_of(const std::string& header, size_t data, std::optional<uint64_t> size = {}) {
  std::string out(8, '\0');
  const uint64_t n = size.value_or(header.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i) & 0xff);
  return out + header + std::string(data, '\x01');
}

}  // namespace

TEST_CASE("safetensors: what write_safetensors writes reads back, tensor by tensor", "[safetensors]") {
  forge::test::TempDir tmp;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const std::vector<uint16_t> b = {0x3f80, 0xc000, 0x7fc0};  // bf16 1, -2, NaN
  const std::vector<SafeTensorOut> out = {
      {"layer.a",
       DType::kF32,
       {2, 3},
       [&](std::span<std::byte> buf) { std::memcpy(buf.data(), a.data(), 24); }},
      {"b", DType::kBF16, {3}, [&](std::span<std::byte> buf) { std::memcpy(buf.data(), b.data(), 6); }},
      {"empty", DType::kF16, {0, 4}, [](std::span<std::byte> buf) { CHECK(buf.empty()); }}};
  write_safetensors(tmp / "m.safetensors", out, {{"format", "pt"}});
  const auto f = SafetensorsFile::open(tmp / "m.safetensors");
  CHECK(f.header().size() % 8 == 0);  // the data start 8-byte aligned, as the reference writer has it
  CHECK(f.metadata()["format"] == "pt");
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0].name == "layer.a");  // file order
  CHECK(f.tensors()[0].shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(f.tensors()[0].bytes.data(), a.data(), 24) == 0);
  CHECK(f.tensors()[1].dtype == DType::kBF16);
  CHECK(std::memcmp(f.tensors()[1].bytes.data(), b.data(), 6) == 0);
  CHECK(f.tensors()[2].bytes.empty());
  f.release(f.tensors()[0]);  // pages dropped, contents still readable from the file
  CHECK(std::memcmp(f.tensors()[0].bytes.data(), a.data(), 24) == 0);
  // The writer never replaces a file (it writes into a staging directory).
  CHECK(error_of([&] { write_safetensors(tmp / "m.safetensors", out); }).code() == forge::ExitCode::kIo);
}

TEST_CASE("safetensors: hostile files are refused naming what is wrong, before any tensor is used",
          "[safetensors]") {
  forge::test::TempDir tmp;
  const auto refused = [&](const std::string& bytes, const std::string& why) {
    const std::string path = tmp.write("bad.safetensors", bytes);
    const forge::Error e = error_of([&] { SafetensorsFile::open(path); });
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(e, path));
    CHECK(mentions(e, why));
  };
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SECTION("shorter than the size field") {
    refused("abc", "too short");
  }
  SECTION("a header larger than the file") {
    refused(file_of(ok, 8, 1ull << 40), "the header claims");
  }
  SECTION("a header that is not JSON") {
    refused(file_of("{\"t\": [", 0), "not JSON");
  }
  SECTION("offsets past the end (a truncated file)") {
    refused(file_of(ok, 4), "reach past");
  }
  SECTION("overlapping tensors") {
    refused(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    8),
            "overlap");
  }
  SECTION("a hole between tensors") {
    refused(file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                    12),
            "belong to no tensor");
  }
  SECTION("bytes after the last tensor") {
    refused(file_of(ok, 12), "belong to no tensor");
  }
  SECTION("a dtype whose size does not match the range") {
    refused(file_of(R"({"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8), "take 4 bytes");
  }
  SECTION("an unsupported dtype") {
    refused(file_of(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
            "'F64' is not supported");
  }
  SECTION("a 2^63 dimension") {
    refused(file_of(R"({"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8),
            "[0, 2^62)");
  }
  SECTION("dimensions whose product overflows") {
    refused(file_of(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
            "more than 2^62 elements");
  }
  SECTION("a negative dimension") {
    refused(file_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "[0, 2^62)");
  }
  SECTION("offsets that are not numbers") {
    refused(file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", 8), "two byte offsets");
  }
}

TEST_CASE("CheckpointWriter: pieces streamed in chunks make a committed checkpoint any layout reads",
          "[safetensors]") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "imported";
  std::vector<float> w(3 * 4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f;
  {
    CheckpointWriter writer(dir, false);
    // Two row blocks of one tensor, written in the order a source file holds them (second block first).
    for (int64_t r0 : {2, 0}) {
      Slice piece = Slice::whole("param/w", {3, 4});
      piece.offset = {r0, 0};
      piece.count = {r0 == 2 ? 1 : 2, 4};
      writer.add(piece, [&](int64_t first, std::span<std::byte> out) {
        std::memcpy(out.data(), w.data() + r0 * 4 + first, out.size());
      });
    }
    writer.add_file("config.json", "{}\n");
    CHECK(fs::exists(writer.staging()));
    CHECK_FALSE(fs::exists(dir));  // nothing under the final name before the commit
    CheckpointMeta meta;
    meta.model_config = {{"layers", 1}};
    writer.commit(Tier::kRelease, meta);
  }
  const Checkpoint c = Checkpoint::open(dir);
  c.verify();
  CHECK(c.manifest().tier == "release");
  CHECK(c.manifest().files.count("config.json") == 1);
  std::vector<float> back(12);
  c.read({{Slice::whole("param/w", {3, 4}), back.data()}});
  CHECK(back == w);
  // Rows 1..2 as another layout would ask for them.
  Slice rows = Slice::whole("param/w", {3, 4});
  rows.offset = {1, 0};
  rows.count = {2, 4};
  std::vector<float> part(8);
  c.read({{rows, part.data()}});
  CHECK(part == std::vector<float>(w.begin() + 4, w.end()));

  SECTION("an existing directory is replaced only when asked") {
    CHECK(error_of([&] { CheckpointWriter again(dir, false); }).code() == forge::ExitCode::kUsage);
  }
  SECTION("a gap in a tensor fails the commit and leaves nothing") {
    const std::string other = tmp / "gap";
    {
      CheckpointWriter writer(other, false);
      Slice piece = Slice::whole("param/w", {3, 4});
      piece.count = {2, 4};
      writer.add(piece, [](int64_t, std::span<std::byte> out) { std::memset(out.data(), 0, out.size()); });
      const forge::Error e = error_of([&] { writer.commit(Tier::kRelease, {}); });
      CHECK(e.code() == forge::ExitCode::kUsage);
      CHECK(mentions(e, "in no piece"));
    }
    CHECK_FALSE(fs::exists(other));
    for (const auto& entry : fs::directory_iterator(tmp.path()))
      CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
  }
}
