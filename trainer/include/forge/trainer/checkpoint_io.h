// The model and optimizer as checkpoint tensors: every parameter is stored as its logical tensor
// ("param/<name>", "adam_m/<name>", "adam_v/<name>"), so any layout can save and any layout can load.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/saver.h"
#include "forge/common/json.h"
#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

// The model a checkpoint records: its [model] architecture keys (a GPT-2 model: the keys it had before the
// other families, and any slot changed from the family's), and the spec read back from such a record
// through model_spec (spec.h), the job spec's own reader. Throws forge::Error(kData) naming `where` when
// the record breaks a rule of the spec.
Json model_spec_json(const ModelSpec& spec);
ModelSpec model_spec_from_json(const Json& record, const std::string& where);
// A usage error (exit 64) naming both families when the record's family is not `want`'s.
void check_model_family(const Json& record, const ModelSpec& want, const std::string& where);

// Which of the pieces it holds a rank writes, so that each logical element is written once. Loading
// reads every piece the rank holds (under ZeRO-3 its owned ranges of the weights), from whatever layout
// saved it.
struct SaveRole {
  bool params = true;      // its parameters (data-parallel rank 0)
  bool moments = true;     // its optimizer moments (every rank under ZeRO-1, else data-parallel rank 0)
  bool replicated = true;  // tensors replicated across the tensor-parallel group (its rank 0)
  bool tied_copy = true;   // the token embedding (false on the last pipeline stage's copy of it)
  // The experts of MoE blocks (ShardRule::kExperts), held alike by the dp / ep ranks of an expert_dp
  // group: their parameters (its rank 0) and moments (every rank under ZeRO-1, else its rank 0).
  bool expert_params = true;
  bool expert_moments = true;
  // ZeRO-3: the parameters written (and read) as the rank's owned ranges of the flat buffer
  // (ParallelTrainer::owned_ranges(); params and expert_params on every rank), so that a save gathers
  // nothing and a load reads the rank's part. Empty: whole.
  std::vector<FlatRange> owned_params;
};

// This process's pieces of the parameters and, with an optimizer, its moments (tensor-parallel shards
// as hyperslabs, ZeRO-1 shards as flat ranges of them). The pieces point into the model's and
// optimizer's buffers (the backend's memory: a device backend's saver reads them with
// ckpt::SaverOptions::read_piece): valid until they change.
std::vector<ckpt::TensorData> checkpoint_tensors(GPT& model, AdamW* optimizer, const SaveRole& role = {});

// Points `options` at `backend`'s memory when the host cannot read it: the snapshot reads each piece with
// the backend's copy_to_host into its allocate_host (page-locked) memory. Nothing changes on a host backend.
void snapshot_through(Backend& backend, ckpt::SaverOptions& options);

// Fills the model's weights (and the optimizer's moments, when given) from a checkpoint, then refreshes
// the model's working copy (through page-locked host memory on a device backend). Throws forge::Error(kData)
// naming a missing or mis-shaped tensor. `wanted` (null: every one): the parameters read, the others keeping
// their initialisation (a vision-language model's tower started from a language model, PPO's value head
// from a policy without one). `owned_params` (ZeRO-3: ParallelTrainer::owned_ranges()): only those ranges of
// the weights are read, the rest left as it is (released). Returns the bytes read.
size_t load_checkpoint(const ckpt::Checkpoint& checkpoint, GPT& model, AdamW* optimizer,
                       const std::function<bool(std::string_view param)>& wanted = {},
                       const std::vector<FlatRange>& owned_params = {});

// Fills the parameters this process holds whose name `wanted` accepts from another source than a
// checkpoint: read(slice, out) writes the slice of that logical tensor (named by the parameter; its elements
// in the slice's order, FP32) to host memory. Then refreshes the model's working copy, as load_checkpoint
// does.
void load_params(GPT& model, const std::function<bool(std::string_view param)>& wanted,
                 const std::function<void(const ckpt::Slice&, float*)>& read);

}  // namespace forge::trainer
