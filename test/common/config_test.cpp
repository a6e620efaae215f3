#include "forge/common/config.h"
#include "forge/common/error.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

using forge::Config;
using forge::ConfigSchema;
using forge::Error;
using forge::ExitCode;

namespace {

ConfigSchema job_schema() {
  ConfigSchema s;
  s.add<std::string>("run.name", "run", "name")
      .add<int>("run.steps", 10, "steps")
      .add<int>("model.layers", 2, "layers")
      .add<int>("model.d_model", 64, "width")
      .add<double>("optim.lr", 3e-4, "learning rate")
      .add<bool>("ckpt.async", true, "async save")
      .add_choice("precision.dtype", "fp32", {"fp32", "bf16"}, "dtype");
  return s;
}

// Runs `body`, expects a forge::Error with the given code, and returns its message.
template <typename F>
std::string error_of(F&& body, ExitCode code = ExitCode::kUsage) {
  try {
    body();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  FAIL("expected a forge::Error");
  return "";
}

}  // namespace

TEST_CASE("INI values are typed and defaults fill the rest") {
  forge::test::TempDir dir;
  const auto path = dir.write("job.ini", "# comment\n[run]\nname = demo\nsteps = 7\n\n[optim]\nlr = 0.001\n");
  const Config c = forge::load_config(job_schema(), path, {});
  CHECK(c.get<std::string>("run.name") == "demo");
  CHECK(c.get<int>("run.steps") == 7);
  CHECK(c.get<double>("optim.lr") == Approx(0.001));
  CHECK(c.get<int>("model.layers") == 2);
  CHECK(c.source("run.steps") == path + ":4");
  CHECK(c.source("model.layers") == "default");
}

TEST_CASE("command-line overrides win over the file, in both spellings") {
  forge::test::TempDir dir;
  const auto path = dir.write("job.ini", "[run]\nsteps = 7\n");
  const Config c = forge::load_config(job_schema(), path, {"--run.steps=9", "--model.layers", "4"});
  CHECK(c.get<int>("run.steps") == 9);
  CHECK(c.get<int>("model.layers") == 4);
  CHECK(c.source("run.steps") == "command line");
}

TEST_CASE("unknown keys name file, line and a close match") {
  forge::test::TempDir dir;
  const auto path = dir.write("job.ini", "[run]\nsteps = 7\n[model]\nlayer = 3\n");
  const std::string msg = error_of([&] { forge::load_config(job_schema(), path, {}); });
  CHECK(msg == path + ":4: unknown key 'model.layer'; did you mean 'model.layers'?");

  const std::string cli = error_of([&] { forge::load_config(job_schema(), "", {"--optim.lrr=1"}); });
  CHECK(cli == "command line: unknown key 'optim.lrr'; did you mean 'optim.lr'?");

  const std::string far = error_of([&] { forge::load_config(job_schema(), "", {"--zzz.qqqqqq=1"}); });
  CHECK(far == "command line: unknown key 'zzz.qqqqqq'");
}

TEST_CASE("bad values name the key, the line and the expected type") {
  forge::test::TempDir dir;
  const auto path = dir.write("job.ini", "[run]\nsteps = many\n");
  const std::string msg = error_of([&] { forge::load_config(job_schema(), path, {}); });
  CHECK(msg.find(path + ":2: run.steps: bad value (expected an integer)") == 0);

  const std::string choice =
      error_of([&] { forge::load_config(job_schema(), "", {"--precision.dtype=fp8"}); });
  CHECK(choice == "command line: precision.dtype = fp8: must be one of: fp32, bf16");
}

TEST_CASE("malformed lines, duplicates and missing files are usage errors") {
  forge::test::TempDir dir;
  CHECK(error_of([&] {
          forge::load_config(job_schema(), dir.write("a.ini", "[run\n"), {});
        }).find("a.ini:1: malformed section header") != std::string::npos);
  CHECK(error_of([&] {
          forge::load_config(job_schema(), dir.write("b.ini", "[run]\njust words\n"), {});
        }).find("b.ini:2: expected 'key = value'") != std::string::npos);
  CHECK(error_of([&] {
          forge::load_config(job_schema(), dir.write("c.ini", "[run]\nsteps=1\nsteps=2\n"), {});
        }).find("c.ini:3: run.steps is already set on line 2") != std::string::npos);
  CHECK(error_of([&] { forge::load_config(job_schema(), dir / "missing.ini", {}); }).find("cannot read '") !=
        std::string::npos);
  CHECK(error_of([&] {
          forge::load_config(job_schema(), "", {"--run.steps=1", "--run.steps=2"});
        }) == "command line: run.steps given twice");
}

TEST_CASE("required keys must be set") {
  ConfigSchema s;
  s.add_required<std::string>("data.dataset", "dataset dir");
  CHECK(error_of([&] { forge::load_config(s, "", {}); }).find("required key 'data.dataset'") !=
        std::string::npos);
  CHECK(forge::load_config(s, "", {"--data.dataset=x"}).get<std::string>("data.dataset") == "x");
}

TEST_CASE("to_ini round-trips and the hash ignores formatting and override order") {
  forge::test::TempDir dir;
  const auto a = dir.write("a.ini", "[run]\nsteps=7\nname = x\n[optim]\nlr = 0.1\n");
  const auto b = dir.write("b.ini", "[optim]\n  lr=0.1\n[run]\nname=x\n");
  const Config ca = forge::load_config(job_schema(), a, {});
  const Config cb = forge::load_config(job_schema(), b, {"--run.steps=7"});
  CHECK(ca.to_ini() == cb.to_ini());
  CHECK(ca.hash() == cb.hash());
  CHECK(ca.hash().size() == 16);

  const Config again = forge::load_config(job_schema(), dir.write("c.ini", ca.to_ini()), {});
  CHECK(again.to_ini() == ca.to_ini());
  CHECK(forge::load_config(job_schema(), a, {"--run.steps=8"}).hash() != ca.hash());
}

TEST_CASE("reject() cites where the value came from") {
  forge::test::TempDir dir;
  const auto path = dir.write("job.ini", "[model]\nlayers = 0\n");
  const Config c = forge::load_config(job_schema(), path, {});
  CHECK(error_of([&] { c.reject("model.layers", "must be at least 1"); }) ==
        path + ":2: model.layers = 0: must be at least 1");
}

TEST_CASE("did_you_mean picks the closest key or nothing") {
  CHECK(forge::did_you_mean("model.dmodel", {"model.d_model", "model.heads"}) == "model.d_model");
  CHECK(forge::did_you_mean("xyz", {"model.d_model"}).empty());
}

TEST_CASE("the spec is read by the one INI reader: entries need a section, a section appears once") {
  forge::test::TempDir dir;
  CHECK(error_of([&] {
          forge::load_config(job_schema(), dir.write("a.ini", "steps = 1\n[run]\n"), {});
        }).find("a.ini:1: 'steps' is outside any [section]") != std::string::npos);
  CHECK(error_of([&] {
          forge::load_config(job_schema(), dir.write("b.ini", "[run]\nsteps = 1\n[optim]\n[run]\nname = x\n"),
                             {});
        }).find("b.ini:4: section [run] already appears on line 1; merge the two") != std::string::npos);
  // A '#' ends the value, as in Boost's config files.
  const Config c = forge::load_config(
      job_schema(), dir.write("c.ini", "[run]\nname = demo # the demo run\nsteps=3#x\n"), {});
  CHECK(c.get<std::string>("run.name") == "demo");
  CHECK(c.get<int>("run.steps") == 3);
  CHECK(c.source("run.steps") == dir / "c.ini" + ":3");
}
