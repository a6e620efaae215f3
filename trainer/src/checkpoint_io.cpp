#include "forge/trainer/checkpoint_io.h"

#include "forge/common/error.h"

#include <algorithm>
#include <string_view>

namespace forge::trainer {
namespace {

constexpr const char* kConfigFields[] = {"layers", "d_model", "heads", "vocab", "seq_len", "max_positions"};

// A stretch of this rank's buffer that is a piece of a logical tensor: a hyperslab (a tensor-parallel
// shard; the fused q|k|v weight is one hyperslab per group) or a flat range of one (a ZeRO-1 shard).
struct Piece {
  ckpt::Slice slice;
  size_t lo, hi;  // flat range of the model's buffer it covers
};

// The hyperslabs of parameter p's local shard, in local storage order.
std::vector<Piece> shard_pieces(const std::string& kind, const ParamInfo& p, const ModelSlice& slice) {
  ckpt::Slice whole = ckpt::Slice::whole(kind + "/" + p.name, p.shape);
  if (p.local_shape == p.shape) return {{whole, p.offset, p.offset + p.numel}};
  if (p.shard.kind == ShardRule::Kind::kExperts) {  // whole experts: one slab of dimension 0
    whole.offset.assign(p.shape.size(), 0);
    whole.count = p.local_shape;
    whole.offset[0] = slice.ep_rank * p.local_shape[0];
    return {{whole, p.offset, p.offset + p.numel}};
  }
  const int tp_rank = slice.tp_rank;
  const int d = p.shard.dim, groups = p.shard.groups;
  const int64_t tp = p.shape[size_t(d)] / p.local_shape[size_t(d)];
  const int64_t group_rows = p.shape[size_t(d)] / groups, part = group_rows / tp;
  const size_t per_group = p.numel / size_t(groups);
  std::vector<Piece> out;
  for (int g = 0; g < groups; ++g) {
    ckpt::Slice s = whole;
    s.offset.assign(p.shape.size(), 0);
    s.count = p.shape;
    s.offset[size_t(d)] = g * group_rows + tp_rank * part;
    s.count[size_t(d)] = part;
    out.push_back({s, p.offset + size_t(g) * per_group, p.offset + size_t(g + 1) * per_group});
  }
  return out;
}

bool writes(const ParamInfo& p, const SaveRole& role) {
  if (!role.replicated && p.shard.kind != ShardRule::Kind::kSplit) return false;
  return role.tied_copy || p.name != "wte.weight";
}

bool expert(const ParamInfo& p) {
  return p.shard.kind == ShardRule::Kind::kExperts;
}

// Visits (slice, pointer) for every piece this rank holds: parameters from the model's buffer, moments
// from the optimizer's packed buffers, cut to the optimizer's owned ranges.
template <typename Fn>
void for_each_piece(GPT& model, AdamW* optimizer, bool saving, const SaveRole& role, Fn&& fn) {
  const ModelSlice& slice = model.slice();
  for (const auto& p : model.params()) {
    if (saving && !writes(p, role)) continue;
    if (!saving || (expert(p) ? role.expert_params : role.params))
      for (const Piece& piece : shard_pieces("param", p, slice))
        fn(piece.slice, model.weights().data() + piece.lo);
    if (optimizer == nullptr || (saving && !(expert(p) ? role.expert_moments : role.moments))) continue;
    for (const char* kind : {"adam_m", "adam_v"}) {
      float* moments = std::string_view(kind) == "adam_m" ? optimizer->m().data() : optimizer->v().data();
      for (const Piece& piece : shard_pieces(kind, p, slice)) {
        size_t packed = 0;
        for (const FlatRange& r : optimizer->ranges()) {
          const size_t lo = std::max(r.lo, piece.lo), hi = std::min(r.hi, piece.hi);
          if (lo < hi) {
            ckpt::Slice s = piece.slice;
            s.begin = int64_t(lo - piece.lo);
            s.end = int64_t(hi - piece.lo);
            fn(s, moments + packed + (lo - r.lo));
          }
          packed += r.hi - r.lo;
        }
      }
    }
  }
}

}  // namespace

Json model_config_json(const ModelConfig& c) {
  Json j = {{"layers", c.layers}, {"d_model", c.d_model}, {"heads", c.heads},
            {"vocab", c.vocab},   {"seq_len", c.seq_len}, {"max_positions", c.max_positions}};
  // The architecture of an MoE model (a dense model's record is as before MoE existed); capacity and the
  // router losses are training settings, not part of the model.
  if (c.ffn == Ffn::kMoe) {
    j["ffn"] = "moe";
    j["experts"] = c.experts;
    j["top_k"] = c.top_k;
    j["moe_every"] = c.moe_every;
  }
  return j;
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
  if (j.contains("ffn")) {
    if (j.at("ffn") != "moe")
      fail(ExitCode::kData, "{}: model config has ffn = {}; this build knows moe (or no ffn: dense)", where,
           j.at("ffn").dump());
    for (const char* field : {"experts", "top_k", "moe_every"})
      if (!j.contains(field) || !j.at(field).is_number_integer() || j.at(field).get<int>() < 1)
        fail(ExitCode::kData, "{}: MoE model config lacks a positive integer '{}'", where, field);
    c.ffn = Ffn::kMoe;
    c.experts = j.at("experts").get<int>();
    c.top_k = j.at("top_k").get<int>();
    c.moe_every = j.at("moe_every").get<int>();
    if (c.top_k > c.experts || c.moe_every > c.layers)
      fail(ExitCode::kData, "{}: MoE model config has top_k > experts or moe_every > layers", where);
  }
  return c;
}

std::vector<ckpt::TensorData> checkpoint_tensors(GPT& model, AdamW* optimizer, const SaveRole& role) {
  std::vector<ckpt::TensorData> out;
  for_each_piece(model, optimizer, true, role, [&](const ckpt::Slice& s, float* data) {
    out.push_back({s, data});
  });
  return out;
}

void snapshot_through(Backend& backend, ckpt::SaverOptions& options) {
  if (backend.host_memory()) return;
  options.read_piece = [&backend](void* dst, const void* src, size_t bytes) {
    backend.copy_to_host(dst, src, bytes);
  };
  options.allocate_snapshot = [&backend](size_t bytes) {
    std::shared_ptr<Allocation> memory = backend.allocate_host(bytes);
    return std::shared_ptr<char>(memory, static_cast<char*>(memory->data()));
  };
}

void load_checkpoint(const ckpt::Checkpoint& checkpoint, GPT& model, AdamW* optimizer) {
  std::vector<ckpt::TensorRequest> requests;
  std::vector<float*> targets;
  for_each_piece(model, optimizer, false, {}, [&](const ckpt::Slice& s, float* data) {
    requests.push_back({s, data});
    targets.push_back(data);
  });
  // A device backend: the checkpoint is read into host memory, then copied piece by piece.
  Backend& backend = model.backend();
  std::unique_ptr<Allocation> staging;
  if (!backend.host_memory()) {
    size_t bytes = 0;
    for (const auto& r : requests) bytes += r.slice.bytes();
    staging = backend.allocate_host(bytes);
    char* at = static_cast<char*>(staging->data());
    for (auto& r : requests) {
      r.data = at;
      at += r.slice.bytes();
    }
  }
  checkpoint.read(requests);
  if (staging)
    for (size_t i = 0; i < requests.size(); ++i)
      backend.copy_from_host(targets[i], requests[i].data, requests[i].slice.bytes());
  model.weights_changed();
}

}  // namespace forge::trainer
