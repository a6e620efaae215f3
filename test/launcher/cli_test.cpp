// forge-train as users and sbatch scripts see it: outputs, exit codes and one-line errors.
#include "dataio/dataset_fixture.h"
#include "forge/common/json.h"
#include "forge/dataio/manifest.h"
#include "support/paths.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

using Result = forge::test::CommandResult;

Result run(const std::string& args) {
  return forge::test::run_command(forge::test::env_path("FORGE_TRAIN_BIN") + " " + args);
}

// A fast model: a few steps take well under a second.
std::string tiny(const forge::test::TempDir& dir) {
  return forge::test::source_path("configs/tiny.ini") + " --run.dir=" + (dir / "run") +
         " --run.threads=1 --run.peak_gflops=50 --model.d_model=32 --model.seq_len=32 --model.vocab=128";
}

std::string last_line(const std::string& s) {
  const auto end = s.find_last_not_of('\n');
  const auto start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1,
                  end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace

TEST_CASE("forge-train trains and writes metrics and a summary", "[launcher]") {
  forge::test::TempDir dir;
  const Result r = run(tiny(dir) + " --run.steps=4");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("step 4/4 loss"));
  std::ifstream metrics(dir / "run/metrics/rank-0.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto rec = forge::Json::parse(line);
    ++lines;
    CHECK(rec["step"] == lines);
    for (const char* key :
         {"loss", "grad_norm", "lr", "tokens", "step_ms", "tokens_per_s", "mfu", "spec_hash"})
      CHECK(rec.contains(key));
    CHECK(rec["tokens"] == lines * 4 * 32);
  }
  CHECK(lines == 4);
  const auto summary = forge::read_json(dir / "run/summary.json");
  CHECK(summary["steps"] == 4);
  CHECK(summary["tokens"] == 4 * 4 * 32);
  CHECK(summary["exit_class"] == "ok");
  CHECK(summary["mean_mfu"].get<double>() > 0);
}

TEST_CASE("--print-config prints the resolved spec and trains nothing", "[launcher]") {
  forge::test::TempDir dir;
  const Result r = run(tiny(dir) + " --print-config --run.steps=7");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("# spec hash ") && Catch::Contains("steps = 7") &&
                           Catch::Contains("[model]") && Catch::Contains("d_model = 32"));
  CHECK_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("an inconsistent spec exits 64 naming key, place and rule, before any output", "[launcher]") {
  forge::test::TempDir dir;
  const std::string spec =
      dir.write("bad.ini", "[run]\ndir = " + (dir / "run") + "\n[model]\nd_model = 100\nheads = 3\n");
  Result r = run(spec);
  CHECK(r.code == 64);
  CHECK_THAT(r.output,
             Catch::Contains(spec + ":4: model.d_model = 100: must be divisible by model.heads = 3"));
  CHECK(r.output.find('\n') == r.output.size() - 1);  // one line
  CHECK_FALSE(fs::exists(dir / "run"));

  r = run(tiny(dir) + " --model.max_positions=16");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("model.seq_len = 32: must not exceed model.max_positions = 16"));
  r = run(tiny(dir) + " --model.layers=0");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("model.layers = 0: must be a positive integer"));
  r = run(tiny(dir) + " --model.layrs=3");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("did you mean 'model.layers'"));
  r = run("");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("forge-train: error: missing SPEC.ini"));
  CHECK_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("a vocabulary that differs from the dataset's tokenizer exits 64", "[launcher]") {
  forge::test::TempDir dir;
  fs::create_directories(dir / "data");
  forge::data::Manifest m;
  m.vocab_size = 300;
  forge::data::write_manifest(dir / "data", m);
  const Result r = run(tiny(dir) + " --data.dataset=" + (dir / "data"));
  CHECK(r.code == 64);
  CHECK_THAT(r.output,
             Catch::Contains("model.vocab = 128: must equal the vocabulary of the dataset's tokenizer "
                             "(300"));
  CHECK_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("forge-train reads a prepared dataset directory", "[launcher]") {
  forge::test::TempDir dir;
  forge::test::make_fixture_dataset(dir / "data", {{"web", {400, 300, 500, 200}, 2}}, 128);
  const Result r = run(tiny(dir) + " --run.steps=3 --data.dataset=" + (dir / "data"));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("on dataset " + (dir / "data")));
  const auto summary = forge::read_json(dir / "run/summary.json");
  CHECK(summary["steps"] == 3);
  CHECK(summary["exit_class"] == "ok");
}

TEST_CASE("a NaN loss exits 71 naming the step, with a summary that says so", "[launcher]") {
  forge::test::TempDir dir;
  // An absurd learning rate blows the weights up after the first update; no non-finite step tolerated.
  Result r = run(tiny(dir) + " --run.steps=5 --optim.lr=1e30 --optim.min_lr=0 --guard.max_bad_steps=0");
  INFO(r.output);
  CHECK(r.code == 71);
  CHECK_THAT(last_line(r.output),
             Catch::Contains("forge-train: error: step 2: loss NaN") &&
                 Catch::Contains("more than guard.max_bad_steps = 0 (guard.nonfinite = skip)"));
  auto summary = forge::read_json(dir / "run/summary.json");
  CHECK(summary["exit_class"] == "numeric");
  CHECK(summary["steps"] == 1);

  // Skipping cannot repair blown-up weights: the default policy gives up after guard.max_bad_steps.
  r = run(tiny(dir) + " --run.steps=8 --optim.lr=1e30 --optim.min_lr=0");
  CHECK(r.code == 71);
  CHECK_THAT(last_line(r.output), Catch::Contains("step 5: loss NaN") &&
                                      Catch::Contains("4 consecutive non-finite steps, more than "
                                                      "guard.max_bad_steps = 3"));
  summary = forge::read_json(dir / "run/summary.json");
  CHECK(summary["steps"] == 4);
  CHECK(summary["guard"]["skipped_steps"] == 3);
}

TEST_CASE("run.objective = sft trains the replies a chat dataset's loss masks mark", "[launcher][sft]") {
  forge::test::TempDir dir;
  forge::test::make_fixture_dataset(dir / "chat", {{"chat", {400, 30, 500, 45, 200, 90, 64}, 2}}, 128, true);
  forge::test::make_fixture_dataset(dir / "text", {{"web", {400, 300, 500, 200}, 2}}, 128);
  // Scored tokens per step, from the metrics.
  const auto scored = [&](const std::string& objective) {
    fs::remove_all(dir / "run");
    const Result r =
        run(tiny(dir) + " --run.steps=3 --data.document_mask=true --data.dataset=" + (dir / "chat") +
            " --run.objective=" + objective);
    INFO(r.output);
    REQUIRE(r.code == 0);
    std::vector<double> out;
    std::ifstream metrics(dir / "run/metrics/rank-0.jsonl");
    for (std::string line; std::getline(metrics, line);)
      out.push_back(forge::Json::parse(line)["scored_tokens"]);
    REQUIRE(out.size() == 3);
    return out;
  };
  const std::vector<double> lm = scored("lm"), sft = scored("sft");
  for (size_t s = 0; s < 3; ++s) {
    INFO("step " << s + 1);
    CHECK(lm[s] > 4 * 32 - 4 * 4);  // every target but those opening a document (a few per row)
    CHECK(sft[s] > 0);
    CHECK(sft[s] < 0.8 * lm[s]);  // the fixture masks about a third, and each row's head before its start
  }
  // What sft needs, refused before training: a chat dataset.
  fs::remove_all(dir / "run");
  Result r = run(tiny(dir) + " --run.objective=sft --data.dataset=" + (dir / "text"));
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("run.objective = sft: sft needs a chat or image-text dataset") &&
                           Catch::Contains("--format chat"));
  r = run(tiny(dir) + " --run.objective=sft");
  CHECK(r.code == 64);
  CHECK_THAT(r.output,
             Catch::Contains("sft needs a chat or image-text dataset (the synthetic stream has none)"));
  // Pictures (an image-text manifest of 32-pixel pictures in 8-pixel patches): a model without a vision
  // tower, a tower of another picture size, or an objective that would score the pictures' placeholders.
  fs::copy(dir / "text", dir / "pictures", fs::copy_options::recursive);
  forge::data::Manifest pictures = forge::data::load_manifest(dir / "pictures");
  pictures.format = "image-text";
  pictures.settings["image"] = {{"size", 32}, {"patch", 8}};
  forge::data::write_manifest(dir / "pictures", pictures);
  const std::string on_pictures = tiny(dir) + " --data.dataset=" + (dir / "pictures");
  for (const char* objective : {"lm", "sft"}) {
    r = run(on_pictures + " --run.objective=" + objective);
    CHECK(r.code == 64);
    CHECK_THAT(r.output, Catch::Contains("data.dataset") && Catch::Contains("no vision tower"));
  }
  const std::string vlm = on_pictures + " --model.positions=rope --vision.layers=1 --vision.patch=8";
  r = run(vlm + " --run.objective=lm --vision.image_size=32");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("run.objective") && Catch::Contains("train it with sft"));
  r = run(vlm + " --run.objective=sft --vision.image_size=16");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("vision.image_size = 16") && Catch::Contains("32 x 32 pixels"));
  r = run(tiny(dir) + " --run.objective=reinforce");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("run.objective"));
  CHECK_FALSE(fs::exists(dir / "run"));
}
