#include "forge/eval_gate/rewards.h"

#include "forge/common/error.h"
#include "forge/eval_gate/suite.h"
#include "forge/eval_gate/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <stdexcept>
#include <thread>

namespace forge::gate {

AnswerRule parse_answer_rule(std::string_view name) {
  if (name == "last_number") return AnswerRule::kLastNumber;
  if (name == "boxed") return AnswerRule::kBoxed;
  if (name == "first_line") return AnswerRule::kFirstLine;
  throw std::invalid_argument(
      fmt::format("'{}' is not an answer rule (last_number, boxed, first_line)", name));
}

namespace {

bool digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// The last number of `text`: an optional '-', digits (commas between digit groups dropped), an optional
// fraction.
std::string last_number(std::string_view text) {
  size_t end = text.size();
  while (end > 0 && !digit(text[end - 1])) --end;
  if (end == 0) return "";
  size_t begin = end;
  while (begin > 0 && (digit(text[begin - 1]) || ((text[begin - 1] == ',' || text[begin - 1] == '.') &&
                                                  begin >= 2 && digit(text[begin - 2]))))
    --begin;
  if (begin > 0 && text[begin - 1] == '-') --begin;
  std::string out;
  for (const char c : text.substr(begin, end - begin))
    if (c != ',') out += c;
  return out;
}

// The contents of the last \boxed{...}, braces balanced.
std::string boxed(std::string_view text) {
  const size_t at = text.rfind("\\boxed{");
  if (at == std::string_view::npos) return "";
  int depth = 1;
  for (size_t i = at + 7; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return std::string(text.substr(at + 7, i - at - 7));
  }
  return "";
}

// The gate's code suites judge a chat reply by its first fenced block; so do the rewards.
const Suite& chat_code_suite() {
  static const Suite suite = [] {
    Suite s;
    s.type = SuiteType::kCode;
    s.chat = true;
    return s;
  }();
  return suite;
}

int outcome_of(const SandboxResult& r, bool passed) {
  if (passed) return 0;
  switch (r.status) {
    case SandboxStatus::kExited:
      return r.exit_code == 0 ? 2 : 1;
    case SandboxStatus::kTimedOut:
      return 3;
    case SandboxStatus::kCpuLimit:
      return 4;
    case SandboxStatus::kSignaled:
      return 5;
    case SandboxStatus::kMemoryLimit:
      return 6;
  }
  return 1;
}

}  // namespace

std::string extract_answer(std::string_view reply, AnswerRule rule) {
  switch (rule) {
    case AnswerRule::kLastNumber:
      return last_number(reply);
    case AnswerRule::kBoxed:
      return boxed(reply);
    case AnswerRule::kFirstLine:
      break;
  }
  const size_t start = std::min(reply.find_first_not_of(" \t\r\n"), reply.size());
  return std::string(reply.substr(start, reply.find('\n', start) - start));
}

RewardModel::RewardModel(RewardSettings settings) : s_(std::move(settings)) {
  s_.parallel = std::max(1, s_.parallel);
  if (s_.weights[kCode] == 0) return;
  // A sandbox that cannot start fails every code reply the same way: that is the node, not the policy.
  SandboxResult probe;
  try {
    probe = run_sandboxed({s_.python, "-I", "-c", "print('ok')"}, {}, s_.scratch_parent, s_.sandbox);
  } catch (const Error& e) {
    fail(ExitCode::kComm,
         "reward code: the sandbox cannot start: {}; install bubblewrap (scripts/install-deps.sh)", e.what());
  }
  if (!probe.passed() || probe.output != "ok\n")
    fail(ExitCode::kComm,
         "reward code: a trivial program in the sandbox ({} -I) ended with {} ({}): bubblewrap is denied "
         "here (user namespaces?) or {} is missing; fix the node or train without the code reward",
         s_.python, probe.describe(), probe.output.substr(0, 200), s_.python);
}

std::vector<Reward> RewardModel::score(std::span<const Reply> replies) const {
  RewardStream stream(*this, replies.size());
  for (size_t i = 0; i < replies.size(); ++i) stream.add(i, replies[i]);
  return stream.finish();
}

namespace {

std::string fresh_sentinel() {
  std::random_device entropy;
  return fmt::format("forge-tests-passed-{:08x}{:08x}", entropy(), entropy());
}

}  // namespace

RewardStream::RewardStream(const RewardModel& model, size_t replies)
    : model_(model), sentinel_(fresh_sentinel()), replies_(replies), out_(replies) {}

RewardStream::~RewardStream() {
  stop();
}

void RewardStream::add(size_t index, Reply reply) {
  const RewardSettings& s = model_.s_;
  if (added_++ == 0) first_ = std::chrono::steady_clock::now();
  Reward& w = out_.at(index);
  const RewardTarget& t = *reply.target;
  w.applies[kExactMatch] = !t.answers.empty();
  if (w.applies[kExactMatch])
    w.parts[kExactMatch] = exact_match(extract_answer(reply.text, s.answer), t.answers) ? 1 : 0;
  w.applies[kCode] = !t.tests.empty() && s.weights[kCode] != 0;
  w.applies[kFormat] = w.applies[kLength] = true;
  w.parts[kFormat] = reply.stopped ? 1 : 0;
  w.parts[kLength] = std::clamp(double(reply.tokens) / double(s.max_new_tokens), 0.0, 1.0);
  replies_[index] = std::move(reply);
  std::lock_guard lock(mu_);
  last_ = std::max(last_, std::chrono::steady_clock::now());
  if (!w.applies[kCode]) {
    ++scored_;
    return;
  }
  queue_.push_back(index);
  if (workers_.size() < size_t(std::max(1, s.parallel))) workers_.emplace_back([this] { work(); });
  ready_.notify_one();
}

void RewardStream::work() {
  const RewardSettings& s = model_.s_;
  while (true) {
    size_t i = 0;
    {
      std::unique_lock lock(mu_);
      ready_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      i = queue_.front();
      queue_.pop_front();
    }
    try {
      Task task;
      task.tests = replies_[i].target->tests;
      task.entry_point = replies_[i].target->entry_point;
      const SandboxResult r =
          run_sandboxed({s.python, "-I", "solution.py"},
                        {{"solution.py", code_program(chat_code_suite(), task, replies_[i].text, sentinel_)}},
                        s.scratch_parent, s.sandbox);
      const bool passed = code_passed(r, sentinel_);
      out_[i].parts[kCode] = passed ? 1 : 0;
      out_[i].sandbox_outcome = outcome_of(r, passed);
      std::lock_guard lock(mu_);
      last_ = std::max(last_, std::chrono::steady_clock::now());
      ++scored_;
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

size_t RewardStream::scored() const {
  std::lock_guard lock(mu_);
  return scored_;
}

void RewardStream::stop() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

std::vector<Reward> RewardStream::finish() {
  stop();  // the threads drain the queue before they see it closing
  if (error_) std::rethrow_exception(error_);
  if (added_ != out_.size())
    throw std::logic_error(fmt::format("RewardStream: {} of {} replies added", added_, out_.size()));
  const RewardSettings& s = model_.s_;
  for (Reward& w : out_)
    for (size_t k = 0; k < kScorers; ++k)
      if (w.applies[k]) w.total += s.weights[k] * w.parts[k];
  return std::move(out_);
}

}  // namespace forge::gate
