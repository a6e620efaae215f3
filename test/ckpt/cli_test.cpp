// forge-ckpt as scripts use it: exit codes, one-line errors, --json, and the HDF5 export read by h5py.
#include "support.h"
#include "support/paths.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace forge::ckpt;
using namespace forge::ckpt::test;
namespace fs = std::filesystem;

namespace {

using Result = forge::test::CommandResult;

Result run_cli(const std::string& args) {
  return forge::test::run_command(forge::test::env_path("FORGE_CKPT_BIN") + " " + args);
}

void save_steps(const std::string& run, std::initializer_list<int64_t> steps) {
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run});
  for (int64_t s : steps) {
    const RankState st = rank_state(1, 1, 0, s);
    REQUIRE(saver.save(Tier::kRecovery, meta_for(s), st.tensors()).outcome == Outcome::kCommitted);
  }
}

}  // namespace

TEST_CASE("forge-ckpt list, inspect, verify and their exit codes") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  save_steps(run, {10, 20});
  const std::string ck = checkpoint_dir(run, Tier::kRecovery, 20);

  Result r = run_cli("list " + run);
  CHECK(r.code == 0);
  CHECK(r.output.find("recovery") != std::string::npos);
  CHECK(r.output.find("0.4762") != std::string::npos);  // loss of step 20
  r = run_cli("list " + run + " --json");
  REQUIRE(r.code == 0);
  const auto first = forge::Json::parse(r.output.substr(0, r.output.find('\n')));
  CHECK(first["step"] == 10);
  CHECK(first["state"] == "committed");

  r = run_cli("inspect " + ck + " --json");
  REQUIRE(r.code == 0);
  const auto doc = forge::Json::parse(r.output);
  CHECK(doc["step"] == 20);
  CHECK(doc["layout"]["tp"] == 1);
  CHECK(doc["tensors"].size() == test_model().size());
  CHECK(run_cli("inspect " + ck).output.find("param/blocks.0.w1") != std::string::npos);

  CHECK(run_cli("verify " + ck).code == 0);
  CHECK(run_cli("verify " + run).code == 0);
  const std::string cfg = tmp.write("model.json", R"({"layers": 1, "d_model": 32, "vocab": 32})");
  r = run_cli("verify " + ck + " --model-config " + cfg);
  CHECK(r.code == 64);
  CHECK(r.output.find("model.d_model: checkpoint 16, expected 32") != std::string::npos);
  r = run_cli("verify " + ck + " --dataset-version ds-9");
  CHECK(r.code == 65);
  CHECK(r.output.find("ds-9") != std::string::npos);

  {
    std::fstream f(ck + "/rank-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    f.put('\x7f');
  }
  r = run_cli("verify " + ck);
  CHECK(r.code == 65);
  CHECK(r.output.find("forge-ckpt: error:") == 0);
  CHECK(r.output.find("rank-00000.bin") != std::string::npos);
  CHECK(run_cli("verify " + run).code == 65);

  CHECK(run_cli("").code == 64);
  CHECK(run_cli("frobnicate").code == 64);
  CHECK(run_cli("list").code == 64);
  CHECK(run_cli("list " + run + "/missing").code == 64);
  CHECK(run_cli("list --help").code == 0);
}

TEST_CASE("forge-ckpt promote, gc and advise") {
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  save_steps(run, {1, 2, 3, 4});
  const std::string verdict = tmp.write("verdict.json", R"({"pass": true, "gate": "unit"})");
  const std::string registry = tmp / "registry/registry.db";
  Result r = run_cli("promote " + checkpoint_dir(run, Tier::kRecovery, 4) + " --verdict " + verdict +
                     " --registry " + registry + " --name unit --json");
  REQUIRE(r.code == 0);
  const auto promoted = forge::Json::parse(r.output);
  CHECK(promoted["release"] == checkpoint_dir(run, Tier::kRelease, 4));
  CHECK(promoted["registered"] == "unit:1");  // promotion registers the release
  CHECK(run_cli("promote " + checkpoint_dir(run, Tier::kRecovery, 4) + " --verdict " + verdict +
                " --registry " + registry)
            .code == 64);
  // A registry that cannot be written: promoted all the same, with a warning naming the remedy.
  const std::string other = tmp / "other";
  save_steps(other, {1});
  r = run_cli("promote " + checkpoint_dir(other, Tier::kRecovery, 1) + " --verdict " + verdict +
              " --registry " + verdict + "/registry.db");
  CHECK(r.code == 0);
  CHECK(r.output.find("is not registered") != std::string::npos);
  CHECK(r.output.find("forge-ckpt registry add") != std::string::npos);
  r = run_cli("registry list --registry " + registry + " --json");
  REQUIRE(r.code == 0);
  CHECK(forge::Json::parse(r.output)["ref"] == "unit:1");

  fs::create_directories(tier_dir(run, Tier::kRecovery) + "/.step-00000005.partial-x");
  r = run_cli("gc " + run + " --keep 2 --json");
  REQUIRE(r.code == 0);
  const auto gc = forge::Json::parse(r.output);
  CHECK(gc["removed"].size() == 2);  // the leftover, and step 2 (steps 2-4 were kept with keep 3)
  CHECK(list_checkpoints(run, Tier::kRecovery).size() == 2);

  r = run_cli("advise " + run + " --mtbf-hours 4 --json");
  REQUIRE(r.code == 0);
  const auto a = forge::Json::parse(r.output);
  CHECK(a["optimal_interval_s"].get<double>() ==
        Approx(std::sqrt(2 * a["stall_s"].get<double>() * 4 * 3600)));
  r = run_cli("advise --stall-s 2 --mtbf-hours 1 --step-s 0.5 --every 100");
  CHECK(r.code == 0);
  CHECK(r.output.find("120 s") != std::string::npos);  // sqrt(2 * 2 * 3600)
  CHECK(r.output.find("ckpt.recovery_every 240") != std::string::npos);
  CHECK(run_cli("advise --mtbf-hours 1").code == 64);
}

TEST_CASE("forge-ckpt export writes an HDF5 file h5py reads with the logical shapes") {
  // scripts/install-deps.sh installs h5py: without it this check would prove nothing, so it fails.
  INFO("/usr/bin/python3 cannot import h5py: install Debian's python3-h5py (scripts/install-deps.sh)");
  REQUIRE(std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") == 0);
  forge::test::TempDir tmp;
  const std::string run = tmp.path().string();
  {
    forge::ckpt::test::run_ranks(2, [&](Coordinator& coord) {  // saved sharded: the export is whole tensors
      Saver saver(coord, SaverOptions{run});
      const RankState st = rank_state(2, 1, coord.rank(), 3);
      saver.save(Tier::kMilestone, meta_for(3, 2, 1), st.tensors());
    });
  }
  const std::string out = tmp / "model.h5";
  Result r = run_cli("export " + checkpoint_dir(run, Tier::kMilestone, 3) + " --out " + out);
  REQUIRE(r.code == 0);
  const std::string py = tmp.write("check.py", R"(
import h5py, json, sys
f = h5py.File(sys.argv[1], "r")
w = f["param/blocks.0.w1"][...]
print(f.attrs["step"], w.shape, w.dtype, w[1, 2].tobytes().hex(), json.loads(f.attrs["model_config"])["d_model"],
      "adam_m" in f, f["param/scale"].shape)
)");
  const std::string cmd = "/usr/bin/python3 " + py + " " + out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[512] = {};
  REQUIRE(fread(buf, 1, sizeof buf - 1, p) > 0);
  ::pclose(p);
  const float v = value_at("param/blocks.0.w1", 1 * 24 + 2, 3);
  unsigned char bytes[4];
  std::memcpy(bytes, &v, 4);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", bytes[0], bytes[1], bytes[2], bytes[3]);
  const std::string want = std::string("3 (16, 24) float32 ") + hex + " 16 True ()";
  CHECK(std::string(buf).substr(0, want.size()) == want);

  CHECK(run_cli("export " + checkpoint_dir(run, Tier::kMilestone, 3) + " --out " + tmp / "p.h5 --params-only")
            .code == 0);
  CHECK(run_cli("export " + checkpoint_dir(run, Tier::kMilestone, 3) + " --out " + tmp / "nodir/x.h5").code ==
        74);
  CHECK_FALSE(fs::exists(tmp / "nodir"));
}
