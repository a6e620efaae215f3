// Evaluating a model on a task suite (suite.h) by generating with it (generate.h): exact match, multiple
// choice by log-likelihood, code run against the task's tests in the sandbox (sandbox.h), and refusal.
// Tasks are split over the ranks of the evaluation job (task i on rank i mod size); every rank ends with
// every task's scores. What each metric means is in docs/ARCHITECTURE.md, "Evaluation".
#pragma once

#include "forge/comm/comm.h"
#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/tokenizer.h"
#include "forge/eval_gate/generate.h"
#include "forge/eval_gate/intervals.h"
#include "forge/eval_gate/prompt_format.h"
#include "forge/eval_gate/sandbox.h"
#include "forge/eval_gate/suite.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace forge::gate {

// The bootstrap of every suite interval: fixed, so that a verdict is reproducible.
inline constexpr int kBootstrapResamples = 2000;
inline constexpr uint64_t kBootstrapSeed = 20261202;

// One metric of a suite: a score per task and their mean, with its confidence interval: Wilson's when
// every score is 0 or 1 (a rate), else a percentile bootstrap over tasks.
struct SuiteMetric {
  bool rate = true;
  std::map<std::string, double> per_task;  // task id -> score

  double value() const;  // the mean; NaN without tasks
  Interval interval(double confidence) const;
  // value, lo, hi, n, interval ("wilson" or "bootstrap"), confidence, per_task.
  Json to_json(double confidence) const;
  static SuiteMetric from_json(const Json& j);
};

// The metrics of a suite type, the first its headline: exact_match: accuracy; multiple_choice: accuracy
// (length-normalised), accuracy_raw; code: pass@k for each k of the suite; refusal: refusal_rate (on the
// prompts that must be refused), over_refusal_rate (on those that must not be).
std::vector<std::string> suite_metrics(const Suite& suite);

struct SuiteResult {
  std::string name, type, version;
  int64_t tasks = 0;
  std::map<std::string, SuiteMetric> metrics;
  GenerationStats generation;     // this rank's
  Json examples = Json::array();  // a few of rank 0's tasks: prompt, output, score

  Json to_json(double confidence) const;
  static SuiteResult from_json(const Json& j);
};

struct SuiteRunOptions {
  int batch = 8;  // sequences generated at once
  SandboxLimits sandbox;
  std::string scratch_parent = "/tmp";      // where code tasks' scratch directories are made
  std::string python = "/usr/bin/python3";  // runs code tasks (Debian's, not a user's)
};

// Runs `suite` on `model` (the whole model, built for generation: batch x max_positions rows) with the
// prompts formatted by `format` (prompt_format.h): a chat suite's prompt is a user turn in the model's own
// chat template, else forge's, and its replies end at that format's stops. Throws forge::Error(kUsage) when
// a chat suite meets a format that cannot chat.
SuiteResult run_suite(const Suite& suite, trainer::GPT& model, const PromptFormat& format,
                      const SuiteRunOptions& options, comm::Comm& comm);

// The program a code task runs: the code of `completion` (the first fenced block of a chat reply, or the
// reply; a text suite's prompt and its continuation), then the tests, then check(entry_point) when the task
// names an entry point, then a line printing `sentinel` (a fresh random word per run).
std::string code_program(const Suite& suite, const Task& task, const std::string& completion,
                         const std::string& sentinel);
// Whether a code task's program passed: it exited 0 and its output ends with the sentinel line, so that a
// program leaving before its tests (sys.exit(0) in the completion) or drowning them in output fails.
bool code_passed(const SandboxResult& result, const std::string& sentinel);

}  // namespace forge::gate
