// forge-train report RUN_DIR: the HTML page's plots and markers, the text summary, and bad run directories.
#include "forge/common/json.h"
#include "support/paths.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = forge::test::CommandResult;

Result run(const std::string& args) {
  return forge::test::run_command(forge::test::env_path("FORGE_TRAIN_BIN") + " " + args);
}

std::string tiny(const std::string& dir) {
  return forge::test::source_path("configs/tiny.ini") + " --run.dir=" + dir +
         " --run.threads=1 --run.peak_gflops=50 --model.layers=1 --model.d_model=32 --model.heads=2"
         " --model.seq_len=32 --model.vocab=128 --ckpt.recovery_every=2";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The points of every <polyline> in order, each as (x, y) numbers.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& html) {
  std::vector<std::vector<std::pair<double, double>>> out;
  const std::regex line("<polyline class=\"series\"[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), line); it != std::sregex_iterator(); ++it) {
    std::istringstream in((*it)[1].str());
    std::vector<std::pair<double, double>> pts;
    std::string pair;
    while (in >> pair) {
      const auto comma = pair.find(',');
      REQUIRE(comma != std::string::npos);
      pts.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
    }
    out.push_back(pts);
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every chart's value axis labels its ticks differently, and each chart has some.
void check_distinct_ticks(const std::string& html) {
  for (size_t at = html.find("<svg "); at != std::string::npos; at = html.find("<svg ", at + 1)) {
    const std::string svg = html.substr(at, html.find("</svg>", at) - at);
    const std::regex tick("class=\"ytick\">([^<]*)<");
    std::vector<std::string> labels;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
      labels.push_back((*it)[1].str());
    INFO(svg.substr(0, 300));
    std::sort(labels.begin(), labels.end());
    CHECK(labels.size() >= 2);
    CHECK(std::adjacent_find(labels.begin(), labels.end()) == labels.end());
  }
}

}  // namespace

TEST_CASE("report: a nearly flat series gets distinct tick labels", "[launcher][report]") {
  forge::test::TempDir dir;
  const std::string rd = dir / "run";
  REQUIRE(run(tiny(rd) + " --run.steps=4").code == 0);
  // Peak memory that grows by 0.001 MiB a step (86.001 .. 86.004): ticks 0.001 apart, which four
  // significant digits once printed as 86 four times.
  std::istringstream in(read_file(rd + "/metrics/rank-0.jsonl"));
  std::string line, out;
  for (int step = 1; std::getline(in, line); ++step) {
    forge::Json rec = forge::Json::parse(line);
    rec["peak_rss_mib"] = 86.0 + 0.001 * step;
    out += rec.dump() + "\n";
  }
  std::ofstream(rd + "/metrics/rank-0.jsonl") << out;
  const Result r = run("report " + rd);
  INFO(r.output);
  REQUIRE(r.code == 0);
  const std::string html = read_file(rd + "/report.html");
  REQUIRE(html.find("peak resident memory") != std::string::npos);
  check_distinct_ticks(html);
}

TEST_CASE("report: plots with resume, checkpoint and guard markers, and a text summary",
          "[launcher][report]") {
  forge::test::TempDir dir;
  const std::string rd = dir / "run";
  REQUIRE(run(tiny(rd) + " --run.steps=4").code == 0);
  // Resumed (run.steps and guard.* may change on resume) with a NaN at step 5, skipped.
  const Result second = run(tiny(rd) + " --run.steps=6 --guard.inject_nan_step=5");
  INFO(second.output);
  REQUIRE(second.code == 0);

  const Result r = run("report " + rd);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("exit ok (0)") && Catch::Contains("steps 6, tokens ") &&
                           Catch::Contains("final loss ") && Catch::Contains("mean MFU ") &&
                           Catch::Contains("6 records (steps 1..6), 1 resumes") &&
                           Catch::Contains("milestone step 6: loss ") && Catch::Contains("recovery step 4") &&
                           Catch::Contains("report: " + rd + "/report.html"));
  // Two finished processes: everything they trained is kept, so the ratio is their step time over their
  // wall time; nothing was lost after a checkpoint, only the resumed process's start-up.
  const std::regex ettr("effective training time ([0-9.]+)% \\(ETTR\\), lost ([0-9.]+) s");
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, ettr));
  CHECK(std::stod(m[1]) > 0.0);
  CHECK(std::stod(m[1]) <= 100.0);
  CHECK(std::stod(m[2]) > 0.0);

  std::ifstream in(rd + "/report.html");
  REQUIRE(in);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(count(html, "<svg ") == 6);
  CHECK(count(html, "</svg>") == 6);
  CHECK(count(html, "<html") == count(html, "</html>"));
  CHECK(count(html, "<table") == count(html, "</table>"));
  // Self-contained: no scripts, no external resources.
  CHECK(count(html, "<script") == 0);
  CHECK(count(html, "src=") == 0);
  CHECK(count(html, "<link") == 0);
  check_distinct_ticks(html);
  const auto lines = polylines(html);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].size() == 5);  // loss: step 5's NaN is not plotted
  CHECK(lines[1].size() == 6);  // tokens/s
  CHECK(lines[2].size() == 6);  // MFU
  CHECK(lines[3].size() == 6);  // peak resident memory
  // The step-time split stacked: five areas, each over the 6 steps and closed along the baseline.
  for (const char* part : {"compute", "communication", "bubble", "data wait", "checkpoint stall"})
    CHECK(count(html, std::string("<polygon class=\"area\" data-series=\"") + part + "\"") == 1);
  // The per-rank view: one bar group for the one rank; the segments: the first process and the resumed one.
  CHECK(count(html, "<g class=\"rank\" data-rank=\"0\">") == 1);
  CHECK_THAT(html, Catch::Contains("<td>1</td><td>-</td><td>tp1,pp1,dp1</td><td>1</td><td>1-4</td>") &&
                       Catch::Contains("<td>2</td><td>-</td><td>tp1,pp1,dp1</td><td>1</td><td>5-6</td>"));
  for (const auto& l : lines)
    for (size_t i = 1; i < l.size(); ++i) CHECK(l[i].first > l[i - 1].first);  // steps ascend
  CHECK_THAT(html, Catch::Contains("class=\"m-resume\"><title>step 4: resumed from step 4</title>"));
  CHECK_THAT(html,
             Catch::Contains("class=\"m-guard\"><title>step 5: rank 0: non-finite loss/gradient: skip"));
  CHECK_THAT(html, Catch::Contains("class=\"m-ckpt\"><title>step 2: recovery checkpoint committed"));
}

TEST_CASE("report: a bad run directory exits 64 or 65 with one line", "[launcher][report]") {
  forge::test::TempDir dir;
  Result r = run("report " + (dir / "nowhere"));
  CHECK(r.code == 64);
  CHECK_THAT(r.output,
             Catch::StartsWith("forge-train: error: report: " + (dir / "nowhere") + " is not a directory"));
  CHECK(r.output.find('\n') == r.output.size() - 1);
  r = run("report " + std::string(dir.path()));
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("has no metrics/rank-*.jsonl: not a forge-train run directory"));
  r = run("report");
  CHECK(r.code == 64);
  CHECK_THAT(r.output, Catch::Contains("usage: forge-train report RUN_DIR"));

  fs::create_directories(dir / "run/metrics");
  dir.write("run/metrics/rank-0.jsonl", "{\"step\": 1, \"loss\": 2.0}\nnot json\n{\"step\": 3}\n");
  r = run("report " + (dir / "run"));
  CHECK(r.code == 65);
  CHECK_THAT(r.output, Catch::Contains((dir / "run/metrics/rank-0.jsonl") + ":2: not a metrics record"));
  CHECK_FALSE(fs::exists(dir / "run/report.html"));
  // A half-written last line (a killed run) is not an error: the complete records are reported.
  dir.write("run/metrics/rank-0.jsonl", "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"lo");
  r = run("report " + (dir / "run"));
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("no summary.json") && Catch::Contains("1 records (steps 1..1)"));
}
