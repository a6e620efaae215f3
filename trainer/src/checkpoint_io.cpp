#include "forge/trainer/checkpoint_io.h"

#include "forge/common/error.h"
#include "forge/trainer/spec.h"

#include <algorithm>
#include <string_view>

namespace forge::trainer {
namespace {

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
  const int tp_rank = p.shard.part(slice.tp_rank);
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

bool writes(const ParamInfo& p, const ModelSlice& slice, const SaveRole& role) {
  if (!role.replicated && p.shard.kind != ShardRule::Kind::kSplit) return false;
  if (slice.tp_rank % p.shard.replicas != 0)
    return false;  // the first of the ranks holding the part writes it
  return role.tied_copy || p.name != "wte.weight";
}

bool expert(const ParamInfo& p) {
  return p.shard.kind == ShardRule::Kind::kExperts;
}

// Calls fn(part of piece's slice, flat position, position in the packed buffer) for each stretch of
// `piece` inside `ranges` (packed: the ranges back to back).
template <typename Fn>
void owned_parts(const Piece& piece, const std::vector<FlatRange>& ranges, Fn&& fn) {
  size_t packed = 0;
  for (const FlatRange& r : ranges) {
    const size_t lo = std::max(r.lo, piece.lo), hi = std::min(r.hi, piece.hi);
    if (lo < hi) {
      ckpt::Slice s = piece.slice;
      s.begin = int64_t(lo - piece.lo);
      s.end = int64_t(hi - piece.lo);
      fn(s, lo, packed + (lo - r.lo));
    }
    packed += r.hi - r.lo;
  }
}

// Visits (slice, pointer) for every piece this rank holds: parameters from the model's buffer (cut to
// role.owned_params when set), moments from the optimizer's packed buffers, cut to its ranges. Loading
// reads every piece the rank holds (of role, only owned_params applies).
template <typename Fn>
void for_each_piece(GPT& model, AdamW* optimizer, bool saving, const SaveRole& role, Fn&& fn) {
  const ModelSlice& slice = model.slice();
  float* weights = model.weights().data();
  for (const auto& p : model.params()) {
    if (saving && !writes(p, slice, role)) continue;
    if (!saving || (expert(p) ? role.expert_params : role.params))
      for (const Piece& piece : shard_pieces("param", p, slice)) {
        if (!role.owned_params.empty())
          owned_parts(piece, role.owned_params,
                      [&](const ckpt::Slice& s, size_t at, size_t) { fn(s, weights + at); });
        else
          fn(piece.slice, weights + piece.lo);
      }
    if (optimizer == nullptr || (saving && !(expert(p) ? role.expert_moments : role.moments))) continue;
    for (const char* kind : {"adam_m", "adam_v"}) {
      float* moments = std::string_view(kind) == "adam_m" ? optimizer->m().data() : optimizer->v().data();
      for (const Piece& piece : shard_pieces(kind, p, slice))
        owned_parts(piece, optimizer->ranges(),
                    [&](const ckpt::Slice& s, size_t, size_t packed) { fn(s, moments + packed); });
    }
  }
}

}  // namespace

namespace {

std::string_view on_off(bool v) {
  return v ? "on" : "off";
}

// Every architecture key of [model] (without "model.") and of [vision] (with "vision.") and its value in
// `m`, spelled as a job spec would.
// Capacity and the router losses are training settings, not part of the model.
std::vector<std::pair<std::string, Json>> architecture(const ModelSpec& m) {
  constexpr std::string_view scalings[] = {"none", "linear", "llama3", "yarn"};
  std::vector<std::pair<std::string, Json>> out = {
      {"layers", m.layers},
      {"d_model", m.d_model},
      {"heads", m.heads},
      {"vocab", m.vocab},
      {"seq_len", m.seq_len},
      {"max_positions", m.max_positions},
      {"family", family_name(m.family)},
      {"kv_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"norm", m.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm"},
      {"norm_eps", double(m.norm_eps)},
      {"positions", m.positions == Positions::kRotary ? "rope" : "learned"},
      {"rope_theta", m.rope.theta},
      {"rope_scaling", scalings[size_t(m.rope.scaling)]},
      {"rope_factor", m.rope.factor},
      {"rope_low_freq_factor", m.rope.low_freq_factor},
      {"rope_high_freq_factor", m.rope.high_freq_factor},
      {"rope_original_positions", m.rope.original_positions},
      {"rope_beta_fast", m.rope.beta_fast},
      {"rope_beta_slow", m.rope.beta_slow},
      {"qkv_bias", on_off(m.qkv_bias)},
      {"qk_norm", on_off(m.qk_norm)},
      {"window", m.window},
      {"linear_bias", on_off(m.linear_bias)},
      {"activation", m.activation == Activation::kSwiglu ? "swiglu" : "gelu"},
      {"ffn_hidden", m.ffn_hidden},
      {"tied_embeddings", on_off(m.tied_embeddings)},
      {"ffn", m.ffn == Ffn::kMoe ? "moe" : "dense"}};
  if (m.ffn == Ffn::kMoe)
    out.insert(out.end(), {{"experts", m.experts},
                           {"top_k", m.top_k},
                           {"moe_every", m.moe_every},
                           {"moe_hidden", m.moe_hidden},
                           {"router_renormalize", on_off(m.router_renormalize)},
                           {"shared_expert_hidden", m.shared_expert_hidden}});
  // The vision tower's keys are [vision]'s: spelled with their section.
  const VisionSpec& v = m.vision;
  if (v.enabled())
    out.insert(out.end(), {{"vision.layers", v.layers},
                           {"vision.image_size", v.image_size},
                           {"vision.patch", v.patch},
                           {"vision.width", v.width},
                           {"vision.heads", v.heads},
                           {"vision.mlp_hidden", v.mlp_hidden},
                           {"vision.projector_hidden", v.projector_hidden}});
  // Recorded when not the default, so that the records written before the keys existed still compare
  // equal to the same model's.
  if (v.enabled() && v.norm_eps != VisionSpec{}.norm_eps)
    out.push_back({"vision.norm_eps", double(v.norm_eps)});
  if (v.enabled() && !v.post_norm) out.push_back({"vision.post_norm", on_off(false)});
  if (m.value_head) out.push_back({"value_head", on_off(true)});
  return out;
}

// The keys a GPT-2 record had before the model families: what a GPT-2 model still writes, so that its
// checkpoints and the ones written before compare equal.
constexpr std::string_view kGpt2Keys[] = {"layers",        "d_model", "heads",   "vocab", "seq_len",
                                          "max_positions", "ffn",     "experts", "top_k", "moe_every"};

}  // namespace

Json model_spec_json(const ModelSpec& m) {
  const auto keys = architecture(m);
  Json j = Json::object();
  if (m.family != Family::kGpt2) {
    for (const auto& [key, value] : keys) j[key] = value;
    return j;
  }
  for (const auto& [key, value] : keys)
    if (std::find(std::begin(kGpt2Keys), std::end(kGpt2Keys), key) != std::end(kGpt2Keys) &&
        !(key == "ffn" && value == "dense"))
      j[key] = value;
  // A GPT-2 model with a slot changed from the family's records that slot too.
  const auto as_read = architecture(model_spec_from_json(j, "model_spec_json"));
  for (size_t i = 0; i < keys.size(); ++i)
    if (i >= as_read.size() || keys[i] != as_read[i]) j[keys[i].first] = keys[i].second;
  return j;
}

ModelSpec model_spec_from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) fail(ExitCode::kData, "{}: the model record is not a JSON object", where);
  std::vector<std::string> overrides;
  for (const auto& [key, value] : j.items())
    overrides.push_back((key.find('.') == std::string::npos ? "--model." : "--") + key + "=" +
                        (value.is_string() ? value.get<std::string>() : value.dump()));
  // The same keys, defaults and rules as a job spec's [model] section: a record without a key (one written
  // before the key existed) reads as a spec without it did.
  try {
    return model_spec(overrides);
  } catch (const Error& e) {
    fail(ExitCode::kData, "{}: the recorded model does not read as a model spec: {}", where, e.what());
  }
}

void check_model_family(const Json& record, const ModelSpec& want, const std::string& where) {
  const ModelSpec have = model_spec_from_json(record, where);
  if (have.family != want.family)
    fail(ExitCode::kUsage,
         "{} holds a {} model, but the job spec asks for model.family = {}: set model.family = {} (and its "
         "shape), or start from a {} checkpoint",
         where, family_name(have.family), family_name(want.family), family_name(have.family),
         family_name(want.family));
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

namespace {

// Reads the pieces this process holds that `wanted` accepts (a "param/..." or "adam_m/..." name) with
// read_all, into the model's memory (through page-locked host memory on a device backend), then refreshes
// the model's working copy.
template <typename Wanted, typename ReadAll>
size_t load_pieces(GPT& model, AdamW* optimizer, const std::vector<FlatRange>& owned, Wanted&& wanted,
                   ReadAll&& read_all) {
  std::vector<ckpt::TensorRequest> requests;
  std::vector<float*> targets;
  SaveRole role;
  role.owned_params = owned;
  for_each_piece(model, optimizer, false, role, [&](const ckpt::Slice& s, float* data) {
    if (!wanted(std::string_view(s.name))) return;
    requests.push_back({s, data});
    targets.push_back(data);
  });
  Backend& backend = model.backend();
  std::unique_ptr<Allocation> staging;
  size_t bytes = 0;
  for (const auto& r : requests) bytes += r.slice.bytes();
  if (!backend.host_memory()) {
    staging = backend.allocate_host(bytes);
    char* at = static_cast<char*>(staging->data());
    for (auto& r : requests) {
      r.data = at;
      at += r.slice.bytes();
    }
  }
  read_all(requests);
  if (staging)
    for (size_t i = 0; i < requests.size(); ++i)
      backend.copy_from_host(targets[i], requests[i].data, requests[i].slice.bytes());
  if (owned.empty())
    model.weights_changed();
  else  // the rest stays released
    for (const FlatRange& r : owned) model.weights_changed(r);
  return bytes;
}

std::string_view param_of(std::string_view slice_name) {
  return slice_name.substr(slice_name.find('/') + 1);
}

}  // namespace

size_t load_checkpoint(const ckpt::Checkpoint& checkpoint, GPT& model, AdamW* optimizer,
                       const std::function<bool(std::string_view param)>& wanted,
                       const std::vector<FlatRange>& owned_params) {
  return load_pieces(
      model, optimizer, owned_params,
      [&](std::string_view name) { return !wanted || wanted(param_of(name)); },
      [&](std::vector<ckpt::TensorRequest>& requests) { checkpoint.read(requests); });
}

void load_params(GPT& model, const std::function<bool(std::string_view)>& wanted,
                 const std::function<void(const ckpt::Slice&, float*)>& read) {
  load_pieces(
      model, nullptr, {}, [&](std::string_view name) { return wanted(param_of(name)); },
      [&](std::vector<ckpt::TensorRequest>& requests) {
        for (auto& r : requests) {
          ckpt::Slice piece = r.slice;
          piece.name = param_of(r.slice.name);
          read(piece, static_cast<float*>(r.data));
        }
      });
}

}  // namespace forge::trainer
