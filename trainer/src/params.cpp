// The parameter table: names, logical shapes, shard rules and storage offsets of a model slice.
#include "forge/trainer/model.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace forge::trainer {

namespace {

constexpr size_t kAlign = 16;  // floats: each parameter starts on a 64-byte boundary

struct TableBuilder {
  const ModelSlice& slice;
  std::vector<ParamInfo> out;
  size_t offset = 0;

  void align(size_t multiple) { offset = (offset + multiple - 1) / multiple * multiple; }

  void add(std::string name, std::vector<int64_t> shape, ShardRule shard, bool decay, float std,
           float value = 0) {
    ParamInfo p{std::move(name), shape, shape, shard, decay, std, value, 0, 0};
    if (shard.kind == ShardRule::Kind::kSplit) {
      const int64_t parts = int64_t(shard.groups) * slice.tp_size;
      if (shape[shard.dim] % parts != 0)
        throw std::invalid_argument(p.name + ": dimension " + std::to_string(shard.dim) + " of size " +
                                    std::to_string(shape[shard.dim]) + " does not split into " +
                                    std::to_string(parts) + " parts");
      p.local_shape[shard.dim] = shape[shard.dim] / slice.tp_size;
    } else if (shard.kind == ShardRule::Kind::kExperts) {
      if (shape[0] % slice.ep_size != 0)
        throw std::invalid_argument(p.name + ": " + std::to_string(shape[0]) + " experts do not split over " +
                                    std::to_string(slice.ep_size) + " expert-parallel ranks");
      p.local_shape[0] = shape[0] / slice.ep_size;
    }
    p.numel = 1;
    for (int64_t d : p.local_shape) p.numel *= size_t(d);
    p.offset = offset;
    offset += (p.numel + kAlign - 1) / kAlign * kAlign;
    out.push_back(std::move(p));
  }
};

}  // namespace

std::vector<ParamInfo> parameter_table(const ModelConfig& cfg, const ModelSlice& slice, size_t expert_align) {
  const int last = slice.last_layer < 0 ? cfg.layers : slice.last_layer;
  if (slice.first_layer < 0 || slice.first_layer > last || last > cfg.layers)
    throw std::invalid_argument("model slice: layer range [" + std::to_string(slice.first_layer) + ", " +
                                std::to_string(last) + ") is outside [0, " + std::to_string(cfg.layers) +
                                ")");
  if (slice.tp_size < 1 || slice.tp_rank < 0 || slice.tp_rank >= slice.tp_size)
    throw std::invalid_argument("model slice: tensor-parallel rank " + std::to_string(slice.tp_rank) +
                                " of " + std::to_string(slice.tp_size));
  if (slice.ep_size < 1 || slice.ep_rank < 0 || slice.ep_rank >= slice.ep_size)
    throw std::invalid_argument("model slice: expert-parallel rank " + std::to_string(slice.ep_rank) +
                                " of " + std::to_string(slice.ep_size));
  const int64_t C = cfg.d_model, V = cfg.vocab;
  const float std = 0.02f;
  // Residual projections are scaled down so the residual stream's variance does not grow with depth.
  const float proj_std = std / std::sqrt(2.0f * float(cfg.layers));
  const ShardRule replicated{};
  const ShardRule rows{ShardRule::Kind::kSplit, 0, 1};  // column-parallel weight / its bias
  const ShardRule cols{ShardRule::Kind::kSplit, 1, 1};  // row-parallel weight
  const ShardRule qkv_rows{ShardRule::Kind::kSplit, 0, 3};
  const ShardRule experts{ShardRule::Kind::kExperts, 0, 1};
  const int64_t E = cfg.experts;

  TableBuilder t{slice, {}, 0};
  // The classifier is tied to wte: a slice holding the head holds (a copy of) the token embedding.
  if (slice.embedding || slice.head) t.add("wte.weight", {V, C}, rows, true, std);
  if (slice.embedding) t.add("wpe.weight", {cfg.max_positions, C}, replicated, true, std);
  for (int l = slice.first_layer; l < last; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    t.add(b + "ln1.weight", {C}, replicated, false, 0, 1.0f);
    t.add(b + "ln1.bias", {C}, replicated, false, 0);
    t.add(b + "attn.qkv.weight", {3 * C, C}, qkv_rows, true, std);
    t.add(b + "attn.qkv.bias", {3 * C}, qkv_rows, false, 0);
    t.add(b + "attn.proj.weight", {C, C}, cols, true, proj_std);
    t.add(b + "attn.proj.bias", {C}, replicated, false, 0);
    t.add(b + "ln2.weight", {C}, replicated, false, 0, 1.0f);
    t.add(b + "ln2.bias", {C}, replicated, false, 0);
    if (cfg.moe_block(l)) {
      // The experts last, on their own aligned stretch: their gradients are reduced over another group.
      t.add(b + "moe.router.weight", {E, C}, replicated, true, std);
      t.align(expert_align);
      t.add(b + "moe.fc.weight", {E, 4 * C, C}, experts, true, std);
      t.add(b + "moe.fc.bias", {E, 4 * C}, experts, false, 0);
      t.add(b + "moe.proj.weight", {E, C, 4 * C}, experts, true, proj_std);
      t.add(b + "moe.proj.bias", {E, C}, experts, false, 0);
      t.align(expert_align);
      continue;
    }
    t.add(b + "mlp.fc.weight", {4 * C, C}, rows, true, std);
    t.add(b + "mlp.fc.bias", {4 * C}, rows, false, 0);
    t.add(b + "mlp.proj.weight", {C, 4 * C}, cols, true, proj_std);
    t.add(b + "mlp.proj.bias", {C}, replicated, false, 0);
  }
  if (slice.head) {
    t.add("lnf.weight", {C}, replicated, false, 0, 1.0f);
    t.add("lnf.bias", {C}, replicated, false, 0);
  }
  return std::move(t.out);
}

ParameterCounts parameter_counts(const ModelConfig& cfg) {
  ParameterCounts n;
  for (const auto& p : parameter_table(cfg)) {
    if (p.name == "wpe.weight") continue;
    n.total += double(p.numel);
    const bool expert = p.shard.kind == ShardRule::Kind::kExperts;
    n.active += expert ? double(p.numel) * cfg.top_k / cfg.experts : double(p.numel);
  }
  return n;
}

double flops_per_token(const ModelConfig& cfg) {
  return 6.0 * parameter_counts(cfg).active + 12.0 * cfg.layers * double(cfg.seq_len) * cfg.d_model;
}

}  // namespace forge::trainer
