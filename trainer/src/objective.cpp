#include "forge/trainer/objective.h"

#include "forge/trainer/loss.h"
#include "forge/trainer/spec.h"

#include <algorithm>
#include <array>

namespace forge::trainer {

namespace {

std::shared_ptr<const Loss> lm_loss(const TrainSpec&, std::shared_ptr<GPT>) {
  return std::make_shared<LmCrossEntropy>();
}

std::shared_ptr<const Loss> dpo_loss(const TrainSpec& spec, std::shared_ptr<GPT>) {
  return std::make_shared<DpoLoss>(spec.dpo.beta, spec.dpo.label_smoothing);
}

std::shared_ptr<const Loss> grpo_loss(const TrainSpec& spec, std::shared_ptr<GPT>) {
  return std::make_shared<GrpoLoss>(spec.rl.loss);
}

std::shared_ptr<const Loss> ppo_loss(const TrainSpec& spec, std::shared_ptr<GPT>) {
  return std::make_shared<PpoLoss>(spec.rl.loss, spec.rl.ppo);
}

std::shared_ptr<const Loss> distill_loss(const TrainSpec& spec, std::shared_ptr<GPT> teacher) {
  return std::make_shared<DistillLoss>(spec.distill.alpha, spec.distill.temperature, std::move(teacher));
}

const std::array<ObjectiveTraits, 6>& table() {
  static const std::array<ObjectiveTraits, 6> t = {{
      {Objective::kLm, "lm", {}, true, Scored::kAll, Companion::kNone, true, {}, false, lm_loss},
      {Objective::kSft,
       "sft",
       {"chat", "image-text"},
       false,
       Scored::kReplies,
       Companion::kNone,
       true,
       {},
       false,
       lm_loss},
      {Objective::kDpo,
       "dpo",
       {"preference"},
       false,
       Scored::kReplies,
       Companion::kReference,
       true,
       "the DPO reference's log-probabilities or live copy",
       false,
       dpo_loss},
      {Objective::kDistill,
       "distill",
       {"text", "chat"},
       true,
       Scored::kRepliesOfChat,
       Companion::kTeacher,
       true,
       "the teacher (last stage)",
       false,
       distill_loss},
      // The KL's reference is optional (rl.kl_coef), so the rollouts hold it, not the table.
      {Objective::kGrpo,
       "grpo",
       {"prompts"},
       false,
       Scored::kReplies,
       Companion::kNone,
       false,
       "the rollouts' key/value cache and the KL reference's copy",
       true,
       grpo_loss},
      // GRPO's rollouts, with the policy's value head as the advantages' baseline.
      {Objective::kPpo,
       "ppo",
       {"prompts"},
       false,
       Scored::kReplies,
       Companion::kNone,
       false,
       "the rollouts' key/value cache and the KL reference's copy",
       true,
       ppo_loss},
  }};
  return t;
}

}  // namespace

std::span<const ObjectiveTraits> objectives() {
  return table();
}

const ObjectiveTraits& traits(Objective objective) {
  for (const ObjectiveTraits& t : table())
    if (t.objective == objective) return t;
  return table()[0];
}

std::vector<std::string> objective_names() {
  std::vector<std::string> out;
  for (const ObjectiveTraits& t : table()) out.emplace_back(t.name);
  return out;
}

const ObjectiveTraits* find_objective(std::string_view name) {
  for (const ObjectiveTraits& t : table())
    if (t.name == name) return &t;
  return nullptr;
}

bool scores_replies(const ObjectiveTraits& t, std::string_view format) {
  return t.scored == Scored::kReplies || (t.scored == Scored::kRepliesOfChat && format == "chat");
}

bool reads_format(const ObjectiveTraits& t, std::string_view format) {
  return t.formats.empty() || std::find(t.formats.begin(), t.formats.end(), format) != t.formats.end();
}

}  // namespace forge::trainer
