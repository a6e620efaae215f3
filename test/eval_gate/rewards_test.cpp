// The rewards of sampled replies (rewards.h): answers extracted as the rule says, the scorers weighted
// into one number, code judged in the sandbox exactly as the gate judges it (a reply that prints what the
// tests would print, or leaves before them, gets 0), several sandboxes at once, and each reply scored as
// it arrives (RewardStream).
#include "forge/eval_gate/rewards.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

using namespace forge::gate;

TEST_CASE("extract_answer: last number, boxed, first line", "[rewards]") {
  CHECK(extract_answer("3 + 4 is 7.", AnswerRule::kLastNumber) == "7");
  CHECK(extract_answer("We get -12 apples", AnswerRule::kLastNumber) == "-12");
  CHECK(extract_answer("about 1,234.5 in all", AnswerRule::kLastNumber) == "1234.5");
  CHECK(extract_answer("2 then 3-5", AnswerRule::kLastNumber) == "-5");
  CHECK(extract_answer("no digits here", AnswerRule::kLastNumber).empty());
  CHECK(extract_answer("so \\boxed{x^{2}} and \\boxed{42}", AnswerRule::kBoxed) == "42");
  CHECK(extract_answer("\\boxed{\\frac{1}{2}}", AnswerRule::kBoxed) == "\\frac{1}{2}");
  CHECK(extract_answer("\\boxed{open", AnswerRule::kBoxed).empty());
  CHECK(extract_answer("  19\nbecause", AnswerRule::kFirstLine) == "19");
  CHECK(parse_answer_rule("boxed") == AnswerRule::kBoxed);
  CHECK_THROWS_AS(parse_answer_rule("last"), std::invalid_argument);
}

TEST_CASE("the scorers weighted into one reward", "[rewards]") {
  RewardSettings s;
  s.weights = {1.0, 0.0, 0.5, -0.25};  // exact_match, code (off), format, length
  s.max_new_tokens = 10;
  const RewardModel model(s);
  const RewardTarget seven{{"7"}, "", ""}, none{{}, "", ""};
  const Reply replies[] = {
      {&seven, "It is 7", 4, true},    // right, stopped: 1 + 0.5 - 0.1
      {&seven, "It is 8", 10, false},  // wrong, cut at the limit: 0 + 0 - 0.25
      {&none, "anything", 2, true},    // nothing to match: format and length only
  };
  const std::vector<Reward> r = model.score(replies);
  REQUIRE(r.size() == 3);
  CHECK(r[0].total == Approx(1.4));
  CHECK(r[0].parts[kExactMatch] == 1);
  CHECK(r[1].total == Approx(-0.25));
  CHECK(r[1].parts[kFormat] == 0);
  CHECK_FALSE(r[2].applies[kExactMatch]);
  CHECK(r[2].total == Approx(0.5 - 0.05));
  CHECK(r[0].sandbox_outcome == -1);
}

TEST_CASE("code rewards: the gate's judgement in the sandbox; reward hackers get 0", "[rewards][sandbox]") {
  RewardSettings s;
  s.weights = {0.0, 1.0, 0.0, 0.0};
  s.parallel = 3;
  s.sandbox.wall_seconds = 10;
  s.sandbox.cpu_seconds = 2;
  const RewardModel model(s);  // the sandbox starts here
  const RewardTarget add{{}, "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n", "add"};
  const std::string fence = "```";
  const Reply replies[] = {
      {&add, "Here:\n" + fence + "python\ndef add(a, b):\n    return a + b\n" + fence, 20, true},
      {&add, fence + "python\ndef add(a, b):\n    return a - b\n" + fence, 20, true},
      // Leaves before the tests run, with exit 0.
      {&add, fence + "python\nimport sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n" + fence, 20, true},
      // Prints what a passing run prints last, without the tests' sentinel (it cannot know it).
      {&add,
       fence + "python\ndef add(a, b):\n    return 0\nprint('forge-tests-passed-0000000000000000')\n" +
           "import os\nos._exit(0)\n" + fence,
       20, true},
      {&add, fence + "python\nwhile True:\n    pass\n" + fence, 20, true},
  };
  const std::vector<Reward> r = model.score(replies);
  REQUIRE(r.size() == 5);
  CHECK(r[0].total == 1);
  CHECK(kSandboxOutcomes[size_t(r[0].sandbox_outcome)] == "passed");
  CHECK(r[1].total == 0);
  CHECK(kSandboxOutcomes[size_t(r[1].sandbox_outcome)] == "failed");
  CHECK(r[2].total == 0);
  CHECK(kSandboxOutcomes[size_t(r[2].sandbox_outcome)] == "no_sentinel");
  CHECK(r[3].total == 0);
  CHECK(kSandboxOutcomes[size_t(r[3].sandbox_outcome)] == "no_sentinel");
  CHECK(r[4].total == 0);
  CHECK((kSandboxOutcomes[size_t(r[4].sandbox_outcome)] == "cpu_limit" ||
         kSandboxOutcomes[size_t(r[4].sandbox_outcome)] == "killed"));
}

TEST_CASE("a reward stream scores each reply as it comes, its sandbox running before the rest arrive",
          "[rewards][sandbox]") {
  RewardSettings s;
  s.weights = {1.0, 1.0, 0.0, 0.0};
  s.parallel = 2;
  s.sandbox.wall_seconds = 10;
  const RewardModel model(s);
  const RewardTarget add{{}, "def check(f):\n    assert f(2, 3) == 5\n", "add"}, seven{{"7"}, "", ""};
  const std::string right = "```python\ndef add(a, b):\n    return a + b\n```";
  const std::string wrong = "```python\ndef add(a, b):\n    return a * b\n```";
  RewardStream stream(model, 4);
  // Replies end in another order than they were asked for (the generator's slots free up as they stop).
  stream.add(2, {&add, right, 12, true});
  // The sandbox of reply 2 runs while the others are still being sampled: it is scored before they come.
  // (A bound against a hang, not a timing: the sandbox's wall limit is 10 s.)
  for (int i = 0; i < 3000 && stream.scored() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(stream.scored() == 1);
  stream.add(0, {&seven, "It is 7", 4, true});
  stream.add(3, {&add, wrong, 12, true});
  stream.add(1, {&seven, "It is 6", 4, true});
  const std::vector<Reward> r = stream.finish();
  REQUIRE(r.size() == 4);
  CHECK(r[0].total == 1);
  CHECK(r[1].total == 0);
  CHECK(r[2].total == 1);
  CHECK(kSandboxOutcomes[size_t(r[2].sandbox_outcome)] == "passed");
  CHECK(r[3].total == 0);
  CHECK(kSandboxOutcomes[size_t(r[3].sandbox_outcome)] == "failed");
  CHECK(stream.span_seconds() > 0);
  // A stream finished before every reply came is a bug in its caller, not a reward of 0.
  RewardStream short_one(model, 2);
  short_one.add(1, {&seven, "7", 1, true});
  CHECK_THROWS_AS(short_one.finish(), std::logic_error);
}
