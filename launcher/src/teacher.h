// run.objective = distill: the frozen teacher (docs/TRAINER.md, "Objectives"). It runs beside the student on
// every rank that holds the student's classifier (the last pipeline stage, each tensor-parallel rank
// forming the logits of its own vocabulary columns), as a whole model: the teacher may be larger than
// the student and saved on any layout, but must fit one rank.
#pragma once

#include "forge/common/config.h"
#include "forge/trainer/model.h"
#include "forge/trainer/spec.h"

#include <memory>
#include <string>

namespace forge::launcher {

// Checks distill.teacher against the run before anything is allocated, and returns the teacher's model
// at the run's sequence length. Usage errors (64) name the key: not a checkpoint, another vocabulary,
// too few positions, or another tokenizer than `tokenizer_sha256` (the dataset's; both hashes named).
trainer::ModelSpec check_teacher(const Config& config, const trainer::TrainSpec& spec,
                                 const std::string& tokenizer_sha256);

// The teacher's weights in a whole model for micro-batches of data.batch sequences (verified), on the
// student's backend. Under context parallelism `context` (trainer::ParallelPlan::context_only over the
// student's cp group; it must outlive the model) shares out the teacher's sequences as the student's are:
// the teacher reads the student's chunks and gives their logits.
std::shared_ptr<trainer::GPT> load_teacher(const trainer::TrainSpec& spec, const trainer::ModelSpec& teacher,
                                           trainer::Backend& backend,
                                           const trainer::LayerFactory* context = nullptr);

}  // namespace forge::launcher
