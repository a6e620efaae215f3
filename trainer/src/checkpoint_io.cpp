#include "forge/trainer/checkpoint_io.h"

#include "forge/common/error.h"

namespace forge::trainer {
namespace {

constexpr const char* kConfigFields[] = {"layers", "d_model", "heads", "vocab", "seq_len", "max_positions"};

// The logical tensor a parameter's local buffer holds. Only whole (tp = 1) parameters exist so far; a
// tensor-parallel slice would map its shard rule to a hyperslab here.
ckpt::Slice slice_of(const std::string& kind, const ParamInfo& p) {
  if (p.local_shape != p.shape)
    fail(ExitCode::kUsage, "checkpoints of tensor-parallel shards are not supported yet ({})", p.name);
  return ckpt::Slice::whole(kind + "/" + p.name, p.shape);
}

}  // namespace

Json model_config_json(const ModelConfig& c) {
  return {{"layers", c.layers}, {"d_model", c.d_model}, {"heads", c.heads},
          {"vocab", c.vocab},   {"seq_len", c.seq_len}, {"max_positions", c.max_positions}};
}

ModelConfig model_config_from_json(const Json& j, const std::string& where) {
  for (const char* field : kConfigFields)
    if (!j.is_object() || !j.contains(field) || !j.at(field).is_number_integer() ||
        j.at(field).get<int>() < 1)
      fail(ExitCode::kData, "{}: model config lacks a positive integer '{}'", where, field);
  ModelConfig c;
  c.layers = j.at("layers").get<int>();
  c.d_model = j.at("d_model").get<int>();
  c.heads = j.at("heads").get<int>();
  c.vocab = j.at("vocab").get<int>();
  c.seq_len = j.at("seq_len").get<int>();
  c.max_positions = j.at("max_positions").get<int>();
  return c;
}

std::vector<ckpt::TensorData> checkpoint_tensors(GPT& model, AdamW* optimizer) {
  std::vector<ckpt::TensorData> out;
  for (const auto& p : model.params()) {
    out.push_back({slice_of("param", p), model.weights().data() + p.offset});
    if (optimizer) {
      out.push_back({slice_of("adam_m", p), optimizer->m().data() + p.offset});
      out.push_back({slice_of("adam_v", p), optimizer->v().data() + p.offset});
    }
  }
  return out;
}

void load_checkpoint(const ckpt::Checkpoint& checkpoint, GPT& model, AdamW* optimizer) {
  std::vector<ckpt::TensorRequest> requests;
  for (const auto& p : model.params()) {
    requests.push_back({slice_of("param", p), model.weights().data() + p.offset});
    if (optimizer) {
      requests.push_back({slice_of("adam_m", p), optimizer->m().data() + p.offset});
      requests.push_back({slice_of("adam_v", p), optimizer->v().data() + p.offset});
    }
  }
  checkpoint.read(requests);
  model.weights_changed();
}

}  // namespace forge::trainer
