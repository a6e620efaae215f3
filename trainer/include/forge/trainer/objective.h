// What each run.objective needs, in one table (docs/TRAINER.md, "Objectives"): the spec's validation, the
// data source, the plan and the gate read it, so a new objective is one entry here and its loss.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

class GPT;
class Loss;
struct TrainSpec;

// What a run learns: every token of the data; fine-tuning on a chat dataset, the tokens its loss mask
// scores (the assistant's replies); preferences between pairs of replies; a teacher's distributions; or
// rewards of the policy's own replies to prompts (reinforcement learning).
enum class Objective { kLm, kSft, kDpo, kDistill, kGrpo, kPpo };

// Which positions the loss scores: all, only the replies of a conversation (the dataset's loss mask), or
// the replies when the dataset is chat (every token of text).
enum class Scored { kAll, kReplies, kRepliesOfChat };

// The other model a loss measures the policy against.
enum class Companion { kNone, kReference, kTeacher };

struct ObjectiveTraits {
  Objective objective;
  std::string_view name;  // run.objective's value
  // The dataset formats it trains on (manifest.json's "format"); empty: any. Whether the synthetic
  // stream (no documents, no loss mask) will do.
  std::vector<std::string_view> formats;
  bool synthetic;
  Scored scored;
  Companion companion;
  // Whether context parallelism may split its rows between ranks: a sum over positions (a distillation
  // teacher's split as the student's), or whole-sequence figures summed over the ranks (a DPO pair's
  // log-probabilities, Loss::sequences); not rollouts that generate whole rows.
  bool splits_over_context;
  // What the plan leaves out for it (forge-train --plan's "not planned"); empty: nothing.
  std::string_view unplanned;
  // Whether its batches are the policy's own replies to a prompt set, sampled every step (rollout.h), not
  // read from documents.
  bool rollouts;
  // Its loss (loss.h), from the validated spec; `teacher` for a Companion::kTeacher.
  std::shared_ptr<const Loss> (*make_loss)(const TrainSpec& spec, std::shared_ptr<GPT> teacher);
};

// Every objective, in run.objective's order of choices.
std::span<const ObjectiveTraits> objectives();
const ObjectiveTraits& traits(Objective objective);
// Their names, run.objective's choices.
std::vector<std::string> objective_names();
// The objective named `name`; nullptr when none is.
const ObjectiveTraits* find_objective(std::string_view name);

// Whether the loss scores only replies on a dataset of `format`; then the reader also masks documents
// (a reply attends to its own prompt only).
bool scores_replies(const ObjectiveTraits& t, std::string_view format);
// Whether it trains on a dataset of `format`.
bool reads_format(const ObjectiveTraits& t, std::string_view format);

}  // namespace forge::trainer
