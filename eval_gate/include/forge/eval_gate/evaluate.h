// Evaluating a checkpoint on a dataset's held-out validation split, per data domain. Data parallel over
// the ranks of `comm` (forge-train's bootstrap and communicator): rank r takes sequences r, r + size, ...
// and the statistics are summed.
#pragma once

#include "forge/comm/comm.h"
#include "forge/eval_gate/stats.h"
#include "forge/trainer/model.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace forge::gate {

struct EvalOptions {
  int64_t max_sequences = 0;  // per domain; 0 = the whole validation split
  int threads = 0;            // 0: SLURM_CPUS_PER_TASK or all cores
  // How sequences are read and scored (as_trained): packed documents with their boundaries, and only the
  // replies a chat or preference dataset's loss mask marks (a fine-tuned model's held-out masked loss).
  bool document_mask = false;
  bool replies_only = false;
  // The objective's own figures (as_trained), measured against a model the candidate's spec names.
  std::string objective = "lm";  // run.objective
  // dpo: per held-out pair (a row of a preference dataset), the implicit reward margin
  // dpo_beta x ((logp - ref)(chosen) - (logp - ref)(rejected)), ref from `dpo_reference`; the LM figures
  // are then the chosen replies' masked loss.
  std::string dpo_reference;
  double dpo_beta = 0;
  // distill: per scored token, KL(teacher || model) at temperature 1, the teacher from `distill_teacher`.
  std::string distill_teacher;
  // The length of the sequences read (as_trained: the candidate's model.seq_len), so that a baseline is
  // read as the candidate is; an imported model records max_positions. 0: each checkpoint's own.
  int seq_len = 0;
  // Where the models compute (forge-gate --device): null, the CPU backend.
  trainer::Backend* backend = nullptr;
};

// The dataset the gate measures a candidate's loss on, and whether the candidate was trained on it (then
// its version must be the one the candidate records). A policy trained by reinforcement learning
// (run.objective = grpo) trained on a prompt set, which has no replies to score: it is measured on a chat
// dataset, the one given or, when given its prompt set (as submit-pipeline gives it), the one it speaks (its
// spec's rl.format_dataset: what it was fine-tuned on before), the baseline (that fine-tuned model,
// typically) alike. Throws forge::Error(kUsage) naming the key when a prompt set is given for a checkpoint
// not trained on one, or without that dataset.
struct MeasuredDataset {
  std::string dir;
  bool trained_on = true;
};
MeasuredDataset measured_dataset(const std::string& checkpoint_dir, const std::string& dataset_dir);

// `options` with the reading and scoring the checkpoint's run trained with on a dataset of
// `dataset_format` (its model's seq_len, its spec's data.document_mask and run.objective: sft and dpo score
// the replies, and
// distill does on chat data; dpo: dpo.beta and dpo.reference, else the model the run started from;
// distill: distill.teacher). The gate measures the candidate and its baseline (e.g. the model it was
// fine-tuned from) alike, the candidate's way. Throws forge::Error(kUsage) when the reference or the
// teacher is not a checkpoint here.
EvalOptions as_trained(const std::string& checkpoint_dir, const std::string& dataset_format,
                       EvalOptions options);

// Loads the checkpoint's model (its manifest's model config, read options.seq_len tokens at a time when
// set) and evaluates it. With `own_dataset` the checkpoint must have been trained on this dataset version
// (the candidate); a baseline may come from another (the parent of a fine-tune, an imported model), with
// the same tokenizer. Throws forge::Error: kData when the checkpoint is damaged or (own_dataset) was
// trained on another dataset version, or the dataset lacks a validation split; kUsage when the checkpoint
// (or a reference or teacher) records another tokenizer than the dataset's (check_tokenizer,
// prompt_format.h), the dataset's vocabulary does not fit the model, the model has fewer positions than
// options.seq_len, a DPO candidate's dataset holds no preference pairs, or a reference or teacher has
// another vocabulary than the model.
// What evaluate_checkpoint checks before it reads anything (every error it names about the checkpoint and
// the dataset, in the same order): the model config it evaluates.
trainer::ModelSpec check_evaluation(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                    const EvalOptions& options, bool own_dataset = true);

DomainResults evaluate_checkpoint(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                  const EvalOptions& options, comm::Comm& comm, bool own_dataset = true);

// A checkpoint's whole model (any layout it was trained at) for generation on `backend`: `batch` sequences
// of up to max_positions tokens in flight (Generator, generate.h). Throws forge::Error(kData) when it is
// damaged.
std::unique_ptr<trainer::GPT> load_for_generation(const std::string& checkpoint_dir, int batch,
                                                  comm::Comm& comm, trainer::Backend& backend);

// One position's figures from a model's logits and its teacher's over the same vocabulary: the model's
// cross-entropy of `target` and KL(softmax(teacher) || softmax(model)), in nats; the KL of equal logits
// is exactly 0.
struct TokenScores {
  double loss = 0, kl = 0;
};
TokenScores score_token(std::span<const float> model, std::span<const float> teacher, int32_t target);

}  // namespace forge::gate
