// forge-train --plan (plan.h). Every size below is the one the trainer allocates with; the comments name
// the allocation each mirrors. Nothing here allocates a model buffer: the parameter table is the only
// per-tensor structure built (a few hundred entries).
#include "plan.h"

#include "forge/common/error.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <utility>

namespace forge::launcher {

namespace T = forge::trainer;

namespace {

constexpr size_t kF32 = sizeof(float);

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

// The dense MLP (model.cpp DenseMLP) of hidden width H: per slot, the first product's output and the
// activation's, N x its local width each, BF16 in BF16 mode.
// recomputed (SwiGLU): the activation is not kept per slot (the model's shared buffer holds it).
size_t dense_mlp_bytes(const T::ModelSpec& m, int H, int tp, size_t N, size_t act, size_t slots,
                       bool recomputed = false) {
  const bool swiglu = m.activation == T::Activation::kSwiglu;
  const size_t fc_out = size_t(swiglu ? 2 * H : H) / size_t(tp);  // gate_up / fc: rows split by tp
  const size_t pre = N * fc_out, a = swiglu && recomputed ? 0 : swiglu ? pre / 2 : pre;
  return slots * (pre + a) * act;
}

// An MoE block's FFN (moe.cpp MoeLayer, model.cpp SharedExpertMoe), its buffers sized for balanced
// routing (the layer's constructor): the experts are not split by tensor parallelism.
size_t moe_bytes(const T::ModelSpec& m, int tp, size_t N, size_t act, size_t slots) {
  const bool swiglu = m.activation == T::Activation::kSwiglu;
  const size_t C = size_t(m.d_model), E = size_t(m.experts), H = size_t(m.moe_hidden);
  const size_t F = swiglu ? 2 * H : H, rows_k = N * size_t(m.top_k);
  // Per slot: x and y [rows_k, C] FP32, pre [rows_k, F] and act [rows_k, H] activations.
  size_t n = slots * (2 * rows_k * C * kF32 + rows_k * F * act + rows_k * H * act);
  // Work: router logits [N, E], a, b, c [rows_k, C], dact [rows_k, H], (SwiGLU) dpre [rows_k, F].
  n += (N * E + 3 * rows_k * C + rows_k * H + (swiglu ? rows_k * F : 0)) * kF32;
  // The output's zero bias; without fc biases GELU's fused bias add reads its first H.
  n += (!swiglu && !m.linear_bias ? std::max(C, H) : C) * kF32;
  if (m.shared_expert_hidden > 0) {
    n += dense_mlp_bytes(m, m.shared_expert_hidden, tp, N, act, slots);
    // shared(x) per slot [N, C]; d_shared, d_in [N, C]; the gate's column and its copy [N].
    n += (slots * N * C + 2 * N * C + 2 * N) * kF32;
  }
  return n;
}

// Rows of the classifier's logits chunk (Backend::classifier_chunk_rows): the CPU backend's, or the CUDA
// backend's (trainer/cuda/src/backend.cpp: as many rows as 1 GiB of FP32 logits holds, a multiple of 256
// from 256 to 2^20), which this build may not contain.
size_t chunk_rows(T::Device device, int vocab) {
  if (device != T::Device::kCuda) return size_t(T::cpu_backend().classifier_chunk_rows(vocab));
  constexpr size_t kBytes = size_t(1) << 30;
  const size_t rows = kBytes / (kF32 * size_t(std::max(vocab, 1))) / 256 * 256;
  return std::clamp<size_t>(rows, 256, size_t(1) << 20);
}

std::string bytes_str(size_t b) {
  const double v = double(b);
  if (v >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  if (v >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
  if (v >= 1024.0) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", b);
}

std::string count_str(double n) {
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f} k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string flops_str(double f) {
  if (f >= 1e12) return fmt::format("{:.2f} TFLOP", f / 1e12);
  if (f >= 1e9) return fmt::format("{:.2f} GFLOP", f / 1e9);
  if (f >= 1e6) return fmt::format("{:.2f} MFLOP", f / 1e6);
  return fmt::format("{:.0f} FLOP", f);
}

std::string recompute_name(T::Recompute::Kind kind) {
  return kind == T::Recompute::Kind::kFull        ? "full"
         : kind == T::Recompute::Kind::kSelective ? "selective"
                                                  : "none";
}

std::string_view family_ffn(const T::ModelSpec& m) {
  return m.activation == T::Activation::kSwiglu ? "SwiGLU" : "GELU";
}

}  // namespace

size_t activation_bytes(const T::ModelSpec& m, const T::ModelSlice& slice, int batch, T::DType dtype,
                        const std::vector<int>& slots, const T::Recompute& recompute, int sequence_shards) {
  const int last = slice.last_layer < 0 ? m.layers : slice.last_layer;
  const int tp = slice.tp_size;
  const bool swiglu = m.activation == T::Activation::kSwiglu;
  const size_t act = dtype == T::DType::kBF16 ? sizeof(uint16_t) : kF32;  // ActBuffer
  // The slice's model chunks of L blocks each (an interleaved stage's; one otherwise), slots[c] activation
  // sets of chunk c (one count: every chunk's).
  const size_t L = size_t(last - slice.first_layer), C = size_t(m.d_model);
  const auto sets_of = [&](int chunk) { return size_t(slots[slots.size() == 1 ? 0 : size_t(chunk)]); };
  // N rows in the attention and FFN slots, R of them in the residual stream (sequence parallelism).
  const size_t N = size_t(batch) * size_t(m.seq_len), R = N / size_t(sequence_shards), RC = R * C;
  const size_t stats = T::NormLayer::stats_per_row(m.norm == T::Norm::kLayerNorm) * R;
  // This rank's heads (GPT's constructor): the query heads split by tp; the key/value heads too, or one
  // per rank when there are fewer than ranks.
  const size_t heads = size_t(m.heads / tp), kv = size_t(std::max(1, m.kv_heads / tp));
  const size_t hd = size_t(m.head_dim), q_width = heads * hd, qkv_width = (heads + 2 * kv) * hd;
  const auto scratch_width = [&](int hidden) { return size_t(swiglu ? 3 * hidden : hidden); };
  const size_t dfc = std::max(m.dense_blocks() ? scratch_width(m.ffn_hidden / tp) : 0,
                              scratch_width(m.shared_expert_hidden / tp));

  // Workspace: delta, dln [R, C]; datt [N, q_width]; dqkv [N, qkv_width]; dfc [N, the widest FFN scratch].
  size_t n = (2 * RC + N * q_width + N * qkv_width + N * dfc) * kF32;
  // Slots: the residual stream (L + 1) x [R, C] and its gradient [R, C]; the head's lnf, its statistics
  // and the classifier's gradient (the last chunk's).
  for (int c = 0; c < slice.chunks; ++c)
    n += sets_of(c) * ((L + 1) * RC + RC + (slice.head && c + 1 == slice.chunks ? 2 * RC + stats : 0)) * kF32;
  bool any_selective = false, any_full = false;
  const std::vector<int> blocks = slice.blocks(m.layers);
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int l = blocks[j];
    const size_t S = sets_of(int(j / std::max<size_t>(L, 1)));
    const bool selective = recompute.selective(l), full = recompute.full(l);
    any_selective = any_selective || selective;
    // A fully recomputed block keeps nothing per slot: the first one holds the one set all of them share.
    const size_t sets = full ? (any_full ? 0 : 1) : S;
    any_full = any_full || full;
    // Block::Acts per set: res_mid [R, C] and two norms' statistics (FP32), ln1 and ln2 outputs.
    n += sets * ((RC + 2 * stats) * kF32 + 2 * RC * act);
    // Attention::Acts per set: qkv, att (unless selectively recomputed), lse [N, heads]; qk-norm's saved
    // inputs and 1 / rms.
    n += sets * (N * qkv_width * act + (selective ? 0 : N * q_width * act) + N * heads * kF32);
    if (m.qk_norm) n += sets * (N * (heads + kv) * hd + N * (heads + kv)) * kF32;
    n += m.moe_block(l) ? moe_bytes(m, tp, N, act, sets)
                        : dense_mlp_bytes(m, m.ffn_hidden, tp, N, act, sets, selective);
  }
  // Selective recompute's shared buffers (GPT::Workspace): the attention output, SwiGLU's activation.
  if (any_selective)
    n += N * q_width * act + (swiglu && m.dense_blocks() ? N * size_t(m.ffn_hidden / tp) * act : 0);
  // The vision tower with the embedding (trainer/src/vision.h), FP32, for as many pictures as the
  // micro-batch's rows can hold (M rows of patches): per slot the normalised patches, the stream entering
  // each block and leaving the last, per block ln1, ln2 (and their 2 statistics), qkv, the attention's
  // output and lse, res_mid, the MLP's pre-activation and activation, then the final norm, the projector's
  // two and the features; once, the backward's scratch. Tensor parallelism splits qkv, the attention's
  // output and lse, the MLP's and the projector's hidden units.
  const T::VisionSpec& v = m.vision;
  if (slice.embedding && v.enabled()) {
    const size_t T_ = size_t(v.tokens()), M = std::max<size_t>(1, N / T_) * T_, W = size_t(v.width),
                 A = W / size_t(tp), H = size_t(v.mlp_hidden / tp), P = size_t(v.projector_hidden / tp),
                 VL = size_t(v.layers);
    const size_t block = M * (3 * W + 4 * A + 4 + size_t(v.heads / tp) + 2 * H);
    const size_t per_slot =
        M * size_t(v.patch_values()) + (VL + 1) * M * W + VL * block + M * (W + 2 + 2 * P + C);
    n += (sets_of(0) * per_slot + M * (C + 2 * W + 4 * A + H + P)) * kF32;
  }
  return n;
}

size_t weight_grad_bytes(const T::ModelSpec& m, const T::ModelSlice& slice, int batch, T::DType dtype) {
  // Each product's output gradient (FP32) and input (as stored) over N rows: q|k|v, the attention's
  // output, the FFN's two (an MoE block's router, and its experts over top_k x N rows dropless), the
  // shared expert's and its gate. Under tensor parallelism a rank's widths.
  const int tp = slice.tp_size;
  const size_t act = dtype == T::DType::kBF16 ? sizeof(uint16_t) : kF32;
  const size_t N = size_t(batch) * size_t(m.seq_len), C = size_t(m.d_model), hd = size_t(m.head_dim);
  const size_t q = size_t(m.heads / tp) * hd, kv = size_t(std::max(1, m.kv_heads / tp)) * hd;
  const size_t gate = m.activation == T::Activation::kSwiglu ? 2 : 1;
  const auto mlp = [&](size_t rows, int hidden, size_t in_bytes) {
    const size_t H = size_t(hidden / tp);
    return rows * (C * in_bytes + gate * H * kF32) + rows * (H * act + C * kF32);
  };
  size_t n = 0;
  for (const int l : slice.blocks(m.layers)) {
    n += N * (C * act + (q + 2 * kv) * kF32) + N * (q * act + C * kF32);
    if (!m.moe_block(l)) {
      n += mlp(N, m.ffn_hidden, act);
      continue;
    }
    n += N * (C * act + size_t(m.experts) * kF32) + mlp(N * size_t(m.top_k), m.moe_hidden, kF32);
    if (m.shared_expert_hidden > 0) n += mlp(N, m.shared_expert_hidden, act) + N * (C * act + kF32);
  }
  return n;
}

int data_parallel_nodes(const Layout& lay, const std::vector<std::string>& hosts) {
  std::set<std::string> seen;
  for (int d = 0; d < lay.dp; ++d)
    for (int c = 0; c < lay.cp; ++c) seen.insert(hosts.at(size_t(lay.tp) * size_t(c + lay.cp * d)));
  return int(seen.size());
}

Plan make_plan(const T::TrainSpec& validated, int zero_nodes) {
  Plan plan;
  plan.spec = validated;
  T::TrainSpec& spec = plan.spec;
  // The device the plan is for: auto plans the cluster's GPUs (run.device = cpu plans a CPU run).
  T::resolve_device(spec, spec.device == T::Device::kCpu ? 0 : 1, "");
  const T::ModelSpec& m = spec.model;
  const Layout& lay = spec.layout;

  const T::ParameterCounts counts = T::parameter_counts(m);
  plan.total_parameters = counts.total;
  plan.active_parameters = counts.active;
  plan.flops_per_token = T::flops_per_token(m);
  const int keys = m.window > 0 ? std::min(m.window, m.seq_len) : m.seq_len;
  plan.attention_flops = 12.0 * m.layers * double(keys) * double(m.heads) * double(m.head_dim);

  // The stages' model chunks and blocks, as ParallelTrainer places them.
  const int chunks = T::pipeline_chunks(spec.parallel);
  const std::vector<int> bounds = T::virtual_stage_bounds(m, lay.pp, spec.parallel);
  // Dense gradients are reduced, and ZeRO-1 shards, over dp x cp; a rank holds seq_len / cp positions of
  // each sequence (ParallelTrainer).
  const size_t dp = size_t(lay.dp) * size_t(lay.cp), expert_dp = size_t(lay.dp / lay.ep) * size_t(lay.cp);
  // Hybrid sharding shards over a node's share of each group, copied on every node.
  plan.zero_nodes = spec.parallel.shard_within_node ? std::max(1, zero_nodes) : 1;
  const size_t shard_dp = std::max<size_t>(1, dp / size_t(plan.zero_nodes)),
               shard_expert_dp = std::max<size_t>(1, expert_dp / size_t(plan.zero_nodes));
  T::ModelSpec local = m;
  local.seq_len /= lay.cp;
  const size_t N = size_t(spec.batch) * size_t(local.seq_len), NC = N * size_t(m.d_model);
  plan.pipeline.schedule = T::schedule_name(spec.parallel.pp_schedule);
  plan.pipeline.chunks = chunks;
  plan.pipeline.stages = T::pipeline_schedule(spec.parallel.pp_schedule, lay.pp, chunks, spec.microbatches);
  for (int s = 0; s < lay.pp; ++s) {
    StagePlan st;
    // Tensor-parallel rank 0 and expert-parallel rank 0: every rank's shares are equal.
    T::ModelSlice slice = T::stage_slice(bounds, lay.pp, s, chunks);
    slice.tp_size = lay.tp;
    slice.ep_size = lay.ep;
    st.stage = s;
    st.first_layer = slice.first_layer;
    st.last_layer = slice.last_layer;
    st.chunks = chunks;
    st.chunk_stride = slice.chunk_stride;
    st.embedding = slice.embedding;
    st.head = slice.head;
    // ParallelTrainer's activation slots (each chunk's), and ZB-H1's micro-batches waiting for their W.
    const T::StageSchedule& actions = plan.pipeline.stages[size_t(s)];
    st.chunk_slots = T::chunk_slots(actions, chunks);
    st.slots = std::accumulate(st.chunk_slots.begin(), st.chunk_slots.end(), 0);
    st.waiting = T::waiting_for_weights(actions);
    st.ranks = lay.tp * lay.cp * lay.dp;
    // GPT's flat buffers: the table aligned for dp, padded to a multiple of dp; under ZeRO-2/3 every
    // layer starts on a page (a GPU's granule) of every rank's part (ParallelTrainer).
    const int zero = spec.parallel.zero;
    const size_t unit = spec.device == T::Device::kCuda ? T::kDeviceReleaseFloats : T::kReleaseFloats;
    const size_t align = zero >= 2 ? dp * unit : dp;
    const std::vector<T::ParamInfo> params = T::parameter_table(m, slice, align, zero >= 2 ? align : 1);
    const size_t flat = round_up(params.back().offset + params.back().numel, align);
    for (const T::ParamInfo& p : params) st.held += double(p.numel);
    st.parameters = flat;
    st.weights = flat * kF32;
    st.gradients = flat * kF32;
    if (spec.dtype == T::DType::kBF16) st.bf16_copy = flat * kF32;  // GPT::work_: an FP32-sized buffer
    // ParallelTrainer's buckets (an MoE block's experts reduced over expert_dp). Each rank owns its group
    // rank's part of every bucket: the reduce-scatter's output (shard_) and, under ZeRO-1, AdamW's ranges.
    // Gradients train.freeze leaves out are never formed: their memory is never touched (GPT::zero_grad),
    // nor a frozen bucket's part of shard_.
    const std::vector<T::GradientBucket> buckets =
        T::gradient_buckets(params, m.layers, align, flat, spec.freeze);
    const auto group = [&](const T::GradientBucket& b) { return b.experts ? shard_expert_dp : shard_dp; };
    for (const T::ParamInfo& p : params)
      if (spec.freeze.frozen(p.name)) st.gradients -= p.numel * kF32;
    size_t owned = 0, owned_trained = 0, held = 0;
    std::map<int, size_t> block, block_trained;  // a block's buckets, experts included
    for (const T::GradientBucket& b : buckets) {
      const size_t part = (b.hi - b.lo) / group(b);
      owned += part;
      if (b.trains) owned_trained += part;
      if (b.key >= 0 && b.key < m.layers) {
        block[b.key] += b.hi - b.lo;
        if (b.trains) block_trained[b.key] += b.hi - b.lo;
      } else {
        held += b.hi - b.lo;
      }
    }
    const auto largest = [](const std::map<int, size_t>& blocks) {
      size_t n = 0;
      for (const auto& [layer, size] : blocks) n = std::max(n, size);
      return n;
    };
    const size_t largest_block = largest(block);
    st.grad_shard = owned_trained * kF32;
    // The moments of what the rank updates: its owned part of every bucket (ZeRO) or all of it, less what
    // train.freeze leaves out (then the rank with the most).
    size_t updated = zero >= 1 ? owned : flat;
    if (spec.freeze.any()) updated = 0;
    for (size_t r = 0; spec.freeze.any() && r < (zero >= 1 ? shard_dp : 1); ++r) {
      std::vector<T::FlatRange> ranges;
      for (const T::GradientBucket& b : buckets) {
        const size_t part = (b.hi - b.lo) / group(b), at = b.lo + (r % group(b)) * part;
        ranges.push_back(zero >= 1 ? T::FlatRange{at, at + part} : T::FlatRange{b.lo, b.hi});
      }
      size_t n = 0;
      for (const T::FlatRange& t : T::trained_ranges(ranges, params, spec.freeze)) n += t.hi - t.lo;
      updated = std::max(updated, n);
    }
    st.optimizer = 2 * updated * kF32;
    // ZeRO-2 keeps a rank's part of the gradients and those of the blocks backward is at or reducing
    // (two); ZeRO-3 also its part of the weights, the blocks a pass is at and prefetching, and the
    // embeddings, classifier and final norm through the step. In BF16 a pass gathers the working copy
    // alone, through a BF16 buffer of a bucket's size per gather in flight (the buckets of two layers),
    // and keeps the rank's part of the FP32 weights.
    if (zero >= 2) st.gradients = (owned_trained + 2 * largest(block_trained)) * kF32;
    if (zero == 3) {
      const size_t gathered = (owned + std::min(flat - owned, held + 2 * largest_block)) * kF32;
      st.weights = gathered;
      if (spec.dtype == T::DType::kBF16) {
        std::map<int, size_t> per_layer;
        size_t bucket = 0, in_flight = 0;
        for (const T::GradientBucket& b : buckets) {
          bucket = std::max(bucket, b.hi - b.lo);
          in_flight = std::max(in_flight, 2 * ++per_layer[b.key]);
        }
        st.weights = owned * kF32;
        st.bf16_copy = gathered + in_flight * bucket * sizeof(uint16_t);
      }
    }
    const int shards = spec.parallel.sequence_parallel ? lay.tp : 1;
    st.activations =
        activation_bytes(local, slice, spec.batch, spec.dtype, st.chunk_slots, spec.recompute, shards);
    st.weight_grads = size_t(st.waiting) * weight_grad_bytes(local, slice, spec.batch, spec.dtype);
    if (shards > 1) {  // SequenceScratch (tensor_parallel.cpp): gathered and whole rows; norm partials
      const size_t chunks = (N / size_t(shards) + T::kNormChunkRows - 1) / T::kNormChunkRows;
      st.activations +=
          (2 * N * size_t(m.d_model) + (1 + size_t(shards)) * chunks * 2 * size_t(m.d_model)) * kF32;
      if (spec.dtype == T::DType::kBF16) st.activations += N * size_t(m.d_model) * sizeof(uint16_t);
    }
    if (lay.cp > 1) {  // ContextScratch (context_attention.h), and a2a's whole-sequence activations
      const size_t heads = size_t(m.heads / lay.tp), kv = size_t(std::max(1, m.kv_heads / lay.tp));
      // Document ids (and a2a's document starts) on the host and in the backend's memory.
      const size_t hd = size_t(m.head_dim), qkv = (heads + 2 * kv) * hd, ids = 2 * size_t(lay.cp) * N * 4;
      if (spec.parallel.cp_comm == T::ContextComm::kRing)  // key/value messages and accumulators, 2 each
        st.activations += (4 * N * 2 * kv * hd + N * heads) * kF32 + ids;
      else  // per layer and slot q, k, v and lse; send, receive, out, dout, dqkv
        st.activations +=
            size_t(st.last_layer - st.first_layer) * size_t(st.slots) * N * (qkv + heads) * kF32 +
            (3 * N * qkv + 2 * N * heads * hd) * kF32 + 2 * ids;
      if (spec.dtype == T::DType::kBF16)
        st.activations += N * (qkv + heads * hd) * kF32;  // widened q, k, v, out
    }
    // recv_act_, recv_grad_: this rank's share of the stream (both on every stage of an interleaved pipeline)
    st.pipeline =
        ((st.embedding && chunks == 1 ? 0 : NC) + (st.head && chunks == 1 ? 0 : NC)) / size_t(shards) * kF32;
    if (st.head) {
      const std::string classifier = m.tied_embeddings ? "wte.weight" : "head.weight";
      for (const T::ParamInfo& p : params)
        if (p.name == classifier) {
          const int V = int(p.local_shape[0]);
          st.logits_chunk = std::min(N, chunk_rows(spec.device, V)) * size_t(V) * kF32;
        }
    }
    plan.stages.push_back(st);
  }
  const int micro = spec.microbatches;
  plan.pipeline.bubble = T::simulate(plan.pipeline.stages, micro).bubble;
  if (lay.pp > 1) {
    // The other schedules at this layout: interleaved with 2 chunks a stage where the blocks split into
    // 2 x pp equal ones and the micro-batches are a multiple of the stages.
    for (const T::PipeScheduleKind kind : T::kPipeSchedules) {
      const int v = kind == T::PipeScheduleKind::kInterleaved ? 2 : 1;
      if (kind == spec.parallel.pp_schedule ||
          (v > 1 && (m.layers % (lay.pp * v) != 0 || micro % lay.pp != 0)))
        continue;
      plan.pipeline.alternatives.push_back(
          {std::string(T::schedule_name(kind)), v,
           T::simulate(T::pipeline_schedule(kind, lay.pp, v, micro), micro).bubble});
    }
  }
  return plan;
}

namespace {

const StagePlan& largest_stage(const Plan& plan) {
  return *std::max_element(plan.stages.begin(), plan.stages.end(),
                           [](const StagePlan& a, const StagePlan& b) { return a.total() < b.total(); });
}

}  // namespace

void check_memory_cap(const Plan& plan) {
  const T::TrainSpec& spec = plan.spec;
  const double cap = spec.memory_cap_gib * 1024.0 * 1024.0 * 1024.0;
  const StagePlan& worst = largest_stage(plan);
  if (cap <= 0 || double(worst.total()) <= cap) return;
  const std::pair<const char*, size_t> parts[] = {
      {"weights", worst.weights},         {"gradients", worst.gradients},
      {"AdamW moments", worst.optimizer}, {"BF16 copy", worst.bf16_copy},
      {"activations", worst.activations}, {"weight-gradient queues", worst.weight_grads},
      {"buffers", worst.buffers()}};
  const auto& big = *std::max_element(std::begin(parts), std::end(parts),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  // One key changed at a time, each candidate validated as a run validates it.
  std::vector<std::string> fits;
  const auto consider = [&](T::TrainSpec s, const std::string& change) {
    if (fits.size() >= 3 || T::parallel_problem(s.model, s.layout, s.parallel, s.microbatches)) return;
    const Plan p = make_plan(s, plan.zero_nodes);
    if (double(largest_stage(p).total()) <= cap)
      fits.push_back(fmt::format("{} ({} per rank, {} ranks)", change, bytes_str(largest_stage(p).total()),
                                 s.layout.world()));
  };
  // A higher ZeRO stage.
  for (int zero = spec.parallel.zero + 1; spec.layout.dp > 1 && zero <= 3; ++zero) {
    T::TrainSpec s = spec;
    s.parallel.zero = zero;
    consider(s, fmt::format("parallel.zero = {}", zero));
  }
  for (const auto& [key, dim] :
       {std::pair<const char*, int Layout::*>{"cp", &Layout::cp}, {"tp", &Layout::tp}, {"pp", &Layout::pp}})
    for (int f = 2; f <= 8; f *= 2) {
      T::TrainSpec s = spec;
      s.layout.*dim *= f;
      consider(s, fmt::format("parallel.{} = {}", key, s.layout.*dim));
    }
  std::string alternatives = "none of parallel.cp, tp or pp up to 8x, or ZeRO-1, fits";
  if (!fits.empty()) {
    alternatives = "would fit with ";
    for (size_t i = 0; i < fits.size(); ++i) alternatives += (i ? ", or " : "") + fits[i];
  }
  fail(ExitCode::kUsage,
       "run.memory_per_rank_gib = {:g}: the plan of layout {} needs {} per rank (stage {}; the largest part: "
       "{} {}); {} (forge-train --plan shows every part)",
       spec.memory_cap_gib, spec.layout.str(), bytes_str(worst.total()), worst.stage, big.first,
       bytes_str(big.second), alternatives);
}

std::string format_plan(const Plan& plan) {
  const T::TrainSpec& spec = plan.spec;
  const T::ModelSpec& m = spec.model;
  const Layout& lay = spec.layout;
  const T::Recompute& re = spec.recompute;
  std::string extras;
  if (spec.parallel.sequence_parallel && lay.tp > 1) extras += ", sequence parallel";
  if (re.kind != T::Recompute::Kind::kNone)
    extras +=
        fmt::format(", {} recompute in {}", recompute_name(re.kind),
                    re.every == 1 ? std::string("every block") : fmt::format("one block in {}", re.every));
  std::string out = fmt::format(
      "plan of {}: layout {} ({} rank{}), {}, {}, ZeRO-{}{}; {} micro-batch{} of {} x {} positions per step "
      "and data-parallel rank\n",
      spec.name, lay.str(), lay.world(), lay.world() == 1 ? "" : "s", T::device_name(spec.device),
      T::dtype_name(spec.dtype), spec.parallel.zero, extras, spec.microbatches,
      spec.microbatches == 1 ? "" : "es", spec.batch, m.seq_len);
  std::string ffn = fmt::format("dense {} FFN {}", family_ffn(m), m.ffn_hidden);
  if (m.ffn == T::Ffn::kMoe)
    ffn = fmt::format(
        "{}MoE {}: {} {} experts of {}, top {}{}", m.moe_every == 1 ? "" : fmt::format("{}, ", ffn),
        m.moe_every == 1 ? std::string("in every block") : fmt::format("every {} blocks", m.moe_every),
        m.experts, family_ffn(m), m.moe_hidden, m.top_k,
        m.shared_expert_hidden > 0 ? fmt::format(", a shared expert of {}", m.shared_expert_hidden)
                                   : std::string());
  out += fmt::format(
      "model: {}, {} blocks, d_model {}, {} heads ({} key/value) of {}{}, {}, vocabulary {}, {} classifier\n",
      T::family_name(m.family), m.layers, m.d_model, m.heads, m.kv_heads, m.head_dim,
      m.window > 0 ? fmt::format(", window {}", m.window) : std::string(), ffn, m.vocab,
      m.tied_embeddings ? "tied" : "untied");
  out += fmt::format("parameters: {} total ({:.0f}), {} active per token ({:.0f})\n",
                     count_str(plan.total_parameters), plan.total_parameters,
                     count_str(plan.active_parameters), plan.active_parameters);
  const double tokens = double(lay.dp) * spec.microbatches * spec.batch * m.seq_len;
  out += fmt::format(
      "FLOPs per token: {} (attention {}, {:.1f}%; the rest 6 x the active parameters that multiply); per "
      "step of {:.0f} tokens: {}\n",
      flops_str(plan.flops_per_token), flops_str(plan.attention_flops),
      100.0 * plan.attention_flops / plan.flops_per_token, tokens, flops_str(plan.flops_per_token * tokens));
  if (lay.pp > 1)
    out += fmt::format(
        "pipeline: {}{} over {} stages, {} micro-batch{} per step: bubble {:.1f}% of the step (equal stages, "
        "a backward twice a forward; --schedule lists every stage's actions)\n",
        plan.pipeline.schedule,
        plan.pipeline.chunks > 1 ? fmt::format(" ({} model chunks a stage)", plan.pipeline.chunks) : "",
        lay.pp, spec.microbatches, spec.microbatches == 1 ? "" : "es", 100.0 * plan.pipeline.bubble);
  if (!plan.pipeline.alternatives.empty()) {
    std::string other;
    for (const PipelinePlan::Alternative& a : plan.pipeline.alternatives)
      other +=
          fmt::format("{}{}{} {:.1f}%", other.empty() ? "" : ", ", a.schedule,
                      a.chunks > 1 ? fmt::format(" ({} chunks a stage)", a.chunks) : "", 100.0 * a.bubble);
    out += fmt::format("  other schedules' bubble at this layout (parallel.pp_schedule): {}\n", other);
  }
  size_t largest = 0, job = 0;
  int largest_stage = 0;
  for (const StagePlan& st : plan.stages) {
    std::string holds;
    for (int c = 0; c < st.chunks; ++c)
      holds += fmt::format("{}{}-{}", c == 0 ? "blocks " : ", ", st.first_layer + c * st.chunk_stride,
                           st.last_layer - 1 + c * st.chunk_stride);
    if (st.first_layer == st.last_layer) holds = "no blocks";
    if (st.embedding) holds += " + embeddings";
    if (st.head) holds += " + final norm, classifier";
    std::string flight = fmt::format("{} micro-batch{}", st.slots, st.slots == 1 ? "" : "es");
    if (st.chunks > 1) flight += fmt::format(" ({} on its model chunks)", fmt::join(st.chunk_slots, ", "));
    out += fmt::format("stage {} ({}): {} rank{} alike (tp{}{} x dp{}{}), {} in flight\n", st.stage, holds,
                       st.ranks, st.ranks == 1 ? "" : "s", lay.tp,
                       lay.cp > 1 ? fmt::format(" x cp{}", lay.cp) : std::string(), lay.dp,
                       lay.ep > 1 ? fmt::format(", ep{}", lay.ep) : std::string(), flight);
    out += fmt::format("  parameters   {} held per rank (flat buffers of {} values)\n", count_str(st.held),
                       st.parameters);
    const int zero = spec.parallel.zero;
    const std::string cp = lay.cp > 1 ? fmt::format(" x cp{}", lay.cp) : std::string();
    const std::string sharded =
        spec.parallel.shard_within_node
            ? fmt::format(
                  "sharded over each node's 1/{} of dp{}{}, copied on every node (parallel.zero = {}, "
                  "zero_group = node)",
                  plan.zero_nodes, lay.dp, cp, zero)
            : fmt::format("sharded over dp{}{} (parallel.zero = {})", lay.dp, cp, zero);
    out += fmt::format("  weights      {:>10}  FP32 master{}\n", bytes_str(st.weights),
                       zero == 3 ? ", " + sharded + ", and the layers a pass is at" : std::string());
    out += fmt::format("  gradients    {:>10}  FP32{}\n", bytes_str(st.gradients),
                       zero >= 2 ? ", " + sharded + ", and the blocks being reduced" : std::string());
    out += fmt::format("  AdamW        {:>10}  m and v, FP32, {}\n", bytes_str(st.optimizer),
                       zero >= 1 ? sharded : std::string("whole on every rank (parallel.zero = 0)"));
    if (spec.dtype == T::DType::kBF16)
      out +=
          fmt::format("  BF16 copy    {:>10}  the weights forward and backward read (BF16 in FP32 slots)\n",
                      bytes_str(st.bf16_copy));
    out += fmt::format(
        "  activations  {:>10}  saved for backward and scratch, {}{}\n", bytes_str(st.activations), flight,
        lay.cp > 1 ? fmt::format(" of {} positions a sequence (cp{}), {}", m.seq_len / lay.cp, lay.cp,
                                 spec.parallel.cp_comm == T::ContextComm::kRing
                                     ? "the ring's buffers"
                                     : "the all-to-all's buffers and whole-sequence heads")
                   : std::string());
    if (st.waiting > 0)
      out += fmt::format(
          "  W queues     {:>10}  ZB-H1: what the weight-gradient passes read, {} micro-batch{}\n",
          bytes_str(st.weight_grads), st.waiting, st.waiting == 1 ? "" : "es");
    std::string parts = fmt::format("gradient shard {}", bytes_str(st.grad_shard));
    if (st.pipeline > 0) parts += fmt::format(", pipeline receive {}", bytes_str(st.pipeline));
    if (st.logits_chunk > 0) parts += fmt::format(", logits chunk {}", bytes_str(st.logits_chunk));
    out += fmt::format("  buffers      {:>10}  {}\n", bytes_str(st.buffers()), parts);
    out += fmt::format("  total        {:>10}\n", bytes_str(st.total()));
    if (st.total() > largest) {
      largest = st.total();
      largest_stage = st.stage;
    }
    job += st.total() * size_t(st.ranks);
  }
  out += fmt::format("largest rank: {} (stage {}); the job: {} on {} rank{}\n", bytes_str(largest),
                     largest_stage, bytes_str(job), lay.world(), lay.world() == 1 ? "" : "s");
  out += "not planned: the data reader, the communication libraries' buffers";
  if (spec.device == T::Device::kCuda) out += ", the CUDA context and the allocator's slack";
  if (const std::string_view more = T::traits(spec.objective).unplanned; !more.empty())
    out += fmt::format(", {}", more);
  out += "\n";
  return out;
}

std::string format_schedule(const Plan& plan) {
  std::string out = fmt::format(
      "schedule {} (F: forward, B: backward of micro-batch i{}{}):\n", plan.pipeline.schedule,
      plan.pipeline.chunks > 1 ? "; Fi.c: on model chunk c" : "",
      plan.pipeline.schedule == "zb-h1" ? "; B: its input gradients, W: its weight gradients" : "");
  for (size_t s = 0; s < plan.pipeline.stages.size(); ++s)
    out += fmt::format("  stage {}: {}\n", s, T::describe(plan.pipeline.stages[s]));
  return out;
}

Json plan_json(const Plan& plan) {
  const T::TrainSpec& spec = plan.spec;
  const Layout& lay = spec.layout;
  Json alternatives = Json::object();
  for (const PipelinePlan::Alternative& a : plan.pipeline.alternatives)
    alternatives[a.schedule] = {{"chunks", a.chunks}, {"bubble", a.bubble}};
  Json stages = Json::array();
  size_t largest = 0, job = 0;
  for (const StagePlan& st : plan.stages) {
    Json blocks = Json::array();
    for (int c = 0; c < st.chunks; ++c)
      blocks.push_back({st.first_layer + c * st.chunk_stride, st.last_layer - 1 + c * st.chunk_stride});
    stages.push_back({{"stage", st.stage},
                      {"blocks", st.chunks > 1 ? blocks : blocks[0]},
                      {"embedding", st.embedding},
                      {"head", st.head},
                      {"ranks", st.ranks},
                      {"slots", st.slots},
                      {"parameters", st.parameters},
                      {"held", st.held},
                      {"bytes",
                       {{"weights", st.weights},
                        {"gradients", st.gradients},
                        {"optimizer", st.optimizer},
                        {"bf16_copy", st.bf16_copy},
                        {"activations", st.activations},
                        {"weight_grads", st.weight_grads},
                        {"grad_shard", st.grad_shard},
                        {"pipeline", st.pipeline},
                        {"logits_chunk", st.logits_chunk},
                        {"buffers", st.buffers()},
                        {"total", st.total()}}}});
    largest = std::max(largest, st.total());
    job += st.total() * size_t(st.ranks);
  }
  return {{"spec", spec.name},
          {"layout", lay.str()},
          {"ranks", lay.world()},
          {"device", std::string(T::device_name(spec.device))},
          {"dtype", std::string(T::dtype_name(spec.dtype))},
          {"zero", spec.parallel.zero},
          {"zero_nodes", plan.zero_nodes},
          {"sequence_parallel", spec.parallel.sequence_parallel && lay.tp > 1},
          {"recompute", {{"kind", recompute_name(spec.recompute.kind)}, {"every", spec.recompute.every}}},
          {"batch", spec.batch},
          {"seq_len", spec.model.seq_len},
          {"microbatches", spec.microbatches},
          {"parameters", {{"total", plan.total_parameters}, {"active", plan.active_parameters}}},
          {"flops_per_token",
           {{"total", plan.flops_per_token},
            {"attention", plan.attention_flops},
            {"attention_share", plan.attention_flops / plan.flops_per_token}}},
          {"stages", stages},
          {"pipeline",
           {{"schedule", plan.pipeline.schedule},
            {"chunks", plan.pipeline.chunks},
            {"bubble", plan.pipeline.bubble},
            {"alternatives", alternatives}}},
          {"largest_rank_bytes", largest},
          {"job_bytes", job}};
}

int plan_command(const Config& config, bool json_only, bool schedule) {
  // train_spec validates the spec and the layout as a run does (exit 64, the same message); a plan needs
  // no ranks, so the world size is not checked.
  // Inside an allocation the plan is for its nodes (Slurm places a job's ranks in blocks, node by node).
  const T::TrainSpec spec = T::train_spec(config);
  int nodes = 1;
  if (const char* n = std::getenv("SLURM_JOB_NUM_NODES")) nodes = std::max(1, std::atoi(n));
  std::vector<std::string> hosts;
  const int world = spec.layout.world();
  for (int r = 0; r < world; ++r) hosts.push_back(std::to_string(int64_t(r) * nodes / world));
  const Plan plan = make_plan(spec, data_parallel_nodes(spec.layout, hosts));
  if (!json_only) std::fputs(format_plan(plan).c_str(), stdout);
  if (!json_only && schedule) std::fputs(format_schedule(plan).c_str(), stdout);
  check_memory_cap(plan);
  std::fputs((plan_json(plan).dump() + "\n").c_str(), stdout);
  return 0;
}

}  // namespace forge::launcher
