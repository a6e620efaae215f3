// Prompt sets for RL (`prepare --format prompts`, load_prompt_set): the set loads back as prepared with a
// stable version, duplicates and contamination (by the gate's task files) are dropped and reported, bad
// lines stop prepare naming FILE:LINE with nothing left behind, and the loader refuses other datasets and
// hand edits.
#include "forge/dataio/prompts.h"

#include "dataset_fixture.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/decontam.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prepare.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

using namespace forge::data;
using forge::ExitCode;
using forge::Json;
namespace fs = std::filesystem;

namespace {

PrepareOptions prompt_options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.ingest.format = "prompts";
  for (const auto& in : inputs) o.inputs.push_back(parse_input_spec(in));
  o.out = out;
  return o;
}

// The error prepare (or the loader) throws, with its exit code.
forge::Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    return e;
  }
  FAIL("no forge::Error thrown");
  return forge::Error(ExitCode::kOk, "");
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// No dataset and no partial directory of one next to `out`.
void check_nothing_left(const std::string& out) {
  CHECK_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    CHECK(e.path().filename().string().find(".partial-") == std::string::npos);
}

const char* const kPrompts =
    R"({"id": "sum-1", "prompt": "What is 7 + 12?", "answer": "19"})"
    "\n"
    R"({"prompt": "Name the capital of France.", "answers": ["Paris", "paris, france"], "domain": "geo"})"
    "\n\n"  // a blank line is skipped
    R"({"id": "add", "prompt": "Write a Python function add(a, b) returning a + b.", "tests": "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n", "entry_point": "add", "domain": "code", "source": "metadata is ignored"})"
    "\r\n"
    R"({"prompt": "  Caf\u00e9 au lait: how many words?\t \r\n", "answer": "4", "tests": "assert True"})"
    "\n";

}  // namespace

TEST_CASE("prepare --format prompts: the set loads back as prepared, with a stable version") {
  forge::test::TempDir tmp;
  const std::string input = tmp.write("in/prompts.jsonl", kPrompts);
  const PrepareResult r = prepare_dataset(prompt_options({input}, tmp / "ps"));
  INFO(r.summary);
  const PromptSet set = load_prompt_set(tmp / "ps");
  CHECK(set.dir == tmp / "ps");
  CHECK(set.version == r.version);
  CHECK(set.version.size() == 64);
  REQUIRE(set.prompts.size() == 4);
  const Prompt& sum = set.prompts[0];
  CHECK(sum.id == "sum-1");
  CHECK(sum.prompt == "What is 7 + 12?");
  CHECK(sum.domain == "default");
  CHECK(sum.answers == std::vector<std::string>{"19"});
  CHECK(sum.tests.empty());
  CHECK(sum.entry_point.empty());
  const Prompt& geo = set.prompts[1];
  CHECK(geo.id == "p-" + forge::xxh3_64_hex(geo.prompt));  // no id: derived from the prompt
  CHECK(geo.domain == "geo");
  CHECK(geo.answers == std::vector<std::string>{"Paris", "paris, france"});
  const Prompt& add = set.prompts[2];
  CHECK(add.id == "add");
  CHECK(add.domain == "code");
  CHECK(add.answers.empty());
  CHECK(add.tests == "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n");  // references as written
  CHECK(add.entry_point == "add");
  const Prompt& cafe = set.prompts[3];
  CHECK(cafe.prompt == "  Caf\xC3\xA9 au lait: how many words?");  // normalized: trailing whitespace, CR LF
  CHECK(cafe.answers == std::vector<std::string>{"4"});
  CHECK(cafe.tests == "assert True");
  CHECK(set.domains == std::vector<std::string>{"code", "default", "geo"});
  CHECK(set.with_answers() == 3);
  CHECK(set.with_tests() == 2);

  // The files: prompts.jsonl canonical (keys sorted, one object a line), the manifest, the report.
  const auto lines = lines_of(tmp / "ps/prompts.jsonl");
  REQUIRE(lines.size() == 4);
  for (size_t i = 0; i < lines.size(); ++i) {
    CHECK(Json::parse(lines[i]).dump() == lines[i]);
    CHECK(lines[i] == prompt_json_line(set.prompts[i]));
  }
  CHECK(
      lines[0] ==
      R"({"answers":["19"],"domain":"default","entry_point":"","id":"sum-1","prompt":"What is 7 + 12?","tests":""})");
  const Manifest m = load_any_manifest(tmp / "ps");
  CHECK(m.format == "prompts");
  CHECK(m.shards.empty());
  REQUIRE(m.files.size() == 1);
  CHECK(m.files[0].file == "prompts.jsonl");
  CHECK(m.files[0].records == 4);
  CHECK(m.files[0].xxh3 == forge::xxh3_file_hex(tmp / "ps/prompts.jsonl"));
  CHECK(m.settings["tokenized"] == false);
  CHECK(m.settings["prompt_rules"] == kPromptRules);
  CHECK(fs::is_regular_file(tmp / "ps/quality.json"));
  CHECK(fs::is_regular_file(tmp / "ps/quality.txt"));
  CHECK(r.quality["summary"]["prompts_read"] == 4);
  CHECK(r.quality["summary"]["prompts_kept"] == 4);
  CHECK(r.quality["summary"]["with_tests"] == 2);
  CHECK(r.quality["summary"]["domains"]["default"]["with_answers"] == 2);
  CHECK(r.quality["stages"]["ingest"]["blank_lines"] == 1);

  // Same input and settings, even at another path: the same version and bytes. Another answer: another one.
  const std::string moved = tmp.write("elsewhere/other-name.jsonl", kPrompts);
  const PrepareResult again = prepare_dataset(prompt_options({moved}, tmp / "ps2"));
  CHECK(again.version == r.version);
  CHECK(forge::read_file(tmp / "ps2/prompts.jsonl") == forge::read_file(tmp / "ps/prompts.jsonl"));
  CHECK(forge::read_file(tmp / "ps2/manifest.json") == forge::read_file(tmp / "ps/manifest.json"));
  std::string edited = kPrompts;
  edited.replace(edited.find("\"19\""), 4, "\"20\"");
  const std::string changed = tmp.write("changed.jsonl", edited);
  CHECK(prepare_dataset(prompt_options({changed}, tmp / "ps3")).version != r.version);
  // --input PATH=DOMAIN wins over the lines' domains.
  const PromptSet all_math =
      load_prompt_set(prepare_dataset(prompt_options({input + "=math"}, tmp / "ps4")).dataset_dir);
  CHECK(all_math.domains == std::vector<std::string>{"math"});

  // Token tools refuse a prompt set (no tokenizer, no shards) with a usage error saying what it is.
  const forge::Error e = error_of([&] { load_manifest(tmp / "ps"); });
  CHECK(e.code() == ExitCode::kUsage);
  CHECK_THAT(e.what(), Catch::Contains("a prompt set"));
  // Options about tokens are usage errors: prompts are not tokenized at prepare.
  PrepareOptions with_tokenizer = prompt_options({input}, tmp / "ps5");
  with_tokenizer.tokenizer_model = input;
  const forge::Error t = error_of([&] { prepare_dataset(with_tokenizer); });
  CHECK(t.code() == ExitCode::kUsage);
  CHECK_THAT(t.what(), Catch::Contains("not tokenized"));
  check_nothing_left(tmp / "ps5");
}

TEST_CASE("prepare --format prompts drops and reports duplicates and prompts contaminated by eval tasks") {
  forge::test::TempDir tmp;
  // An eval suite's task file, as the gate reads it: no "text", the prompts are what must not leak.
  const std::string tasks = tmp.write(
      "suites/arith/tasks.jsonl",
      R"({"id": "e1", "prompt": "What is 7 + 12?", "answer": "19"})"
      "\n"
      R"({"id": "e2", "prompt": "Read the passage: the quick brown fox jumps over the lazy dog while the cat sleeps in the sun all day long.", "answer": "fox"})"
      "\n");
  const std::string input = tmp.write(
      "prompts.jsonl",
      // 1: the eval prompt itself, differently spaced and cased: contaminated (whole text)
      R"({"prompt": "what is 7 +\n 12?", "answer": "19"})"
      "\n"
      // 2: an arithmetic prompt differing only in its operator: clean (punctuation counts)
      R"({"prompt": "What is 7 - 12?", "answer": "-5", "domain": "math"})"
      "\n"
      // 3: shares 13 words with e2 inside a longer text: contaminated (n-gram)
      R"({"prompt": "Summarize: quick brown fox jumps over the lazy dog while the cat sleeps in the sun, briefly.", "answer": "x", "domain": "reading"})"
      "\n"
      // 4 and 5: one prompt twice (trailing whitespace is normalized away); 5 has another answer
      R"({"prompt": "Spell cat backwards.", "answer": "tac", "domain": "words"})"
      "\n"
      R"({"prompt": "Spell cat backwards.   ", "answer": "TAC", "domain": "words"})"
      "\n"
      // 6: the same line as 2 again
      R"({"prompt": "What is 7 - 12?", "answer": "-5", "domain": "math"})"
      "\n");
  PrepareOptions o = prompt_options({input}, tmp / "ps");
  o.eval_sets = {tasks};
  const PrepareResult r = prepare_dataset(o);
  INFO(r.summary);
  const PromptSet set = load_prompt_set(tmp / "ps");
  REQUIRE(set.prompts.size() == 2);
  CHECK(set.prompts[0].prompt == "What is 7 - 12?");
  CHECK(set.prompts[1].prompt == "Spell cat backwards.");
  CHECK(set.prompts[1].answers == std::vector<std::string>{"tac"});  // the first copy is kept

  const Json& q = r.quality;
  CHECK(q["summary"]["prompts_read"] == 6);
  CHECK(q["summary"]["prompts_kept"] == 2);
  CHECK(q["summary"]["duplicates"] == 2);
  CHECK(q["summary"]["contaminated"] == 2);
  CHECK(q["summary"]["domains"]["words"]["duplicates"] == 1);
  CHECK(q["summary"]["domains"]["reading"]["contaminated"] == 1);
  CHECK(q["summary"]["domains"]["reading"]["kept"] == 0);
  const Json& dedup = q["stages"]["exact_dedup"];
  CHECK(dedup["removed"]["exact_duplicate"] == 2);
  CHECK(dedup["duplicates_with_other_references"] == 1);
  CHECK(dedup["examples"][0]["removed"] == input + ":5");
  CHECK(dedup["examples"][0]["kept"] == input + ":4");
  const Json& decontam = q["stages"]["decontam"];
  CHECK(decontam["removed"]["contaminated"] == 2);
  CHECK(decontam["eval_texts"] == 2);
  CHECK(decontam["removed_per_domain"]["default"] == 1);
  REQUIRE(decontam["examples"].size() == 2);
  CHECK(decontam["examples"][0]["removed"] == input + ":1");
  CHECK(decontam["examples"][0]["rule"] == "whole_text");
  CHECK(decontam["examples"][0]["ngram"] == "what is 7 + 12?");
  CHECK(decontam["examples"][1]["removed"] == input + ":3");
  CHECK(decontam["examples"][1]["rule"] == "ngram");
  CHECK(decontam["examples"][1]["ngram"] ==
        "quick brown fox jumps over the lazy dog while the cat sleeps in");
  CHECK_THAT(r.summary, Catch::Contains("contaminated 2") && Catch::Contains("exact duplicates 2"));
  // The report on disk is the one returned.
  CHECK(forge::read_json(tmp / "ps/quality.json")["summary"] == q["summary"]);
  // The eval sets are part of the version.
  const PrepareResult clean = prepare_dataset(prompt_options({input}, tmp / "ps-no-eval"));
  CHECK(clean.quality["summary"]["prompts_kept"] == 4);
  CHECK(clean.version != r.version);
  // Everything contaminated: nothing to write.
  const std::string only = tmp.write("only.jsonl", R"({"prompt": "What is 7 + 12?", "answer": "19"})"
                                                   "\n");
  PrepareOptions none = prompt_options({only}, tmp / "none");
  none.eval_sets = {tasks};
  const forge::Error e = error_of([&] { prepare_dataset(none); });
  CHECK(e.code() == ExitCode::kData);
  CHECK_THAT(e.what(), Catch::Contains("no prompts left after decontamination"));
  check_nothing_left(tmp / "none");
}

TEST_CASE("a bad prompt line fails prepare with exit 65 naming FILE:LINE and leaves no directory") {
  const std::string good = R"({"prompt": "What is 1 + 1?", "answer": "2"})";
  struct Case {
    const char* line;
    const char* says;
  };
  const Case cases[] = {
      {R"({"id": "q", "prompt": "What is 2 + 2?"})", "no \"answer\", \"answers\" or \"tests\""},
      {R"({"prompt": "What is 2 + 2?", "answer": "4")", "not JSON"},
      {R"(["prompt", "answer"])", "not a JSON object"},
      {R"({"prompt": "", "answer": "4"})", "empty \"prompt\""},
      {R"({"prompt": " \n\t", "answer": "4"})", "empty \"prompt\""},
      {R"({"prompt": "\u200b", "answer": "4"})", "empty \"prompt\" once normalized"},
      {R"({"answer": "4"})", "no \"prompt\""},
      {R"({"prompt": ["What?"], "answer": "4"})", "\"prompt\" is a JSON array"},
      {R"({"prompt": "What is 2 + 2?", "answer": 4})", "\"answer\" is a JSON number"},
      {R"({"prompt": "What is 2 + 2?", "answers": ["4", 4]})", "\"answers\"[1] is a JSON number"},
      {R"({"prompt": "What is 2 + 2?", "answer": "4", "answers": ["4"]})", "both \"answer\" and \"answers\""},
      {R"({"prompt": "What is 2 + 2?", "answer": "  "})", "empty \"answer\""},
      {R"({"prompt": "Write f.", "tests": " "})", "empty \"tests\""},
      {R"({"prompt": "Write f.", "answer": "x", "entry_point": "f"})", "\"entry_point\" without \"tests\""},
      {R"j({"prompt": "Write f.", "tests": "assert f()", "entry_point": "f()"})j",
       "not a Python function name"},
      {R"({"prompt": "What is 2 + 2?", "answer": "4", "domain": "a b"})", "domain 'a b'"},
      {R"({"prompt": "What is 2 + 2?", "answer": "4", "id": ""})", "\"id\" must be a non-empty string"},
      {R"({"prompt": "What is 3 + 3?", "answer": "6", "id": "p-1"})"
       "\n"
       R"({"prompt": "What is 4 + 4?", "answer": "8", "id": "p-1"})",
       "id \"p-1\" is already the id"},
      {"{\"prompt\": \"What is 2 + 2?\xff\", \"answer\": \"4\"}", "invalid UTF-8"},
  };
  for (const Case& c : cases) {
    forge::test::TempDir tmp;
    // The bad line is line 3 (the duplicate id: line 4, its first use line 3).
    const std::string input = tmp.write("bad.jsonl", good + "\n\n" + c.line + "\n");
    const bool second = std::string(c.line).find('\n') != std::string::npos;
    const std::string where = input + (second ? ":4:" : ":3:");
    INFO(c.line);
    const forge::Error e = error_of([&] { prepare_dataset(prompt_options({input}, tmp / "ps")); });
    CHECK(e.code() == ExitCode::kData);
    CHECK_THAT(e.what(), Catch::StartsWith(where) && Catch::Contains(c.says));
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    check_nothing_left(tmp / "ps");
  }
  // No prompt at all.
  forge::test::TempDir tmp;
  const std::string empty = tmp.write("empty.jsonl", "\n \n");
  const forge::Error e = error_of([&] { prepare_dataset(prompt_options({empty}, tmp / "ps")); });
  CHECK(e.code() == ExitCode::kData);
  CHECK_THAT(e.what(), Catch::Contains("no prompts"));
  check_nothing_left(tmp / "ps");
}

TEST_CASE("load_prompt_set refuses what is not a prompt set and reports hand edits") {
  forge::test::TempDir tmp;
  // Not a dataset: usage errors that say how to prepare one.
  for (const std::string& dir : {tmp / "missing", tmp.path().string()}) {
    const forge::Error e = error_of([&] { load_prompt_set(dir); });
    CHECK(e.code() == ExitCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains("--format prompts"));
  }
  // A token dataset: a usage error naming its format.
  forge::test::make_fixture_dataset(tmp / "text", forge::test::two_domains());
  const forge::Error text = error_of([&] { load_prompt_set(tmp / "text"); });
  CHECK(text.code() == ExitCode::kUsage);
  CHECK_THAT(text.what(), Catch::Contains("a text dataset") && Catch::Contains("--format prompts"));

  const std::string input = tmp.write("prompts.jsonl", kPrompts);
  prepare_dataset(prompt_options({input}, tmp / "ps"));
  const auto copy = [&](const std::string& name) {
    fs::copy(tmp / "ps", tmp / name, fs::copy_options::recursive);
    return tmp / name;
  };
  const auto data_error = [&](const std::string& dir) {
    const forge::Error e = error_of([&] { load_prompt_set(dir); });
    CHECK(e.code() == ExitCode::kData);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return std::string(e.what());
  };
  // A hand edit of prompts.jsonl (same size: an answer changed).
  const std::string edited = copy("edited");
  std::string bytes = forge::read_file(edited + "/prompts.jsonl");
  bytes.replace(bytes.find("\"19\""), 4, "\"91\"");
  forge::write_file_atomic(edited + "/prompts.jsonl", bytes);
  CHECK_THAT(data_error(edited), Catch::Contains(edited + "/prompts.jsonl") && Catch::Contains("xxh3"));
  // Truncation.
  const std::string cut = copy("cut");
  fs::resize_file(cut + "/prompts.jsonl", 50);
  CHECK_THAT(data_error(cut), Catch::Contains(cut + "/prompts.jsonl") && Catch::Contains("truncated"));
  // A missing file.
  const std::string gone = copy("gone");
  fs::remove(gone + "/prompts.jsonl");
  CHECK_THAT(data_error(gone), Catch::Contains(gone + "/prompts.jsonl") && Catch::Contains("missing"));
  // An edited manifest: its version no longer matches.
  const std::string manifest = copy("manifest");
  Json j = forge::read_json(manifest + "/manifest.json");
  j["files"][0]["records"] = 5;
  forge::write_json_atomic(manifest + "/manifest.json", j);
  CHECK_THAT(data_error(manifest), Catch::Contains("manifest.json") && Catch::Contains("does not match"));
  // The original still loads.
  CHECK(load_prompt_set(tmp / "ps").prompts.size() == 4);
}

TEST_CASE("eval sets: the gate's task files give their prompts, matched whole or by n-gram") {
  forge::test::TempDir tmp;
  const std::string tasks =
      tmp.write("tasks.jsonl", R"({"id": "a", "prompt": "What is 7 + 12?", "answer": "19"})"
                               "\n"
                               R"({"id": "b", "prompt": "Say no.", "answer": "no"})"
                               "\nnot json\n");
  const NgramIndex index = load_eval_sets({tasks}, 13);
  CHECK(index.texts() == 2);
  CHECK(index.size() == 0);  // both shorter than 13 words: only the whole-text rule can catch them
  std::string match;
  CHECK(index.equals_any("  WHAT is 7 +\n12?\n", &match));
  CHECK(match == "what is 7 + 12?");
  CHECK(index.equals_any("say NO."));
  CHECK_FALSE(index.equals_any("What is 7 - 12?"));
  CHECK_FALSE(index.equals_any("Say no. Then say yes."));
  CHECK(exact_text_form(" A\t b \n\nC ") == "a b c");
  // Text records keep working as before; "text" wins over "prompt".
  const std::string text = tmp.write("eval.jsonl", R"({"text": "one two three", "prompt": "four five"})"
                                                   "\n");
  const NgramIndex t = load_eval_sets({text}, 2);
  CHECK(t.size() == 2);
  CHECK(t.equals_any("One two three"));
  CHECK_FALSE(t.equals_any("four five"));
}
