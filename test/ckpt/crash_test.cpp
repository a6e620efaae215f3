// The commit protocol under crashes and full disks: whatever happens, every checkpoint that readers
// take for valid verifies and holds the data of its step, and the previous checkpoints survive.
#include "support.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/maintenance.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

using namespace forge::ckpt;
using namespace forge::ckpt::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kStepsPerChild = 1000;

// The training state of `step`: big tensors as of the child's first step, "param/scale" of this step.
void set_step(RankState& st, int64_t step) {
  for (size_t i = 0; i < st.slices.size(); ++i)
    if (st.slices[i].name == "param/scale") st.data[i][0] = value_at("param/scale", 0, step);
}

// Every committed checkpoint verifies and holds its step's data.
void check_invariant(const std::string& run, int64_t scale) {
  for (const auto& e : list_checkpoints(run)) {
    INFO("checkpoint " << e.path);
    const Checkpoint c = Checkpoint::open(e.path);
    c.verify();
    REQUIRE(c.manifest().meta.step == e.step);
    float scale_value = 0;
    std::vector<float> emb(32 * scale * 16);
    c.read({TensorRequest{Slice::whole("param/scale", {}), &scale_value},
            TensorRequest{Slice::whole("adam_v/emb", {32 * scale, 16}), emb.data()}});
    REQUIRE(scale_value == value_at("param/scale", 0, e.step));
    const int64_t base = e.step / kStepsPerChild * kStepsPerChild;
    REQUIRE(emb == expected_data(Slice::whole("adam_v/emb", {32 * scale, 16}), base));
  }
}

int staging_dirs(const std::string& run) {
  int n = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(tier_dir(run, Tier::kRecovery), ec))
    n += d.path().filename().string().rfind(".step-", 0) == 0 ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("SIGKILL at random moments of repeated saves never leaves a half checkpoint marked valid") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  constexpr int64_t kScale = 1500;  // ~9 MB per checkpoint: a save takes a few tens of ms here
  std::mt19937 rng(20240611);
  int killed_mid_save = 0;
  int64_t newest_before = -1;
  for (int round = 0; round < 30; ++round) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(ready[0]);
      SingleProcessCoordinator coord;
      Saver saver(coord, SaverOptions{run, AsyncPolicy::kWait, 2});
      const int64_t base = (round + 1) * kStepsPerChild;
      RankState st = rank_state(1, 1, 0, base, kScale);
      (void)!::write(ready[1], "r", 1);
      for (int64_t step = base;; ++step) {
        set_step(st, step);
        saver.save(Tier::kRecovery, meta_for(step), st.tensors());
      }
    }
    ::close(ready[1]);
    char c;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 120000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    killed_mid_save += staging_dirs(run) > 0 ? 1 : 0;
    check_invariant(run, kScale);
    const auto now = list_checkpoints(run);
    // The newest checkpoint before this round is still there, or something newer replaced it.
    if (newest_before >= 0) {
      REQUIRE_FALSE(now.empty());
      CHECK(now.back().step >= newest_before);
    }
    if (!now.empty()) newest_before = now.back().step;
    if (round % 3 == 2) collect_garbage(run, 2, false);
  }
  INFO("rounds that killed a save in progress: " << killed_mid_save);
  CHECK(killed_mid_save > 0);
  collect_garbage(run, 2, false);
  CHECK(staging_dirs(run) == 0);
  check_invariant(run, kScale);
}

namespace {

// A small tmpfs mounted for the test, unmounted at the end.
struct SmallDisk {
  std::string path;
  bool mounted = false;
  SmallDisk(const std::string& where, const char* size) : path(where) {
    fs::create_directories(path);
    mounted = ::mount("tmpfs", path.c_str(), "tmpfs", 0, size) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
  }
};

}  // namespace

TEST_CASE("disk full and read-only during a save: the save fails cleanly and the previous checkpoint stays") {
  forge::test::TempDir tmp;
  SmallDisk disk(tmp / "small", "size=2m");
  if (!disk.mounted) {
    WARN("skipped: cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): " << std::strerror(errno));
    return;
  }
  const std::string run = disk.path + "/run";
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run, AsyncPolicy::kWait, 3, 3});
  RankState small = rank_state(1, 1, 0, 0);
  set_step(small, 1);
  REQUIRE(saver.save(Tier::kRecovery, meta_for(1), small.tensors()).outcome == Outcome::kCommitted);

  const RankState big = rank_state(1, 1, 0, 0, 500);  // ~3 MB: does not fit
  SaveEvent e = saver.save(Tier::kRecovery, meta_for(2), big.tensors());
  CHECK(e.outcome == Outcome::kFailed);
  CHECK(e.error.find("disk is full") != std::string::npos);
  REQUIRE(list_checkpoints(run).size() == 1);
  CHECK(staging_dirs(run) == 0);  // the failed save cleaned up after itself
  Checkpoint::open(checkpoint_dir(run, Tier::kRecovery, 1)).verify();

  // Asynchronous: the failure arrives at wait(); then space is back and the run goes on.
  CHECK(saver.save_async(Tier::kRecovery, meta_for(3), big.tensors()).outcome == Outcome::kPending);
  CHECK(saver.wait()->outcome == Outcome::kFailed);
  CHECK(saver.consecutive_failures() == 2);
  set_step(small, 4);
  REQUIRE(saver.save(Tier::kRecovery, meta_for(4), small.tensors()).outcome == Outcome::kCommitted);
  CHECK(saver.consecutive_failures() == 0);
  check_invariant(run, 1);

  REQUIRE(::mount("tmpfs", disk.path.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=2m") == 0);
  set_step(small, 5);
  e = saver.save(Tier::kRecovery, meta_for(5), small.tensors());
  CHECK(e.outcome == Outcome::kFailed);
  CHECK(e.error.find("Read-only") != std::string::npos);
  const auto left = list_checkpoints(run);
  REQUIRE(left.size() == 2);
  CHECK(left.back().step == 4);
  check_invariant(run, 1);
}
