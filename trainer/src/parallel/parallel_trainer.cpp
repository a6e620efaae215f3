// The hybrid-parallel step. Per step: the stage's schedule (schedule.h) runs the micro-batches through it
// (activations forward to the next stage, their gradients back); during the last micro-batch's
// backward each layer's gradient bucket is handed to the data-parallel group as soon as it is complete;
// the tied embedding's two copies (first and last stage) are summed; then the global gradient norm,
// clipping and AdamW on this rank's shard, and (ZeRO-1) the updated shards gathered back.
#include "forge/trainer/parallel.h"

#include "forge/common/activity.h"
#include "forge/common/error.h"
#include "forge/common/local_rank.h"
#include "forge/common/trace.h"
#include "forge/trainer/context_parallel.h"
#include "forge/trainer/moe.h"
#include "forge/trainer/runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

namespace forge::trainer {

namespace {

size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

bool expert(const ParamInfo& p) {
  return p.shard.kind == ShardRule::Kind::kExperts;
}

struct CommTotals {
  double wait = 0;
  uint64_t bytes = 0;
};

// One empty RouterStats per MoE block of the model, in block order.
std::vector<RouterStats> router_layout(const ModelSpec& model) {
  std::vector<RouterStats> out;
  for (int l = 0; l < model.layers; ++l)
    if (model.moe_block(l)) out.push_back({l, std::vector<double>(size_t(model.experts), 0.0)});
  return out;
}

CommTotals totals(std::span<comm::Comm* const> comms) {
  CommTotals t;
  for (comm::Comm* c : comms)
    if (c != nullptr) {
      t.wait += c->stats().wait_s;
      t.bytes += c->stats().bytes;
    }
  return t;
}

}  // namespace

std::vector<int> stage_bounds(const ModelSpec& cfg, int pp, const std::vector<int>& counts) {
  const int L = cfg.layers;
  if (pp < 1 || pp > L || (!counts.empty() && int(counts.size()) != pp))
    throw std::invalid_argument("stage_bounds: the layout was not validated (parallel_problem)");
  std::vector<int> bounds{0};
  if (!counts.empty()) {
    for (int c : counts) bounds.push_back(bounds.back() + c);
    return bounds;
  }
  // Forward FLOPs per token: a block's matrix products and attention; the classifier on the last stage.
  const double block = 24.0 * cfg.d_model * cfg.d_model + 4.0 * cfg.seq_len * cfg.d_model;
  const double head = 2.0 * cfg.d_model * cfg.vocab;
  // best[s][l]: the smallest largest-stage cost placing blocks [0, l) on stages [0, s).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(pp) + 1, std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(pp) + 1, std::vector<int>(size_t(L) + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= pp; ++s)
    for (int l = s; l <= L; ++l)
      for (int j = s - 1; j < l; ++j) {
        const double cost = (l - j) * block + (s == pp ? head : 0.0);
        const double worst = std::max(best[size_t(s) - 1][size_t(j)], cost);
        if (worst < best[size_t(s)][size_t(l)]) {
          best[size_t(s)][size_t(l)] = worst;
          cut[size_t(s)][size_t(l)] = j;
        }
      }
  bounds.assign(size_t(pp) + 1, L);
  for (int s = pp, l = L; s > 0; --s) {
    bounds[size_t(s)] = l;
    l = cut[size_t(s)][size_t(l)];
  }
  bounds[0] = 0;
  return bounds;
}

int pipeline_chunks(const ParallelConfig& p) {
  return p.pp_schedule == PipeScheduleKind::kInterleaved ? p.pp_virtual : 1;
}

std::vector<int> virtual_stage_bounds(const ModelSpec& cfg, int pp, const ParallelConfig& p) {
  const int stages = pp * pipeline_chunks(p);
  return stages > pp ? stage_bounds(cfg, stages, std::vector<int>(size_t(stages), cfg.layers / stages))
                     : stage_bounds(cfg, pp, p.stage_layers);
}

ModelSlice stage_slice(const std::vector<int>& bounds, int pp, int stage, int chunks) {
  ModelSlice slice;
  slice.first_layer = bounds[size_t(stage)];
  slice.last_layer = bounds[size_t(stage) + 1];
  slice.embedding = stage == 0;
  slice.head = stage == pp - 1;
  slice.chunks = chunks;
  slice.chunk_stride = chunks > 1 ? bounds[size_t(stage + pp)] - bounds[size_t(stage)] : 0;
  return slice;
}

std::vector<FlatRange> trained_ranges(const std::vector<FlatRange>& ranges,
                                      const std::vector<ParamInfo>& params, const Freeze& freeze) {
  if (!freeze.any()) return ranges;
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges) {
    size_t at = r.lo;  // the start of the stretch being kept
    for (const ParamInfo& p : params) {
      const size_t lo = std::max(r.lo, p.offset), hi = std::min(r.hi, p.offset + p.numel);
      if (lo >= hi || !freeze.frozen(p.name)) continue;
      if (at < lo) out.push_back({at, lo});
      at = hi;
    }
    if (at < r.hi) out.push_back({at, r.hi});
  }
  if (out.empty()) out.push_back({0, 0});
  return out;
}

int gradient_bucket(const std::string& param, int layers) {
  if (param.rfind("blocks.", 0) == 0) return std::stoi(param.substr(7));
  if (param.rfind("lnf.", 0) == 0) return layers;
  return -1;
}

std::vector<GradientBucket> gradient_buckets(const std::vector<ParamInfo>& params, int layers, size_t align,
                                             size_t flat, const Freeze& freeze) {
  std::vector<GradientBucket> out;
  std::tuple<int, bool, ModelPart> key{-2, false, ModelPart::kLm};
  for (const ParamInfo& p : params) {
    const std::tuple<int, bool, ModelPart> k{gradient_bucket(p.name, layers), expert(p), model_part(p.name)};
    if (k == key) continue;
    key = k;
    const size_t lo = out.empty() ? 0 : round_up(p.offset, align);
    if (!out.empty()) {
      if (lo == out.back().lo) {  // an empty predecessor: this one takes its place
        out.back() = {lo, flat, std::get<0>(k), std::get<1>(k)};
        continue;
      }
      out.back().hi = lo;
    }
    out.push_back({lo, flat, std::get<0>(k), std::get<1>(k)});
  }
  for (GradientBucket& b : out)
    b.trains = std::ranges::any_of(params, [&](const ParamInfo& p) {
      return p.offset < b.hi && b.lo < p.offset + p.numel && !freeze.frozen(p.name);
    });
  return out;
}

ParallelTrainer::ParallelTrainer(const TrainSpec& spec, comm::ProcessGroups& groups, Backend& backend,
                                 std::shared_ptr<GPT> teacher)
    : spec_(spec), groups_(groups), backend_(backend) {
  const Layout& lay = groups.layout;
  if (!(lay == spec.layout))
    throw std::invalid_argument("ParallelTrainer: the process groups' layout " + lay.str() +
                                " is not the spec's " + spec.layout.str());
  chunks_ = pipeline_chunks(spec.parallel);
  bounds_ = virtual_stage_bounds(spec.model, lay.pp, spec.parallel);
  use_threads(spec.threads);  // before the model's buffers are touched by OpenMP
  backend.set_bf16_products(spec.dtype == DType::kBF16);
  const int s = groups.pp_rank;
  ModelSlice slice = stage_slice(bounds_, lay.pp, s, chunks_);
  slice.tp_rank = groups.tp_rank;
  slice.tp_size = lay.tp;
  slice.ep_rank = groups.ep_rank;
  slice.ep_size = lay.ep;
  // The stage's actions in a step (schedule.h); each model chunk keeps activations for its micro-batches in
  // flight, and ZB-H1 what the weight-gradient passes read for the micro-batches waiting for theirs.
  const std::vector<StageSchedule> stages =
      pipeline_schedule(spec.parallel.pp_schedule, lay.pp, chunks_, spec.microbatches);
  schedule_ = stages[size_t(s)];
  const std::vector<int> slots = chunk_slots(schedule_, chunks_);
  for (const int n : slots) slot_base_.push_back(slot_base_.back() + n);
  for (int i = 0; i < waiting_for_weights(schedule_); ++i) waiting_.emplace_back(backend);
  analytic_bubble_ = simulate(stages, spec.microbatches).bubble;
  // Dense gradients are reduced, and ZeRO-1 shards, over the ranks holding the same weights: dp, times cp.
  comm::Comm* dense = dense_ = lay.cp > 1 ? groups.dp_cp.get() : groups.dp.get();
  const size_t dp = size_t(dense->size());
  // ZeRO-2/3 release what a rank does not own between uses, whole pages (a GPU's granules) at a time:
  // every layer's parameters start where each rank's part of them starts on one.
  const int zero = spec.parallel.zero;
  const size_t align = zero >= 2 ? dp * backend.release_floats() : dp;
  plan_ = std::make_unique<ParallelPlan>(*groups.tp, *groups.ep, *groups.cp, spec.parallel.cp_comm,
                                         spec.parallel.sequence_parallel, groups.pp.get());
  loss_ = objective_loss(spec, std::move(teacher));
  // Under context parallelism the model holds this rank's two chunks of each sequence (context_parallel.h).
  ModelSpec local = spec.model;
  local.seq_len /= lay.cp;
  model_ = std::make_unique<GPT>(local, ModelSetup{.batch = spec.batch,
                                                   .dtype = spec.dtype,
                                                   .slice = slice,
                                                   .slots = slots,
                                                   .backend = &backend,
                                                   .layers = plan_.get(),
                                                   .flat_multiple = align,
                                                   .layer_align = zero >= 2 ? align : 1,
                                                   .loss = loss_,
                                                   .recompute = spec.recompute,
                                                   .frozen = spec.freeze.predicate()});
  model_->init(spec.seed);
  if (const int replicas = std::max(1, lay.tp / spec.model.kv_heads); replicas > 1) {
    kv_ = groups.tp->split(groups.tp_rank / replicas, groups.tp_rank % replicas, "kv");
    for (const ParamInfo& p : model_->params())
      if (p.shard.replicas > 1 && !spec.freeze.frozen(p.name))
        kv_params_[gradient_bucket(p.name, spec.model.layers)].push_back(&p);
  }
  // The router losses of a step: the mean over its micro-batches on every data-parallel rank.
  model_->set_router_loss_weight(1.0f / float(spec.microbatches * lay.dp));
  for (MoeLayer* moe : model_->moe_layers())
    if (moe->layer() == spec.guard.inject_dead_layer) moe->never_choose(spec.guard.inject_dead_expert);

  // Hybrid sharding: a bucket's reduce-scatter and gathers stay within the node; the node's sum of a part
  // is added to the other nodes' by an all-reduce. The table's alignment (a multiple of dense_'s size)
  // divides evenly by the node's share of either group, since every node holds as many of its ranks.
  if (spec.parallel.shard_within_node) {
    dense_nodes_ = comm::split_by_node(*dense, node_name(), "parallel.zero_group");
    expert_nodes_ = comm::split_by_node(*groups.expert_dp, node_name(), "parallel.zero_group");
  }
  const auto within = [](const comm::NodeSplit& n, comm::Comm* whole) {
    return n.shard ? n.shard.get() : whole;
  };
  const auto across = [](const comm::NodeSplit& n) { return n.nodes > 1 ? n.replica.get() : nullptr; };
  // Buckets (gradient_buckets): the experts of an MoE block are reduced over expert_dp (the ranks holding
  // the same experts) instead of dp; their stretch is aligned already (parameter_table), so no element
  // changes group. A bucket with nothing that trains (train.freeze) is never reduced: its gradients are
  // never formed.
  const size_t flat = model_->weights().size();
  for (const GradientBucket& b :
       gradient_buckets(model_->params(), spec.model.layers, align, flat, spec.freeze)) {
    const comm::NodeSplit& nodes = b.experts ? expert_nodes_ : dense_nodes_;
    buckets_.push_back({b.lo, b.hi, b.key, within(nodes, b.experts ? groups.expert_dp.get() : dense), 0,
                        nullptr, across(nodes)});
    buckets_.back().trains = b.trains;
  }
  size_t at = 0;
  for (Bucket& b : buckets_) {
    const size_t part = (b.hi - b.lo) / size_t(b.group->size());
    const size_t r = size_t(b.group->rank());
    b.shard_at = at;
    owned_.push_back({b.lo + r * part, b.lo + (r + 1) * part});
    at += part;
  }
  shard_ = backend.alloc<float>(at);
  if (spec.parallel.reduce_each_microbatch) partial_ = backend.alloc<float>(at);
  gathered_ = buckets_.size();  // no gather pending
  // Each gradient element counts once in the global norm: tensors not split by tensor parallelism on
  // tensor-parallel rank 0 only, the tied embedding on the first stage only. Expert tensors differ across
  // the ep group and are owned in parts across expert_dp, as the rest is across dp; under hybrid sharding
  // the first node's copy of a part counts.
  for (const ParamInfo& p : model_->params()) {
    const bool replicated = lay.tp > 1 && p.shard.kind != ShardRule::Kind::kSplit;
    const bool tied_copy = p.name == "wte.weight" && lay.pp > 1 && !groups.first_stage();
    const bool replica = groups.tp_rank % p.shard.replicas != 0;  // a key/value head's other holders
    if ((replicated && groups.tp_rank != 0) || tied_copy || replica || spec.freeze.frozen(p.name)) continue;
    for (size_t i = 0; i < owned_.size(); ++i) {
      if (buckets_[i].replicas != nullptr && buckets_[i].replicas->rank() != 0) continue;
      const FlatRange& r = owned_[i];
      const size_t lo = std::max(r.lo, p.offset), hi = std::min(r.hi, p.offset + p.numel);
      if (lo < hi) norm_ranges_.push_back({lo, hi});
    }
  }
  optimizer_ = std::make_unique<AdamW>(
      spec.optim, model_->params(), flat,
      trained_ranges(zero >= 1 ? owned_ : std::vector<FlatRange>{{0, flat}}, model_->params(), spec.freeze),
      backend);
  // ZeRO-3: a rank keeps its part of the weights; the rest is gathered where a pass needs it.
  if (zero == 3) release_weights([](int) { return true; });
  const size_t nc = size_t(model_->stream_rows()) * size_t(spec.model.d_model);
  if (!groups.first_stage() || chunks_ > 1) recv_act_ = backend.alloc<float>(nc);
  if (!groups.last_stage() || chunks_ > 1) recv_grad_ = backend.alloc<float>(nc);
}

ParallelTrainer::~ParallelTrainer() = default;

int ParallelTrainer::shard_copy(bool experts) const {
  const comm::NodeSplit& nodes = experts ? expert_nodes_ : dense_nodes_;
  return nodes.nodes > 1 ? nodes.replica->rank() : 0;
}

GPT& ParallelTrainer::model() {
  complete_gathers();
  return *model_;
}

GPT& ParallelTrainer::model_to_load() {
  if (spec_.parallel.zero < 3) return model();
  release_weights([](int) { return true; });
  return *model_;
}

void ParallelTrainer::launch_gathers() {
  float* w = model_->weights().data();
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].group->size() > 1 && buckets_[i].trains)  // a frozen bucket is the same everywhere
      buckets_[i].gather = buckets_[i].group->all_gather(w + owned_[i].lo, w + buckets_[i].lo,
                                                         owned_[i].hi - owned_[i].lo, comm::CommType::kF32);
  gathered_ = 0;
}

void ParallelTrainer::need_weights(int layer) {
  for (; gathered_ < buckets_.size() && buckets_[gathered_].key <= layer; ++gathered_) {
    Bucket& b = buckets_[gathered_];
    if (b.gather) {
      mark_activity("all_gather (ZeRO-1 parameters)");
      b.gather->wait();
      b.gather.reset();
    }
    model_->weights_changed({b.lo, b.hi});
  }
}

void ParallelTrainer::complete_gathers() {
  if (spec_.parallel.zero < 3) return need_weights(std::numeric_limits<int>::max());
  for (Bucket& b : buckets_) start_gather(b, Held::kWhole);
  for (Bucket& b : buckets_) finish_gather(b);
}

void ParallelTrainer::start_gather(Bucket& b, Held want) {
  float* const work = model_->working_copy().data();
  if (work == nullptr) want = Held::kWhole;  // FP32: the passes read the weights
  if (b.held >= want || (b.gather && b.gathering >= want)) return;
  finish_gather(b);  // a BF16 gather in flight, FP32 asked for: it lands first
  if (b.held >= want) return;
  const FlatRange& mine = owned_[size_t(&b - buckets_.data())];
  const size_t part = mine.hi - mine.lo;
  for (float* w : {model_->weights().data(), work}) {
    if (w == nullptr || (w != work && want == Held::kWorking)) continue;
    backend_.acquire(w + b.lo, mine.lo - b.lo);  // what release_weights handed back
    backend_.acquire(w + mine.hi, b.hi - mine.hi);
  }
  b.gathering = want;
  if (want == Held::kWhole) {
    float* w = model_->weights().data();
    b.gather = b.group->all_gather(w + mine.lo, w + b.lo, part, comm::CommType::kF32);
    return;
  }
  // The rank's part of the working copy (BF16 values already: exact) into its place in a staging buffer
  // no gather in flight holds.
  int s = 0;
  while (s < int(staging_.size()) &&
         std::ranges::any_of(buckets_, [s](const Bucket& k) { return k.staged == s; }))
    ++s;
  if (s == int(staging_.size())) {
    size_t largest = 0;
    for (const Bucket& k : buckets_) largest = std::max(largest, k.hi - k.lo);
    staging_.push_back(backend_.alloc<uint16_t>(largest));
  }
  b.staged = s;
  uint16_t* out = staging_[size_t(s)].data();
  backend_.convert(Act(out + (mine.lo - b.lo)), ConstAct(work + mine.lo), part);
  b.gather = b.group->all_gather(out + (mine.lo - b.lo), out, part, comm::CommType::kBF16);
}

void ParallelTrainer::finish_gather(Bucket& b) {
  if (!b.gather) return;
  mark_activity("all_gather (ZeRO-3 parameters)");
  const auto t0 = std::chrono::steady_clock::now();
  b.gather->wait();
  b.gather.reset();
  gather_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t n = b.hi - b.lo;
  if (b.gathering == Held::kWhole) {
    gather_bytes_ += n * sizeof(float);
    model_->weights_changed({b.lo, b.hi});  // BF16: the working copy of what arrived
  } else {
    gather_bytes_ += n * sizeof(uint16_t);
    float* work = model_->working_copy().data() + b.lo;
    backend_.convert(Act(work), ConstAct(staging_[size_t(b.staged)].data()), n);
    model_->working_copy_changed({b.lo, b.hi});
    b.staged = -1;
  }
  b.held = b.gathering;
}

void ParallelTrainer::sample_state() {
  const auto resident = [&](std::span<float> s) { return backend_.resident_bytes(s.data(), s.size()); };
  peak_state_ = std::max(peak_state_, resident(model_->weights()) + resident(model_->working_copy()) +
                                          resident(model_->grads()) + resident(shard_.span()) +
                                          resident(partial_.span()) + resident(optimizer_->m()) +
                                          resident(optimizer_->v()));
}

void ParallelTrainer::gather_layer(int layer, int next) {
  for (Bucket& b : buckets_)
    if (b.key == layer) start_gather(b, Held::kWorking);
  if (spec_.parallel.prefetch)
    for (Bucket& b : buckets_)
      if (b.key == next) start_gather(b, Held::kWorking);
  for (Bucket& b : buckets_)
    if (b.key == layer) finish_gather(b);
}

void ParallelTrainer::acquire_gradients(int layer) {
  float* g = model_->grads().data();
  for (const Bucket& b : buckets_)
    if (b.key == layer) backend_.acquire(g + b.lo, b.hi - b.lo);
}

void ParallelTrainer::release_weights(const std::function<bool(int)>& layers) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.group->size() == 1 || !layers(b.key)) continue;
    finish_gather(b);  // a prefetch still in flight lands before its memory goes
    for (float* w : {model_->weights().data(), model_->working_copy().data()}) {
      if (w == nullptr) continue;  // FP32: no working copy
      backend_.release(w + b.lo, owned_[i].lo - b.lo);
      backend_.release(w + owned_[i].hi, b.hi - owned_[i].hi);
    }
    b.held = Held::kPart;
  }
}

void ParallelTrainer::start_replica_sums(const Bucket* through) {
  for (; replicas_started_ < launched_.size(); ++replicas_started_) {
    Bucket& b = *launched_[replicas_started_];
    if (through != nullptr && b.launch_order <= through->launch_order)
      b.request->wait();
    else if (!b.request->test())
      return;
    const size_t part = (b.hi - b.lo) / size_t(b.group->size());
    b.replica_sum = b.replicas->all_reduce((b.into_partial ? partial_ : shard_).data() + b.shard_at, part,
                                           comm::CommType::kF32, comm::ReduceOp::kSum);
  }
}

bool ParallelTrainer::reduced(Bucket& b) {
  if (!b.request->test()) return false;
  if (b.replicas == nullptr) return true;
  start_replica_sums(nullptr);
  return b.replica_sum && b.replica_sum->test();
}

void ParallelTrainer::settle(Bucket& b) {
  if (!b.request || b.settled) return;
  b.request->wait();
  if (b.replicas != nullptr) {
    start_replica_sums(&b);
    b.replica_sum->wait();
    b.replica_sum.reset();
  }
  b.settled = true;
  if (b.into_partial) {
    // shard += partial: add_chunk_sums of one chunk is an elementwise add.
    const size_t part = (b.hi - b.lo) / size_t(b.group->size());
    backend_.add_chunk_sums(shard_.data() + b.shard_at, partial_.data() + b.shard_at, 1, int(part),
                            int(part));
  }
  b.reduced = true;
  // ZeRO-2/3: the bucket's sum is in this rank's shard; its gradients are not kept.
  if (spec_.parallel.zero >= 2) backend_.release(model_->grads().data() + b.lo, b.hi - b.lo);
}

void ParallelTrainer::settle_microbatch() {
  for (Bucket& b : buckets_) {
    settle(b);
    b.request.reset();
    b.settled = false;
  }
  launched_.clear();
  replicas_started_ = 0;
}

void ParallelTrainer::launch(Bucket& b) {
  if ((b.group->size() == 1 && b.replicas == nullptr) || b.request || !b.trains) return;
  float* g = model_->grads().data();
  const size_t n = b.hi - b.lo;
  b.into_partial = b.reduced;
  if (spec_.parallel.zero >= 1) {
    float* out = (b.into_partial ? partial_ : shard_).data() + b.shard_at;
    backend_.acquire(out, n / size_t(b.group->size()));  // ZeRO-2/3 released shard_ after the last step
    b.request = b.group->reduce_scatter(g + b.lo, out, n / size_t(b.group->size()), comm::CommType::kF32);
  } else
    b.request = b.group->all_reduce(g + b.lo, n, comm::CommType::kF32, comm::ReduceOp::kSum);
  if (b.replicas != nullptr) {
    b.launch_order = launched_.size();
    launched_.push_back(&b);
  }
}

void ParallelTrainer::finish_gradients() {
  if (groups_.embed && spec_.model.tied_embeddings && !spec_.freeze.frozen("wte.weight")) {
    mark_activity("all_reduce embed (tied embedding)");
    auto wte = model_->grad("wte.weight");
    groups_.embed->all_reduce_sum(wte.data(), wte.size());
  }
  for (Bucket& b : buckets_) launch(b);
  for (Bucket& b : buckets_) settle(b);
  if (spec_.parallel.zero >= 1 && dense_->size() > 1) {
    TraceSpan span("gradient shards", "compute");
    float* g = model_->grads().data();
    for (size_t i = 0; i < buckets_.size(); ++i)
      if ((buckets_[i].group->size() > 1 || buckets_[i].replicas != nullptr) && buckets_[i].trains) {
        backend_.acquire(g + owned_[i].lo, owned_[i].hi - owned_[i].lo);  // ZeRO-2/3: settle released them
        backend_.copy(g + owned_[i].lo, shard_.data() + buckets_[i].shard_at,
                      sizeof(float) * (owned_[i].hi - owned_[i].lo));
      }
    if (spec_.parallel.zero >= 2) backend_.release(shard_.data(), shard_.size());
  }
}

StepStats ParallelTrainer::step(std::span<const MicroBatch> batches) {
  const int m = spec_.microbatches;
  if (int(batches.size()) != m)
    throw std::invalid_argument("ParallelTrainer::step: expected parallel.microbatches micro-batches");
  for (const MicroBatch& b : batches) GPT::check_batch(b, spec_.batch, spec_.model);
  const std::vector<MicroBatch> shards = context_shards(batches);
  if (!shards.empty()) batches = shards;
  // The loss's figures are this step's: drop what forward-only passes since the last step added (the
  // verification loss of a checkpoint's save or resume, loss_of), which an uninterrupted run and a
  // resumed one do at different steps.
  loss_->take_metrics();
  loss_->take_maxima();
  model_->take_router_stats();
  backend_.mark_step_start();
  const auto t0 = std::chrono::steady_clock::now();
  comm::ProcessGroups& g = groups_;
  // Every group the step's communication figures count; the pipeline's waits are its bubble, apart.
  comm::Comm* const all[] = {g.tp.get(),
                             g.dp.get(),
                             g.cp.get(),
                             g.dp_cp.get(),
                             g.embed.get(),
                             g.world.get(),
                             g.ep.get(),
                             g.expert_dp.get(),
                             kv_.get(),
                             dense_nodes_.shard.get(),
                             dense_nodes_.replica.get(),
                             expert_nodes_.shard.get(),
                             expert_nodes_.replica.get()};
  comm::Comm *const experts[] = {g.ep.get()}, *const ring[] = {g.cp.get()}, *const pipe[] = {g.pp.get()};
  const CommTotals comm0 = totals(all), experts0 = totals(experts), ring0 = totals(ring),
                   pipe0 = totals(pipe);
  gather_s_ = 0;
  gather_bytes_ = 0;
  peak_state_ = 0;
  const int64_t step = optimizer_->steps_taken() + 1;
  const int T = spec_.model.seq_len, dpn = g.layout.dp;
  const size_t nc = size_t(model_->stream_rows()) * size_t(spec_.model.d_model);
  const bool first = g.first_stage(), last = g.last_stage();
  const int stage = g.pp_rank;
  const int zero = spec_.parallel.zero, layers = spec_.model.layers;
  int chunk = 0;  // the model chunk a pass runs (interleaved)
  // Where the passes find their weights. ZeRO-1/2: the forward completes the update's gathers as it
  // reaches each layer. ZeRO-3: each pass gathers a block's weights before it and lets them go after it
  // (the next block's gather started meanwhile); the embeddings, the classifier and the final norm stay
  // whole from the step's first forward to its end.
  const auto block = [layers](int l) { return l >= 0 && l < layers; };
  size_t action = 0;  // the schedule's action running
  // A pass followed by the other direction's on the same chunk ends with the block that one begins with (a
  // forward with the chunk's last block, a backward with its first): ZeRO-3 keeps that block gathered
  // across, as FSDP keeps the last block from its forward to its backward, saving its gather. A step
  // ends with a backward or a weight pass, so no block stays gathered past it.
  const auto kept = [&](int l, PipeOp pass) {
    if (action + 1 >= schedule_.size()) return false;
    const PipeAction& next = schedule_[action + 1];
    if (pass == PipeOp::kForward)
      return next.op == PipeOp::kBackward && next.chunk == chunk && l == last_block(chunk);
    return next.op == PipeOp::kForward && next.chunk == chunk && l == first_block(chunk);
  };
  WeightHooks forward_weights, backward_weights;
  // ZeRO-2/3 release the gradients at the step's start and each bucket's after its reduction: the
  // backward takes a layer's back before it writes them (the forward the embeddings' and the classifier's,
  // which the head's loss writes).
  if (zero < 3) {
    forward_weights.need = [this](int l) { need_weights(l); };
    if (zero == 2)
      backward_weights.need = [this](int l) {
        acquire_gradients(l);
        sample_state();
      };
  } else {
    forward_weights.need = [&](int l) {
      gather_layer(l, l < 0 ? first_block(chunk) : l + 1);
      sample_state();
    };
    backward_weights.need = [&](int l) {
      gather_layer(l, l - 1);
      acquire_gradients(l);
      sample_state();
    };
    forward_weights.done = [&](int l) {
      if (block(l) && !kept(l, PipeOp::kForward)) release_weights([l](int key) { return key == l; });
    };
    backward_weights.done = [&](int l) {
      if (block(l) && !kept(l, PipeOp::kBackward)) release_weights([l](int key) { return key == l; });
    };
  }
  // The loss is normalised by the scored weight of the whole step (every micro-batch, every DP rank),
  // known before the first backward so every gradient is scaled once. A loss of whole sequences knows
  // each row's whole loss on every context-parallel rank (Loss::sequences): one of them counts it.
  const bool counts_rows = g.cp_rank == 0 || !loss_->per_sequence();
  double weight = 0;
  if (counts_rows)
    for (const MicroBatch& b : batches) weight += loss_->weight(b);
  if (dense_->size() > 1) weight = dense_->all_reduce_sum(weight);
  if (!(weight > 0))
    fail(ExitCode::kData,
         "step {}: no position of the global batch is scored (every loss weight is 0 or "
         "every target ignored); check the data's loss masks",
         step);
  const float loss_scale = 1.0f / float(weight);
  {
    TraceSpan span("zero gradients", "compute");
    if (zero >= 2)
      backend_.release(model_->grads().data(), model_->grads().size());  // touched again layer by layer
    else
      model_->zero_grad();
  }
  sample_state();
  for (Bucket& bk : buckets_) {
    bk.request.reset();
    bk.replica_sum.reset();
    bk.settled = bk.reduced = false;
  }
  launched_.clear();
  replicas_started_ = 0;
  const bool each = spec_.parallel.reduce_each_microbatch;

  // Slot slot_base_[c] + i mod (chunk c's slots) holds micro-batch i on chunk c (each chunk takes its
  // micro-batches in order and finishes them in order; GPT numbers the slots chunk by chunk). A chunk sends
  // its output to the next virtual stage: the next stage's same chunk, or from the last stage the first
  // stage's next chunk; gradients go back the same way.
  const int chunks = chunks_, pp = g.layout.pp;
  const int next_stage = (stage + 1) % pp, prev_stage = (stage + pp - 1) % pp;
  const auto slot_of = [&](const PipeAction& a) {
    const size_t c = size_t(a.chunk);
    return slot_base_[c] + a.micro_batch % (slot_base_[c + 1] - slot_base_[c]);
  };
  const auto enters = [&](int c) { return first && c == 0; };          // the embedding's chunk
  const auto leaves = [&](int c) { return last && c == chunks - 1; };  // the head's
  // Messages into (activations) and out of (gradients) chunk c of micro-batch i, tagged by the receiving
  // and the sending chunk: unique within the step between two stages.
  const auto tag = [&](int i, int c, int dir) { return 2 * (i * chunks + c) + dir; };
  const int next_chunk_step = last ? 1 : 0;  // the next stage's chunk of chunk c is c + this
  const bool split = !waiting_.empty();      // ZB-H1: weight gradients in their own passes
  std::vector<comm::RequestPtr> sent_act(size_t(slot_base_.back())), sent_grad(size_t(slot_base_.back()));
  double loss_sum = 0;
  const auto forward = [&](const PipeAction& a) {
    const int i = a.micro_batch, slot = slot_of(a);
    chunk = a.chunk;
    if (sent_act[size_t(slot)]) sent_act[size_t(slot)]->wait();  // the slot's output is about to change
    if (!enters(chunk))
      g.pp->recv(recv_act_.data(), nc, comm::CommType::kF32, prev_stage, tag(i, chunk, 0))->wait();
    mark_activity("forward");
    TraceSpan span("forward micro-batch", "schedule", i);
    if (zero >= 2) acquire_gradients(-1);
    loss_sum +=
        model_->forward(slot, batches[size_t(i)], recv_act_.data(), loss_scale, true, forward_weights).loss;
    if (!leaves(chunk))
      sent_act[size_t(slot)] = g.pp->send(model_->output(slot).data(), nc, comm::CommType::kF32, next_stage,
                                          tag(i, chunk + next_chunk_step, 0));
  };
  const auto on_grads = [&](int layer) {
    if (layer < 0) return;  // the embeddings wait for the tied copy's sum (finish_gradients)
    // A key/value head's gradient is the sum of its holders' (the step's micro-batches are all in).
    if (const auto kv = kv_params_.find(layer); kv != kv_params_.end()) {
      mark_activity("all_reduce kv (shared key/value heads)");
      for (const ParamInfo* p : kv->second) kv_->all_reduce_sum(model_->grads().data() + p->offset, p->numel);
    }
    for (Bucket& bk : buckets_) {
      if (bk.key == layer) launch(bk);
      // MPI progresses non-blocking collectives inside MPI calls; ZeRO-2/3 let go of what is reduced.
      // Reducing each micro-batch, at most two layers' reductions stay in flight (backward runs the layers
      // downwards), so the gradients resident at once are those of a few layers, not the stage's.
      if (bk.request && zero >= 2 && ((each && bk.key > layer + 1) || reduced(bk))) settle(bk);
    }
  };
  const auto backward = [&](const PipeAction& a) {
    // The forwards completed ZeRO-1's gathers as they went; none may still run into the update.
    if (zero < 3) complete_gathers();
    const int i = a.micro_batch, slot = slot_of(a);
    chunk = a.chunk;
    if (!leaves(chunk))
      g.pp->recv(recv_grad_.data(), nc, comm::CommType::kF32, next_stage, tag(i, chunk + next_chunk_step, 1))
          ->wait();
    if (sent_grad[size_t(slot)]) sent_grad[size_t(slot)]->wait();
    mark_activity("backward");
    TraceSpan span("backward micro-batch", "schedule", i);
    // Each chunk's layers are complete with its last micro-batch's backward (ZB-H1: its W pass).
    const bool reduce = !split && (i == m - 1 || each);
    if (split) backend_.defer_weight_grads(&waiting_[size_t(i) % waiting_.size()]);
    model_->backward(slot, recv_grad_.data(), reduce ? std::function<void(int)>(on_grads) : nullptr,
                     backward_weights);
    backend_.defer_weight_grads(nullptr);
    if (each && i != m - 1) settle_microbatch();
    if (!enters(chunk))
      sent_grad[size_t(slot)] =
          g.pp->send(model_->input_grad(slot).data(), nc, comm::CommType::kF32, prev_stage, tag(i, chunk, 1));
  };
  const auto weight_pass = [&](int i) {
    mark_activity("weight gradients");
    TraceSpan span("weight gradients micro-batch", "schedule", i);
    {
      TraceSpan work("weight gradients", "compute", i);
      waiting_[size_t(i) % waiting_.size()].run();
    }
    if (i != m - 1) return;
    // The stage's layers, as backward finishes them: the final norm, the blocks downwards, the embeddings.
    if (last) on_grads(layers);
    for (int l = bounds_[size_t(stage) + 1] - 1; l >= bounds_[size_t(stage)]; --l) on_grads(l);
  };
  for (; action < schedule_.size(); ++action) {
    const PipeAction& a = schedule_[action];
    if (a.op == PipeOp::kForward)
      forward(a);
    else if (a.op == PipeOp::kBackward)
      backward(a);
    else
      weight_pass(a.micro_batch);
  }
  sample_state();
  if (zero == 3) release_weights([&](int key) { return !block(key); });
  for (auto* sent : {&sent_act, &sent_grad})
    for (auto& r : *sent)
      if (r) r->wait();
  finish_gradients();

  // The loss sum (the last stage's, once per data-parallel rank), the squared norm and the loss's own
  // figures (same rule as the loss) in one reduction.
  std::vector<std::pair<std::string, double>> figures = loss_->take_metrics();
  const bool counts = last && g.tp_rank == 0 && counts_rows;
  std::vector<double> sums = {counts ? loss_sum : 0.0, 0.0};
  for (const auto& f : figures) sums.push_back(counts ? f.second : 0.0);
  // Every MoE block's router figures, from the stage holding it (tensor-parallel rank 0).
  const size_t router_at = sums.size();
  std::vector<RouterStats> routers = router_layout(spec_.model);
  const size_t per_router = size_t(spec_.model.experts) + 7;
  sums.resize(router_at + routers.size() * per_router, 0.0);
  for (const RouterStats& mine : model_->take_router_stats()) {
    if (g.tp_rank != 0) continue;
    size_t i = 0;
    while (routers[i].layer != mine.layer) ++i;
    double* out = sums.data() + router_at + i * per_router;
    std::copy(mine.tokens.begin(), mine.tokens.end(), out);
    const double rest[] = {mine.assignments, mine.dropped,     mine.entropy,      mine.aux,
                           mine.z,           mine.token_count, mine.micro_batches};
    std::copy(std::begin(rest), std::end(rest), out + spec_.model.experts);
  }
  {
    TraceSpan span("gradient norm", "compute");
    sums[1] = backend_.sum_squares(model_->grads().data(), norm_ranges_);
  }
  mark_activity("all_reduce world (loss, norm)");
  g.world->all_reduce(sums.data(), sums.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  for (size_t i = 0; i < figures.size(); ++i) figures[i].second = sums[2 + i] / weight;
  // Its figures that are maxima: the largest over the ranks (an empty list on every rank costs nothing).
  std::vector<std::pair<std::string, double>> maxima = loss_->take_maxima();
  if (!maxima.empty()) {
    std::vector<double> most;
    for (const auto& f : maxima) most.push_back(counts ? f.second : 0.0);
    g.world->all_reduce(most.data(), most.size(), comm::CommType::kF64, comm::ReduceOp::kMax)->wait();
    for (size_t i = 0; i < maxima.size(); ++i) figures.emplace_back(maxima[i].first, most[i]);
  }
  for (size_t i = 0; i < routers.size(); ++i) {
    const double* in = sums.data() + router_at + i * per_router;
    RouterStats& r = routers[i];
    r.tokens.assign(in, in + spec_.model.experts);
    const double* rest = in + spec_.model.experts;
    r.assignments = rest[0];
    r.dropped = rest[1];
    r.entropy = rest[2];
    r.aux = rest[3];
    r.z = rest[4];
    r.token_count = rest[5];
    r.micro_batches = rest[6];
  }
  // Reported at FP32, the precision the model computes in (and what earlier releases printed).
  double loss = double(float(sums[0] / weight));
  if (inject_nan_) {
    inject_nan_ = false;
    loss = std::numeric_limits<double>::quiet_NaN();
  }
  // A non-finite loss makes the step's gradients meaningless, norm included.
  const double norm = std::isfinite(loss) ? std::sqrt(sums[1]) : std::numeric_limits<double>::quiet_NaN();
  const double lr = learning_rate(spec_.optim, step - 1, spec_.steps);
  const bool finite = std::isfinite(loss) && std::isfinite(norm);
  mark_activity("optimizer");
  if (finite) {
    TraceSpan span("optimizer", "compute");
    const double clip = spec_.optim.grad_clip;
    if (clip > 0 && clip / (norm + 1e-6) < 1.0)
      backend_.scale(model_->grads().data(), float(clip / (norm + 1e-6)), optimizer_->ranges());
    optimizer_->step(model_->weights(), model_->grads(), lr);
    if (zero == 3) {
      // Each rank updated its part (its working copy refreshed here); the next pass gathers the layers it
      // reads.
      for (const FlatRange& r : owned_) model_->weights_changed(r);
    } else if (zero >= 1 && dense_->size() > 1) {
      launch_gathers();  // completed by the next forward (need_weights) or whoever asks for model()
    } else {
      model_->weights_changed();
    }
  } else {
    // The update is dropped, the step is not: step numbers, the schedule and the data stay functions
    // of the step whatever the guard decides.
    optimizer_->restore_steps(step);
  }
  const double device_seconds = backend_.step_seconds();  // waits for the device's queued work
  const CommTotals comm1 = totals(all), pipe1 = totals(pipe), experts1 = totals(experts),
                   ring1 = totals(ring);
  StepStats st;
  st.step = step;
  st.loss = loss;
  st.grad_norm = norm;
  st.lr = lr;
  st.seconds = device_seconds >= 0
                   ? device_seconds
                   : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.tokens = int64_t(m) * dpn * spec_.batch * T;
  st.scored = weight;
  st.objective = std::move(figures);
  st.finite = finite;
  st.comm_s = comm1.wait - comm0.wait;
  st.bubble_s = pipe1.wait - pipe0.wait;
  st.comm_bytes = (comm1.bytes - comm0.bytes) + (pipe1.bytes - pipe0.bytes);
  st.moe = std::move(routers);
  st.expert_comm_s = experts1.wait - experts0.wait;
  st.expert_comm_bytes = experts1.bytes - experts0.bytes;
  st.cp_comm_s = ring1.wait - ring0.wait;
  st.cp_comm_bytes = ring1.bytes - ring0.bytes;
  sample_state();
  st.state_bytes = peak_state_;
  st.bubble_analytic = analytic_bubble_;
  st.gather_s = gather_s_;
  st.gather_bytes = gather_bytes_;
  return st;
}

std::vector<MicroBatch> ParallelTrainer::context_shards(std::span<const MicroBatch> batches) const {
  std::vector<MicroBatch> out;
  if (groups_.layout.cp > 1)
    for (const MicroBatch& b : batches) out.push_back(context_shard(b, groups_.layout.cp, groups_.cp_rank));
  return out;
}

double ParallelTrainer::loss_of(const MicroBatch& whole) {
  const LossSums sums = forward_loss(whole, *loss_);
  // Every rank knows its batch's weight; the loss sum is the last stage's (once per DP rank, and per row
  // for a loss of whole sequences).
  comm::ProcessGroups& g = groups_;
  const bool counts = g.tp_rank == 0 && (g.cp_rank == 0 || !loss_->per_sequence());
  double both[2] = {g.last_stage() && counts ? sums.loss : 0.0,
                    g.first_stage() && counts ? sums.weight : 0.0};
  g.world->all_reduce(both, 2, comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  return both[0] / both[1];
}

LossSums ParallelTrainer::forward_loss(const MicroBatch& whole, const Loss& loss) {
  // ZeRO-3 gathers the layers as the forward reaches them and lets them go after, as a step does.
  WeightHooks weights;
  int chunk = 0;
  if (spec_.parallel.zero == 3) {
    weights.need = [&](int l) { gather_layer(l, l < 0 ? first_block(chunk) : l + 1); };
    weights.done = [&](int l) { release_weights([l](int key) { return key == l; }); };
  } else {
    complete_gathers();
  }
  GPT::check_batch(whole, spec_.batch, spec_.model);
  const std::vector<MicroBatch> shard = context_shards({&whole, 1});
  const MicroBatch& mine = shard.empty() ? whole : shard[0];
  comm::ProcessGroups& g = groups_;
  const size_t nc = size_t(model_->stream_rows()) * size_t(spec_.model.d_model);
  const int pp = g.layout.pp;
  // Round the virtual stages: chunk c of every stage, then chunk c + 1 (the last stage's output goes to the
  // first stage's next chunk); tagged by the receiving chunk.
  LossSums sums;
  for (chunk = 0; chunk < chunks_; ++chunk) {
    const int slot = slot_base_[size_t(chunk)];
    if (!g.first_stage() || chunk > 0)
      g.pp->recv(recv_act_.data(), nc, comm::CommType::kF32, (g.pp_rank + pp - 1) % pp, chunk)->wait();
    sums = model_->forward(slot, mine, recv_act_.data(), 1.0f, false, weights, &loss);
    if (!g.last_stage() || chunk + 1 < chunks_)
      g.pp->send(model_->output(slot).data(), nc, comm::CommType::kF32, (g.pp_rank + 1) % pp,
                 chunk + (g.last_stage() ? 1 : 0))
          ->wait();
  }
  sums.weight = loss.weight(mine);  // a stage without the head returns none
  return sums;
}

size_t ParallelTrainer::parameter_bytes() const {
  return 2 * model_->weights().size() * sizeof(float);
}

size_t ParallelTrainer::optimizer_bytes() const {
  size_t n = 0;
  for (const FlatRange& r : optimizer_->ranges()) n += r.hi - r.lo;
  return 2 * n * sizeof(float);
}

size_t ParallelTrainer::activation_bytes() const {
  size_t queued = 0;
  for (const WeightGradQueue& q : waiting_) queued += q.bytes();
  return model_->activation_bytes() + plan_->scratch_bytes() + queued;
}

std::string ParallelTrainer::describe_plan() {
  constexpr size_t kRecord = 160;
  const ModelSlice& s = model_->slice();
  const double mib = 1.0 / (1024.0 * 1024.0);
  std::string mine =
      fmt::format("{:>4} {:<12} {:>2} {:>2} {:>2}  {:>2}-{:<2} {:>10} {:>9.1f} {:>9.1f} {:>9.1f}",
                  groups_.rank, node_name().substr(0, 12), groups_.tp_rank, groups_.dp_rank, groups_.pp_rank,
                  s.first_layer, s.last_layer - 1, model_->weights().size(), parameter_bytes() * mib,
                  optimizer_bytes() * mib, activation_bytes() * mib);
  mine.resize(kRecord, ' ');
  std::string all(kRecord * size_t(groups_.world->size()), ' ');
  groups_.world->all_gather(mine.data(), all.data(), kRecord, comm::CommType::kU8)->wait();
  if (groups_.rank != 0) return {};
  std::string out =
      fmt::format("plan: layout {} on {} ranks; rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))\n",
                  groups_.layout.str(), groups_.world->size());
  const size_t pp = size_t(groups_.layout.pp);
  for (size_t st = 0; st < pp; ++st) {
    std::string blocks;
    for (size_t k = st; k + 1 < bounds_.size(); k += pp)
      blocks += fmt::format("{}{}-{}", blocks.empty() ? "" : ", ", bounds_[k], bounds_[k + 1] - 1);
    out += fmt::format("  stage {}: blocks {}{}{}\n", st, blocks, st == 0 ? " + embeddings" : "",
                       st + 1 == pp ? " + final LayerNorm, classifier" : "");
  }
  const ParameterCounts params = parameter_counts(spec_.model);
  out += fmt::format(
      "  parameters: {:.2f} M{}\n", params.total / 1e6,
      spec_.model.ffn == Ffn::kMoe
          ? fmt::format(", {:.2f} M active per token ({} experts, top {}, ep{})", params.active / 1e6,
                        spec_.model.experts, spec_.model.top_k, groups_.layout.ep)
          : std::string());
  const int zero = spec_.parallel.zero;
  const std::string across =
      dense_nodes_.shard
          ? fmt::format("the {} data-parallel ranks of each node, copied on {} node{}",
                        dense_nodes_.shard->size(), dense_nodes_.nodes, dense_nodes_.nodes == 1 ? "" : "s")
          : std::string("dp");
  out += fmt::format("  ZeRO-{}: {}{}; micro-batches {} of {} sequences per data-parallel rank\n", zero,
                     zero == 0   ? "replicated"
                     : zero == 1 ? "optimizer state sharded across "
                     : zero == 2 ? "optimizer state and gradients sharded across "
                                 : "optimizer state, gradients and weights sharded across ",
                     zero == 0 ? std::string() : across, spec_.microbatches, spec_.batch);
  out += "  rank node         tp dp pp  blocks     params  w+g MiB   opt MiB   act MiB\n";
  for (int r = 0; r < groups_.world->size(); ++r) {
    std::string rec = all.substr(size_t(r) * kRecord, kRecord);
    rec.erase(rec.find_last_not_of(' ') + 1);
    out += "  " + rec + "\n";
  }
  return out;
}

}  // namespace forge::trainer
