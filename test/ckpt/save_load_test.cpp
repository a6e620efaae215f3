#include "support.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/maintenance.h"
#include "forge/ckpt/resume.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <array>
#include <filesystem>
#include <stdexcept>

using namespace forge::ckpt;
using namespace forge::ckpt::test;
namespace fs = std::filesystem;

namespace {

// Saves step `step` on tp x dp ranks; returns rank 0's event.
SaveEvent save_on(const std::string& run, int tp, int dp, int64_t step, Tier tier = Tier::kRecovery,
                  int keep = 3) {
  SaveEvent out;
  run_ranks(tp * dp, [&](Coordinator& coord) {
    Saver saver(coord, SaverOptions{run, AsyncPolicy::kWait, keep});
    const RankState st = rank_state(tp, dp, coord.rank(), step);
    const SaveEvent e = saver.save(tier, meta_for(step, tp, dp), st.tensors());
    if (coord.rank() == 0) out = e;
  });
  return out;
}

// Loads the checkpoint on tp x dp ranks with their own pieces and checks every element bit for bit.
void load_and_check(const std::string& dir, int tp, int dp, int64_t step) {
  run_ranks(tp * dp, [&](Coordinator& coord) {
    const Checkpoint c = Checkpoint::open(dir);
    RankState want = rank_state(tp, dp, coord.rank(), step);
    std::vector<std::vector<float>> got(want.slices.size());
    std::vector<TensorRequest> req;
    for (size_t i = 0; i < want.slices.size(); ++i) {
      got[i].assign(want.data[i].size(), -1.0f);
      req.push_back(TensorRequest{want.slices[i], got[i].data()});
    }
    c.read(req);
    // Catch2 assertions are not thread-safe: a rank reports a mismatch by throwing.
    for (size_t i = 0; i < want.slices.size(); ++i)
      if (got[i] != want.data[i])
        throw std::runtime_error(want.slices[i].name + " differs on rank " + std::to_string(coord.rank()));
  });
}

}  // namespace

TEST_CASE("single-process save commits a complete checkpoint that loads bit for bit") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  const SaveEvent e = save_on(run, 1, 1, 5);
  CHECK(e.outcome == Outcome::kCommitted);
  CHECK(e.stall_s > 0);
  CHECK(e.path == checkpoint_dir(run, Tier::kRecovery, 5));
  const Checkpoint c = Checkpoint::open(e.path);
  c.verify();
  const Manifest& m = c.manifest();
  CHECK(m.meta.step == 5);
  CHECK(m.meta.tokens == 5 * 4096);
  CHECK(m.meta.spec_hash == "spec-abc");
  CHECK(m.meta.data_cursor == forge::Json({{"shard", 0}, {"offset", 40}}));
  CHECK(m.meta.rng["counter"] == 5);
  CHECK(c.verification_bytes() == "batch-bytes-5");
  CHECK(m.files.count("manifest.json") == 0);
  CHECK(m.files.count("index.json") == 1);
  CHECK(c.tensors().size() == test_model().size());
  CHECK(c.tensors().at("param/emb").shape == std::vector<int64_t>{32, 16});
  load_and_check(e.path, 1, 1, 5);
  // Only the final directory remains: no staging leftovers.
  int entries = 0;
  for (const auto& d : fs::directory_iterator(tier_dir(run, Tier::kRecovery)))
    entries += d.path().filename() != "" ? 1 : 0;
  CHECK(entries == 1);
}

TEST_CASE(
    "a checkpoint saved on 4 ranks (tp2 x dp2, ZeRO ranges) loads on 2 ranks and 1 rank of other layouts") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  const SaveEvent e = save_on(run, 2, 2, 7);
  REQUIRE(e.outcome == Outcome::kCommitted);
  const Checkpoint c = Checkpoint::open(e.path);
  c.verify();
  CHECK(c.manifest().world_size == 4);
  // Replicated params are written once: tp pieces only; ZeRO-cut adam states: tp x dp pieces.
  CHECK(c.tensors().at("param/emb").pieces.size() == 2);
  CHECK(c.tensors().at("param/ln.weight").pieces.size() == 1);
  CHECK(c.tensors().at("adam_m/emb").pieces.size() == 4);
  load_and_check(e.path, 1, 2, 7);
  load_and_check(e.path, 2, 1, 7);
  load_and_check(e.path, 4, 1, 7);
  load_and_check(e.path, 1, 1, 7);
}

TEST_CASE("replicas share the writing: every rank of a dp-only layout writes part of the data") {
  forge::test::TempDir tmp;
  const SaveEvent e = save_on(tmp.path().string(), 1, 4, 3);
  REQUIRE(e.outcome == Outcome::kCommitted);
  const Checkpoint c = Checkpoint::open(e.path);
  int parts = 0;
  for (const auto& [name, f] : c.manifest().files) parts += name.rfind("rank-", 0) == 0 ? 1 : 0;
  CHECK(parts == 4);
  load_and_check(e.path, 2, 2, 3);
}

TEST_CASE("async saves: events, skip policy, retention and newest-first resume") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  SaverOptions opt{run, AsyncPolicy::kWait, 2};
  SingleProcessCoordinator coord;
  {
    Saver saver(coord, opt);
    for (int64_t step = 1; step <= 4; ++step) {
      const RankState st = rank_state(1, 1, 0, step);
      const SaveEvent started = saver.save_async(Tier::kRecovery, meta_for(step), st.tensors());
      CHECK(started.outcome == Outcome::kPending);
    }
    const auto last = saver.wait();
    REQUIRE(last);
    CHECK(last->outcome == Outcome::kCommitted);
    CHECK(last->step == 4);
    const auto events = saver.take_events();
    REQUIRE(events.size() == 4);
    for (const auto& ev : events) CHECK(ev.outcome == Outcome::kCommitted);
    CHECK(saver.take_events().empty());
    CHECK_FALSE(saver.wait());  // nothing in flight
  }
  // keep 2: steps 3 and 4 remain.
  const auto left = list_checkpoints(run);
  REQUIRE(left.size() == 2);
  CHECK(left[0].step == 3);
  CHECK(left[1].step == 4);

  opt.policy = AsyncPolicy::kSkip;
  Saver saver(coord, opt);
  const RankState big = rank_state(1, 1, 0, 9, 4000);  // several MB, so the first save is still in flight
  CHECK(saver.save_async(Tier::kMilestone, meta_for(9), big.tensors()).outcome == Outcome::kPending);
  const SaveEvent second = saver.save_async(Tier::kRecovery, meta_for(10), big.tensors());
  CHECK((second.outcome == Outcome::kSkipped || second.outcome == Outcome::kPending));
  saver.wait();
  auto resumed = open_for_resume(coord, run, Expectations{});
  REQUIRE(resumed);
  CHECK(resumed->manifest().meta.step == (second.outcome == Outcome::kSkipped ? 9 : 10));
}

TEST_CASE("resume falls back past a damaged checkpoint and checks model config and dataset") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  save_on(run, 2, 1, 10);
  save_on(run, 2, 1, 20);
  SingleProcessCoordinator coord;
  {
    auto c = open_for_resume(coord, run, Expectations{});
    REQUIRE(c);
    CHECK(c->manifest().meta.step == 20);
  }
  // Flip one byte of a data file of step 20.
  const std::string bad = checkpoint_dir(run, Tier::kRecovery, 20) + "/rank-00001.bin";
  {
    std::string bytes = forge::read_file(bad);
    bytes[bytes.size() / 2] ^= 0x40;
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
  }
  std::array<int64_t, 2> resumed{};
  run_ranks(2, [&](Coordinator& c2) {
    auto c = open_for_resume(c2, run, Expectations{});
    resumed[c2.rank()] = c ? c->manifest().meta.step : -1;
  });
  CHECK(resumed == std::array<int64_t, 2>{10, 10});
  Expectations other_model;
  other_model.model_config = forge::Json{{"layers", 2}, {"d_model", 16}, {"vocab", 32}};
  try {
    open_for_resume(coord, run, other_model);
    FAIL("no error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK(std::string(e.what()).find("model.layers: checkpoint 1, expected 2") != std::string::npos);
  }
  Expectations other_data;
  other_data.dataset_version = "ds-2";
  try {
    open_for_resume(coord, run, other_data);
    FAIL("no error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(std::string(e.what()).find("ds-2") != std::string::npos);
  }
  forge::test::TempDir empty;
  CHECK_FALSE(open_for_resume(coord, empty.path().string(), Expectations{}));
}

TEST_CASE("promotion records the verdict; retention skips locked checkpoints; gc removes crash leftovers") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  save_on(run, 1, 1, 1, Tier::kRecovery, 1);
  const std::string release = promote(checkpoint_dir(run, Tier::kRecovery, 1), forge::Json{{"pass", true}});
  CHECK(release == checkpoint_dir(run, Tier::kRelease, 1));
  {
    const Checkpoint r = Checkpoint::open(release);
    r.verify();
    CHECK(r.manifest().tier == "release");
    CHECK(r.manifest().promotion["verdict"]["pass"] == true);
  }
  CHECK_THROWS_AS(promote(checkpoint_dir(run, Tier::kRecovery, 1), forge::Json::object()), forge::Error);

  {
    const Checkpoint reading = Checkpoint::open(checkpoint_dir(run, Tier::kRecovery, 1));
    save_on(run, 1, 1, 2, Tier::kRecovery, 1);  // keep 1, but step 1 is being read
    CHECK(fs::exists(checkpoint_dir(run, Tier::kRecovery, 1)));
  }
  // A crash leftover and an uncommitted directory.
  fs::create_directories(tier_dir(run, Tier::kRecovery) + "/.step-00000003.partial-dead");
  fs::create_directories(checkpoint_dir(run, Tier::kRecovery, 4));
  GcReport dry = collect_garbage(run, 1, true);
  CHECK(dry.removed.size() == 3);  // two leftovers and step 1 (retention)
  CHECK(fs::exists(checkpoint_dir(run, Tier::kRecovery, 4)));
  GcReport r = collect_garbage(run, 1, false);
  CHECK(r.removed.size() == 3);
  CHECK(r.newest_valid == checkpoint_dir(run, Tier::kRecovery, 2));
  CHECK_FALSE(fs::exists(checkpoint_dir(run, Tier::kRecovery, 1)));
  CHECK_FALSE(fs::exists(checkpoint_dir(run, Tier::kRecovery, 4)));
  CHECK(fs::exists(release));  // hard links survive the source's removal
  Checkpoint::open(release).verify();
}

TEST_CASE("saving the same step again replaces the committed checkpoint atomically") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  save_on(run, 1, 1, 5);
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run});
  RankState st = rank_state(1, 1, 0, 6);  // other contents, same step number
  REQUIRE(saver.save(Tier::kRecovery, meta_for(5), st.tensors()).outcome == Outcome::kCommitted);
  const Checkpoint c = Checkpoint::open(checkpoint_dir(run, Tier::kRecovery, 5));
  c.verify();
  std::vector<float> got(32 * 16);
  c.read({TensorRequest{Slice::whole("param/emb", {32, 16}), got.data()}});
  CHECK(got[3] == value_at("param/emb", 3, 6));
  CHECK(list_checkpoints(run).size() == 1);
}

TEST_CASE("the manifest keeps all five layout dimensions; one written before cp and ep reads them as 1") {
  Manifest m;
  m.tier = "recovery";
  m.meta = meta_for(3, 2, 2);
  m.meta.layout.cp = 2, m.meta.layout.ep = 2, m.meta.layout.pp = 3;
  forge::Json j = m.to_json();
  CHECK(Manifest::from_json(j, "manifest.json").meta.layout == m.meta.layout);
  j["layout"].erase("cp");
  j["layout"].erase("ep");
  CHECK(Manifest::from_json(j, "manifest.json").meta.layout == forge::Layout{.tp = 2, .dp = 2, .pp = 3});
}
