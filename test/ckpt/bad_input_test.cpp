#include "support.h"
#include "support/errors.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace forge::ckpt;
using namespace forge::ckpt::test;
namespace fs = std::filesystem;

using forge::test::error_of;
using forge::test::mentions;

namespace {

std::string saved(const std::string& run, int64_t step = 1) {
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run});
  const RankState st = rank_state(1, 1, 0, step);
  REQUIRE(saver.save(Tier::kRecovery, meta_for(step), st.tensors()).outcome == Outcome::kCommitted);
  return checkpoint_dir(run, Tier::kRecovery, step);
}

}  // namespace

TEST_CASE("pieces that leave a gap, overlap partially or disagree on shape are refused on every rank") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  std::vector<float> data(64, 1.0f);
  auto save_pieces = [&](const std::function<Slice(int)>& piece) {
    run_ranks(2, [&](Coordinator& coord) {
      Saver saver(coord, SaverOptions{run});
      saver.save(Tier::kRecovery, meta_for(1), {TensorData{piece(coord.rank()), data.data()}});
    });
  };
  auto rows = [](int64_t off, int64_t count, std::vector<int64_t> shape = {8, 4}) {
    Slice s = Slice::whole("param/w", shape);
    s.offset = {off, 0};
    s.count = {count, shape[1]};
    return s;
  };
  auto gap = error_of([&] { save_pieces([&](int r) { return rows(r == 0 ? 0 : 5, 3); }); });
  CHECK(gap.code() == forge::ExitCode::kUsage);
  CHECK(mentions(gap, "param/w"));
  CHECK(mentions(gap, "in no piece"));
  auto overlap = error_of([&] { save_pieces([&](int r) { return rows(r == 0 ? 0 : 3, 5); }); });
  CHECK(mentions(overlap, "both hold element [3, 0]"));
  auto shape = error_of([&] {
    save_pieces([&](int r) { return r == 0 ? rows(0, 4) : rows(4, 4, {9, 4}); });
  });
  CHECK(mentions(shape, "rank 1 as f32 [9, 4]"));
  auto bounds = error_of([&] { save_pieces([&](int r) { return rows(r * 4, 5); }); });
  CHECK(mentions(bounds, "rank 1"));
  CHECK(list_checkpoints(run).empty());
}

TEST_CASE("damaged checkpoints: each problem is a data error naming the file") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  const std::string dir = saved(run);
  const std::string part = dir + "/rank-00000.bin";
  const std::string original = forge::read_file(part);

  SECTION("flipped byte") {
    std::string b = original;
    b[100] ^= 1;
    std::ofstream(part, std::ios::binary | std::ios::trunc) << b;
    auto e = error_of([&] { Checkpoint::open(dir).verify(); });
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(e, "rank-00000.bin"));
    CHECK(mentions(e, "xxh3"));
  }
  SECTION("truncated file: verify and read both say so") {
    fs::resize_file(part, original.size() / 2);
    CHECK(mentions(error_of([&] { Checkpoint::open(dir).verify(); }), "rank-00000.bin"));
    auto e = error_of([&] {
      const Checkpoint c = Checkpoint::open(dir);
      std::vector<float> v(16);
      c.read({TensorRequest{Slice::whole("param/scale", {}), v.data()},
              TensorRequest{Slice::whole("adam_v/ln.weight", {16}), v.data()}});
    });
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(e, "truncated"));
  }
  SECTION("missing data file: a rank's shard, named by the tensor range it held") {
    fs::remove(part);
    auto e = error_of([&] { Checkpoint::open(dir).verify(); });
    INFO(e.what());
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(
        e,
        "'rank-00000.bin' is missing; it held tensor 'adam_m/blocks.0.b1' elements [0] to [23] and 17 more"));
    auto r = error_of([&] {
      const Checkpoint c = Checkpoint::open(dir);
      std::vector<float> v(24);
      c.read({TensorRequest{Slice::whole("adam_m/blocks.0.b1", {24}), v.data()}});
    });
    CHECK(r.code() == forge::ExitCode::kData);
    CHECK(mentions(r, "it held tensor 'adam_m/blocks.0.b1' elements [0] to [23]"));
  }
  SECTION("edited manifest no longer matches COMMITTED") {
    std::string m = forge::read_file(dir + "/manifest.json");
    m.replace(m.find("\"step\": 1"), 9, "\"step\": 2");
    std::ofstream(dir + "/manifest.json", std::ios::trunc) << m;
    auto e = error_of([&] { Checkpoint::open(dir); });
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(e, "manifest.json"));
  }
  SECTION("no COMMITTED: not a checkpoint, and not listed") {
    fs::remove(dir + "/COMMITTED");
    CHECK(mentions(error_of([&] { Checkpoint::open(dir); }), "not a committed checkpoint"));
    CHECK(list_checkpoints(run).empty());
  }
  SECTION("corrupted index") {
    std::ofstream(dir + "/index.json", std::ios::trunc) << "{}";
    CHECK(mentions(error_of([&] { Checkpoint::open(dir); }), "index.json"));
  }
  SECTION("requests the checkpoint cannot serve") {
    const Checkpoint c = Checkpoint::open(dir);
    std::vector<float> v(1024);
    auto absent = error_of([&] { c.read({TensorRequest{Slice::whole("param/nope", {4}), v.data()}}); });
    CHECK(absent.code() == forge::ExitCode::kData);
    CHECK(mentions(absent, "no tensor 'param/nope'"));
    auto shape = error_of([&] { c.read({TensorRequest{Slice::whole("param/emb", {16, 32}), v.data()}}); });
    CHECK(mentions(shape, "holds f32 [32, 16]"));
  }
  SECTION("missing directory is a usage error") {
    CHECK(error_of([&] { Checkpoint::open(run + "/nowhere"); }).code() == forge::ExitCode::kUsage);
  }
}

TEST_CASE("a save that cannot write fails without a checkpoint, and repeated failures stop the run (74)") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  const std::string good = saved(run, 1);
  // Replace the recovery tier directory by a file: no save can create its directory there.
  fs::rename(tier_dir(run, Tier::kRecovery), run + "/moved");
  std::ofstream(tier_dir(run, Tier::kRecovery)) << "not a directory";
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run, AsyncPolicy::kWait, 3, 2});
  const RankState st = rank_state(1, 1, 0, 2);
  const SaveEvent e = saver.save(Tier::kRecovery, meta_for(2), st.tensors());
  CHECK(e.outcome == Outcome::kFailed);
  CHECK(mentions(forge::Error(forge::ExitCode::kIo, e.error), tier_dir(run, Tier::kRecovery)));
  auto stop = error_of([&] { saver.save(Tier::kRecovery, meta_for(3), st.tensors()); });
  CHECK(stop.code() == forge::ExitCode::kIo);
  CHECK(mentions(stop, "2 checkpoint saves in a row failed"));
  const auto events = saver.take_events();
  REQUIRE(events.size() >= 1);
  CHECK(events[0].outcome == Outcome::kFailed);
}
