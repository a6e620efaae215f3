// Prompt sets for reinforcement learning (GRPO): `forge-data prepare --format prompts` and their loader
// (docs/DATA.md, "Prompt sets").
//
// A prompt set is a directory holding prompts.jsonl (one canonical JSON object a line: the fields of
// Prompt, keys sorted), manifest.json (the Manifest type, format "prompts": the file's checksum, the
// settings and the version) and quality.json / quality.txt (what prepare read, kept and dropped).
//
// Prompts are NOT tokenized at prepare, unlike every other format: a rollout renders each prompt as a user
// turn in the chat format of the policy being trained (its own template and tokenizer), so one prompt set
// serves any model, and the version names the prompts and their references, not one tokenizer's ids.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace forge::data {

struct PrepareOptions;
struct PrepareResult;

// One prompt of a prompt set: the user turn a rollout asks, and what its reward checks against.
struct Prompt {
  std::string id;      // unique in the set
  std::string prompt;  // the user turn's text (rendered in the policy's chat format at rollout time)
  std::string domain;  // "default" when the input names none
  std::vector<std::string> answers;  // exact-match answers (any is right); may be empty
  std::string tests, entry_point;    // a code prompt's Python tests and the function they check; may be empty
};

struct PromptSet {
  std::string dir, version;          // version: the manifest's (like other datasets')
  std::vector<Prompt> prompts;       // in the prepared order
  std::vector<std::string> domains;  // sorted, unique
  size_t with_answers() const;       // prompts with at least one answer
  size_t with_tests() const;         // prompts with tests
};

// Loads DIR (prepared with --format prompts): forge::Error(ExitCode::kUsage) when DIR is not a prepared
// dataset or is one of another format (naming its format and how to prepare prompts), forge::Error(kData)
// when its files do not match its manifest (a hand edit, truncation): one line naming the file.
PromptSet load_prompt_set(const std::string& dir);

// --- Additions ---

// The prompt set's data file, its format name and the rules prepare applies (recorded in the settings, so
// a change to them changes every prompt set's version).
inline constexpr const char* kPromptsFile = "prompts.jsonl";
inline constexpr const char* kPromptsFormat = "prompts";
inline constexpr const char* kPromptRules = "forge-prompts-v1";
inline constexpr const char* kDefaultPromptDomain = "default";

// `forge-data prepare --format prompts` (PrepareOptions::ingest.format "prompts"; prepare_dataset calls
// this, after the checks every format has: inputs given, eval sets present, --out new or empty). Reads
// every input as JSONL, one prompt a line:
//   {"id"?: "...", "prompt": "...", "answer": "19" | "answers": ["19", ...], "tests"?: "python",
//    "entry_point"?: "f", "domain"?: "..."}
// Every non-blank line needs a non-empty string prompt and an answer, answers or tests; anything wrong is
// forge::Error(kData) naming FILE:LINE, before any output. Prompts are normalized (the rules of stage 2)
// and forge's chat markers in them neutralized as in chat content; exact duplicates (xxh3-128 of the
// normalized prompt, first kept) and prompts contaminated by an --eval-set (a shared word n-gram, or the
// whole prompt equal to an eval text) are dropped and counted. The set is written to a sibling temporary
// directory and renamed to `o.out` when complete. Options about tokens (a tokenizer, a chat template) are
// usage errors: prompts are not tokenized here.
PrepareResult prepare_prompt_set(const PrepareOptions& o);

// A prompt's line in prompts.jsonl: every field of Prompt, keys sorted, no whitespace (no newline).
std::string prompt_json_line(const Prompt& p);

}  // namespace forge::data
