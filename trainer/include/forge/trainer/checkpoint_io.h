// The model and optimizer as checkpoint tensors: every parameter is stored as its logical tensor
// ("param/<name>", "adam_m/<name>", "adam_v/<name>"), so any layout can save and any layout can load.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/saver.h"
#include "forge/common/json.h"
#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"

#include <string>
#include <vector>

namespace forge::trainer {

Json model_config_json(const ModelConfig& config);
// Throws forge::Error(kData) naming `where` when a field is missing or not a positive integer.
ModelConfig model_config_from_json(const Json& j, const std::string& where);

// This process's pieces of the parameters and, with an optimizer, its moments. The pieces point into
// the model's and optimizer's buffers: valid until they change.
std::vector<ckpt::TensorData> checkpoint_tensors(GPT& model, AdamW* optimizer);

// Fills the model's weights (and the optimizer's moments, when given) from a checkpoint, then refreshes
// the model's working copy. Throws forge::Error(kData) naming a missing or mis-shaped tensor.
void load_checkpoint(const ckpt::Checkpoint& checkpoint, GPT& model, AdamW* optimizer);

}  // namespace forge::trainer
