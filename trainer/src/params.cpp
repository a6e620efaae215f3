// The parameter table: names, logical shapes, shard rules and storage offsets of a model slice.
#include "forge/trainer/model.h"

#include <algorithm>
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

  // next_follows: the next parameter starts right after this one, unaligned (tensors a layer runs as one
  // product, GPT::fused_ref).
  void add(std::string name, std::vector<int64_t> shape, ShardRule shard, bool decay, float std,
           float value = 0, bool next_follows = false) {
    ParamInfo p{std::move(name), shape, shape, shard, decay, std, value, 0, 0};
    if (shard.kind == ShardRule::Kind::kSplit) {
      const int64_t parts = int64_t(shard.groups) * slice.tp_size / shard.replicas;
      if (shape[shard.dim] % parts != 0)
        throw std::invalid_argument(p.name + ": dimension " + std::to_string(shard.dim) + " of size " +
                                    std::to_string(shape[shard.dim]) + " does not split into " +
                                    std::to_string(parts) + " parts");
      p.local_shape[shard.dim] = shape[shard.dim] / (slice.tp_size / shard.replicas);
    } else if (shard.kind == ShardRule::Kind::kExperts) {
      if (shape[0] % slice.ep_size != 0)
        throw std::invalid_argument(p.name + ": " + std::to_string(shape[0]) + " experts do not split over " +
                                    std::to_string(slice.ep_size) + " expert-parallel ranks");
      p.local_shape[0] = shape[0] / slice.ep_size;
    }
    p.numel = 1;
    for (int64_t d : p.local_shape) p.numel *= size_t(d);
    p.offset = offset;
    offset += next_follows ? p.numel : (p.numel + kAlign - 1) / kAlign * kAlign;
    out.push_back(std::move(p));
  }
};

}  // namespace

std::vector<int> ModelSlice::blocks(int layers) const {
  const int last = last_layer < 0 ? layers : last_layer;
  std::vector<int> out;
  for (int c = 0; c < chunks; ++c)
    for (int l = first_layer; l < last; ++l) out.push_back(l + c * chunk_stride);
  return out;
}

std::vector<ParamInfo> parameter_table(const ModelSpec& cfg, const ModelSlice& slice, size_t part_align,
                                       size_t layer_align) {
  const int last = slice.last_layer < 0 ? cfg.layers : slice.last_layer;
  const int end = last + (slice.chunks - 1) * slice.chunk_stride;  // past the last chunk's blocks
  if (slice.first_layer < 0 || slice.first_layer > last || end > cfg.layers || slice.chunks < 1 ||
      (slice.chunks > 1 && slice.chunk_stride < last - slice.first_layer))
    throw std::invalid_argument("model slice: layer range [" + std::to_string(slice.first_layer) + ", " +
                                std::to_string(last) + ") in " + std::to_string(slice.chunks) + " chunks " +
                                std::to_string(slice.chunk_stride) + " apart is outside [0, " +
                                std::to_string(cfg.layers) + ")");
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
  const ShardRule gate_up_rows{ShardRule::Kind::kSplit, 0, 2};  // gate | up, each split
  const ShardRule experts{ShardRule::Kind::kExperts, 0, 1};
  // Key/value heads: split like the query heads, or, when there are fewer than ranks, one per rank, each
  // held by tp / kv_heads ranks.
  const ShardRule kv_rows{ShardRule::Kind::kSplit, 0, 1, std::max(1, slice.tp_size / cfg.kv_heads)};
  const int64_t E = cfg.experts, Q = int64_t(cfg.heads) * cfg.head_dim,
                KV = int64_t(cfg.kv_heads) * cfg.head_dim;
  const bool layernorm = cfg.norm == Norm::kLayerNorm, swiglu = cfg.activation == Activation::kSwiglu;

  TableBuilder t{slice, {}, 0};
  const auto norm = [&](const std::string& name) {
    t.add(name + ".weight", {C}, replicated, false, 0, 1.0f);
    if (layernorm) t.add(name + ".bias", {C}, replicated, false, 0);
  };
  // A dense FFN (a block's MLP, or an MoE block's shared expert): fc / proj with GELU, gate_up / down with
  // SwiGLU; H wide.
  const auto mlp = [&](const std::string& name, int64_t H) {
    if (swiglu) {
      t.add(name + "gate_up.weight", {2 * H, C}, gate_up_rows, true, std);
      if (cfg.linear_bias) t.add(name + "gate_up.bias", {2 * H}, gate_up_rows, false, 0);
      t.add(name + "down.weight", {C, H}, cols, true, proj_std);
      if (cfg.linear_bias) t.add(name + "down.bias", {C}, replicated, false, 0);
      return;
    }
    t.add(name + "fc.weight", {H, C}, rows, true, std);
    if (cfg.linear_bias) t.add(name + "fc.bias", {H}, rows, false, 0);
    t.add(name + "proj.weight", {C, H}, cols, true, proj_std);
    if (cfg.linear_bias) t.add(name + "proj.bias", {C}, replicated, false, 0);
  };
  // The classifier is tied to wte unless it has its own head: a slice holding a tied head holds (a copy
  // of) the token embedding.
  if (slice.embedding || (slice.head && cfg.tied_embeddings)) t.add("wte.weight", {V, C}, rows, true, std);
  if (slice.embedding && cfg.positions == Positions::kLearned)
    t.add("wpe.weight", {cfg.max_positions, C}, replicated, true, std);
  // The vision tower goes with the embedding (the first pipeline stage). Under tensor parallelism its
  // products split as a block's do (q|k|v, fc and the projector's fc1 by output rows; the products after
  // them by input columns, their biases whole) and the rest is whole on every rank.
  const VisionSpec& vis = cfg.vision;
  if (slice.embedding && vis.enabled()) {
    const int64_t W = vis.width, H = vis.mlp_hidden, P = vis.projector_hidden;
    const float vis_proj_std = std / std::sqrt(2.0f * float(vis.layers));
    const auto layernorm = [&](const std::string& name, int64_t width) {
      t.add(name + ".weight", {width}, replicated, false, 0, 1.0f);
      t.add(name + ".bias", {width}, replicated, false, 0);
    };
    const auto linear = [&](const std::string& name, int64_t out, int64_t in, float init_std,
                            const ShardRule& rule) {
      t.add(name + ".weight", {out, in}, rule, true, init_std);
      t.add(name + ".bias", {out}, rule.dim == 0 ? rule : replicated, false, 0);
    };
    t.align(part_align);
    linear("vision.patch", W, vis.patch_values(), std, replicated);
    t.add("vision.pos.weight", {vis.tokens(), W}, replicated, true, std);
    for (int l = 0; l < vis.layers; ++l) {
      const std::string b = "vision.blocks." + std::to_string(l) + ".";
      layernorm(b + "ln1", W);
      linear(b + "attn.qkv", 3 * W, W, std, qkv_rows);
      linear(b + "attn.proj", W, W, vis_proj_std, cols);
      layernorm(b + "ln2", W);
      linear(b + "mlp.fc", H, W, std, rows);
      linear(b + "mlp.proj", W, H, vis_proj_std, cols);
    }
    if (vis.post_norm) layernorm("vision.ln_post", W);
    t.align(part_align);
    linear("projector.fc1", P, W, std, rows);
    linear("projector.fc2", C, P, std, cols);
    t.align(part_align);
  }
  for (const int l : slice.blocks(cfg.layers)) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    t.align(layer_align);
    norm(b + "ln1");
    if (cfg.fused_qkv()) {
      t.add(b + "attn.qkv.weight", {3 * C, C}, qkv_rows, true, std);
      if (cfg.qkv_bias) t.add(b + "attn.qkv.bias", {3 * C}, qkv_rows, false, 0);
    } else {
      // q, k and v back to back, weights then biases: the attention runs them as one product (attention.h).
      t.add(b + "attn.q.weight", {Q, C}, rows, true, std, 0, true);
      t.add(b + "attn.k.weight", {KV, C}, kv_rows, true, std, 0, true);
      t.add(b + "attn.v.weight", {KV, C}, kv_rows, true, std);
      if (cfg.qkv_bias) {
        t.add(b + "attn.q.bias", {Q}, rows, false, 0, 0, true);
        t.add(b + "attn.k.bias", {KV}, kv_rows, false, 0, 0, true);
        t.add(b + "attn.v.bias", {KV}, kv_rows, false, 0);
      }
      if (cfg.qk_norm) {
        t.add(b + "attn.q_norm.weight", {cfg.head_dim}, replicated, false, 0, 1.0f);
        t.add(b + "attn.k_norm.weight", {cfg.head_dim}, replicated, false, 0, 1.0f);
      }
    }
    t.add(b + "attn.proj.weight", {C, Q}, cols, true, proj_std);
    if (cfg.linear_bias) t.add(b + "attn.proj.bias", {C}, replicated, false, 0);
    norm(b + "ln2");
    if (!cfg.moe_block(l)) {
      mlp(b + "mlp.", cfg.ffn_hidden);
      continue;
    }
    const int64_t H = cfg.moe_hidden;
    t.add(b + "moe.router.weight", {E, C}, replicated, true, std);
    if (cfg.shared_expert_hidden > 0) {
      mlp(b + "moe.shared.", cfg.shared_expert_hidden);
      t.add(b + "moe.shared_gate.weight", {1, C}, replicated, true, std);
    }
    // The experts last, on their own aligned stretch: their gradients are reduced over another group.
    t.align(part_align);
    if (swiglu) {
      t.add(b + "moe.gate_up.weight", {E, 2 * H, C}, experts, true, std);
      if (cfg.linear_bias) t.add(b + "moe.gate_up.bias", {E, 2 * H}, experts, false, 0);
      t.add(b + "moe.down.weight", {E, C, H}, experts, true, proj_std);
      if (cfg.linear_bias) t.add(b + "moe.down.bias", {E, C}, experts, false, 0);
    } else {
      t.add(b + "moe.fc.weight", {E, H, C}, experts, true, std);
      if (cfg.linear_bias) t.add(b + "moe.fc.bias", {E, H}, experts, false, 0);
      t.add(b + "moe.proj.weight", {E, C, H}, experts, true, proj_std);
      if (cfg.linear_bias) t.add(b + "moe.proj.bias", {E, C}, experts, false, 0);
    }
    t.align(part_align);
  }
  if (slice.head) {
    t.align(layer_align);
    norm("lnf");
    t.align(layer_align);
    if (!cfg.tied_embeddings) t.add("head.weight", {V, C}, rows, true, std);
    if (cfg.value_head) {  // whole on every rank, as the final norm whose output it reads
      t.add("value_head.weight", {1, C}, replicated, true, std);
      t.add("value_head.bias", {1}, replicated, false, 0);
    }
  }
  return std::move(t.out);
}

ModelPart model_part(std::string_view param) {
  if (param.starts_with("vision.")) return ModelPart::kVision;
  if (param.starts_with("projector.")) return ModelPart::kProjector;
  return ModelPart::kLm;
}

ParameterCounts parameter_counts(const ModelSpec& cfg) {
  ParameterCounts n;
  for (const auto& p : parameter_table(cfg)) {
    if (p.name == "wpe.weight") continue;
    n.total += double(p.numel);
    // A text token's product runs through the language model only; a picture's through the vision tower.
    if (model_part(p.name) != ModelPart::kLm) continue;
    const bool expert = p.shard.kind == ShardRule::Kind::kExperts;
    n.active += expert ? double(p.numel) * cfg.top_k / cfg.experts : double(p.numel);
  }
  return n;
}

double flops_per_token(const ModelSpec& cfg) {
  // Attention: per layer and token, QK^T and PV over the keys a query sees (the window), forward and
  // backward: 12 x keys x the query width (PaLM's 12 L T d counts all T keys).
  const int keys = cfg.window > 0 ? std::min(cfg.window, cfg.seq_len) : cfg.seq_len;
  // An untied token embedding is a lookup, not a product (its own head counts; tied, wte is the head).
  const double lookup = cfg.tied_embeddings ? 0.0 : double(cfg.vocab) * cfg.d_model;
  return 6.0 * (parameter_counts(cfg).active - lookup) +
         12.0 * cfg.layers * double(keys) * double(cfg.heads) * double(cfg.head_dim);
}

}  // namespace forge::trainer
