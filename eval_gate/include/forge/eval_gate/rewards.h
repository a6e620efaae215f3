// Rewards of sampled replies (reinforcement learning: run.objective = grpo, docs/TRAINER.md "Objectives"),
// from the gate's own scorers so that a policy is trained on what it is judged by: exact match on the
// reply's answer, the prompt's tests run in the bubblewrap sandbox (sandbox.h, its limits, several at
// once), a format reward and a length term, weighted into one number per reply.
#pragma once

#include "forge/eval_gate/sandbox.h"

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace forge::gate {

// What exact_match compares of a reply (reward.answer): its last number ("-3", "2.5"; thousands commas
// dropped), the contents of its last \boxed{...}, or its first line (the gate's exact_match).
enum class AnswerRule { kLastNumber, kBoxed, kFirstLine };
AnswerRule parse_answer_rule(std::string_view name);  // std::invalid_argument for another name

// The reply's answer under `rule`; "" when it has none (no number, no \boxed{}).
std::string extract_answer(std::string_view reply, AnswerRule rule);

// The scorers, in kRewardScorers' order (spec.h): exact_match (1 when the answer matches one of the
// prompt's), code (1 when the prompt's tests pass on the reply's code, exactly as the gate's code suites
// judge it: code_program, code_passed), format (1 when the reply ended by itself, at an end of turn, not at
// the token limit), length (the reply's tokens over the limit, in [0, 1]: a negative weight is a length
// penalty). A scorer applies to a reply when its prompt has what it checks (answers, tests); one that does
// not adds nothing.
enum Scorer : size_t { kExactMatch, kCode, kFormat, kLength, kScorers };

struct RewardSettings {
  std::array<double, kScorers> weights{};  // by Scorer
  AnswerRule answer = AnswerRule::kLastNumber;
  int max_new_tokens = 64;
  int parallel = 1;  // sandboxes at once
  SandboxLimits sandbox;
  std::string scratch_parent = "/tmp";
  std::string python = "/usr/bin/python3";
};

// What a prompt checks its replies against (data::Prompt's fields the scorers read).
struct RewardTarget {
  std::vector<std::string> answers;
  std::string tests, entry_point;
};

struct Reply {
  const RewardTarget* target = nullptr;
  std::string text;  // the completion, cut at its stop
  int tokens = 0;    // sampled, the stop token not counted
  bool stopped = false;
};

// How a code reply's sandbox run ended (reported per cause): passed; failed (an exit code, an exception,
// a test's assertion); no_sentinel (exit 0 without the tests' last line: it left early or drowned them);
// timed_out; cpu_limit; killed (a signal: memory, ...).
inline constexpr std::array<std::string_view, 7> kSandboxOutcomes = {
    "passed", "failed", "no_sentinel", "timed_out", "cpu_limit", "killed", "memory_limit"};

struct Reward {
  double total = 0;
  std::array<double, kScorers> parts{};  // each scorer's score (before its weight)
  std::array<bool, kScorers> applies{};
  int sandbox_outcome = -1;  // index into kSandboxOutcomes; -1: no sandbox ran
};

class RewardModel {
 public:
  // Checks, when code is weighed, that the sandbox starts (a trivial program in it): forge::Error with
  // exit 69 naming what is missing or denied, before any rollout is sampled.
  explicit RewardModel(RewardSettings settings);
  // The rewards of `replies`, in order; code replies run in up to `parallel` sandboxes at once.
  std::vector<Reward> score(std::span<const Reply> replies) const;
  const RewardSettings& settings() const { return s_; }

 private:
  friend class RewardStream;
  RewardSettings s_;
};

// Scores replies as they are handed in (the generator's on_done: each as its sampling ends), so that the
// code replies' sandboxes run while the rest of the rollout is still sampled: the cheap scorers at once,
// the sandboxes on up to settings().parallel threads of the stream's own. finish() waits for the last and
// returns every reward in the replies' order; what it waited is the scoring the sampling did not hide.
class RewardStream {
 public:
  RewardStream(const RewardModel& model, size_t replies);
  ~RewardStream();  // stops and joins the sandbox threads (a stream left by an exception)
  RewardStream(const RewardStream&) = delete;
  RewardStream& operator=(const RewardStream&) = delete;
  // Reply `index` (< replies), once. Its target must stay alive until finish().
  void add(size_t index, Reply reply);
  // Every reply added: their rewards. A sandbox that could not run is rethrown here.
  std::vector<Reward> finish();
  // How many replies are scored so far (their sandboxes done), from any thread.
  size_t scored() const;
  // From the first reply added to the last one scored (after finish()).
  double span_seconds() const { return std::chrono::duration<double>(last_ - first_).count(); }

 private:
  void work();
  void stop();

  const RewardModel& model_;
  const std::string sentinel_;  // fresh per stream: a reply cannot print it without running the tests
  std::vector<Reply> replies_;
  std::vector<Reward> out_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<size_t> queue_;  // code replies waiting for a sandbox
  bool closing_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
  size_t added_ = 0, scored_ = 0;                           // scored_: under mu_
  std::chrono::steady_clock::time_point first_{}, last_{};  // last_: under mu_
};

}  // namespace forge::gate
