// forge-train --plan: what a spec asks of every rank, computed from the spec alone, before (and without)
// allocating anything, so the shapes of Llama-3.1-8B or Qwen3-30B-A3B plan on a laptop. The layout is the
// spec's [parallel] keys (--parallel.tp=8 ...); the spec is validated exactly as a run validates it.
//
// Per pipeline stage (every rank of a stage holds an equal share: tensor, data and expert parallelism split
// evenly): the parameters it holds, and its memory, buffer by buffer, from the same sizes the trainer
// allocates with: FP32 master weights and gradients (the parameter table, padded as ParallelTrainer pads
// it), AdamW's two moments (sharded over dp by ZeRO-1), the BF16 working copy, the activations of the
// micro-batches the stage holds in flight (what GPT's constructor allocates: activation_bytes below), and
// the trainer's other buffers (the gradient shard of the reduce-scatter, the pipeline's receive buffers,
// the classifier's logits chunk). Plus the whole model's parameters (total and active per token) and its
// FLOPs per token with the attention's share.
#pragma once

#include "forge/common/config.h"
#include "forge/common/json.h"
#include "forge/trainer/model.h"
#include "forge/trainer/schedule.h"
#include "forge/trainer/spec.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace forge::launcher {

// The bytes GPT's constructor allocates for activations and scratch (what GPT::activation_bytes() reports
// right after construction) for `slice` of `model`, micro-batches of `batch` sequences, `slots` of them in
// flight on each model chunk (ModelSetup::slots), storing activations as `dtype` says, with `recompute`
// (model.h), the residual stream cut into `sequence_shards` (sequence parallelism). Mirrors
// trainer/src/model.cpp, attention.cpp and moe.cpp
// (MoE buffers sized for balanced routing, as the layer sizes them at first); test/launcher/plan_test.cpp
// holds it to real models.
size_t activation_bytes(const trainer::ModelSpec& model, const trainer::ModelSlice& slice, int batch,
                        trainer::DType dtype, const std::vector<int>& slots,
                        const trainer::Recompute& recompute = {}, int sequence_shards = 1);

// ZB-H1's queue of one micro-batch's weight gradients on `slice` (WeightGradQueue, backend.h): what the
// W pass reads of each product. Dense and MoE blocks (experts dropless); a vision tower's not counted.
size_t weight_grad_bytes(const trainer::ModelSpec& model, const trainer::ModelSlice& slice, int batch,
                         trainer::DType dtype);

// One pipeline stage's ranks: each holds this.
struct StagePlan {
  int stage = 0;
  int first_layer = 0, last_layer = 0;  // blocks [first_layer, last_layer) (+ c x chunk_stride, c < chunks)
  int chunks = 1, chunk_stride = 0;     // model chunks (interleaved)
  bool embedding = false, head = false;
  int slots = 1;                 // micro-batches in flight (1F1B: min(microbatches, pp - stage)), all chunks'
  std::vector<int> chunk_slots;  // of each model chunk (ModelSetup::slots)
  int waiting = 0;               // ZB-H1: micro-batches waiting for their weight-gradient pass, at most
  int ranks = 1;                 // ranks of the stage (tp x cp x dp), all alike
  size_t parameters = 0;         // elements of the flat buffers, padding included (the run's "params")
  double held = 0;               // parameter values the rank holds (its shard of the logical tensors)
  size_t weights = 0;            // bytes: FP32 master weights
  size_t gradients = 0;          // FP32 gradients
  size_t optimizer = 0;          // AdamW m and v (FP32; its ZeRO-1 shard)
  size_t bf16_copy = 0;          // precision.dtype = bf16: the working copy (BF16 values in FP32 slots)
  size_t activations = 0;        // activation_bytes()
  size_t weight_grads = 0;       // ZB-H1: waiting x weight_grad_bytes()
  size_t grad_shard = 0;         // the reduce-scatter's output (ParallelTrainer's shard_)
  size_t pipeline = 0;           // receive buffers of the neighbouring stages' activations / gradients
  size_t logits_chunk = 0;       // the classifier's chunk of logits (allocated at the first forward)
  size_t buffers() const { return grad_shard + pipeline + logits_chunk; }
  size_t total() const {
    return weights + gradients + optimizer + bf16_copy + activations + weight_grads + buffers();
  }
};

// The pipeline's schedule (schedule.h): every stage's actions in a step and the bubble they imply with
// equal stages and a backward costing twice a forward.
struct PipelinePlan {
  std::string schedule = "1f1b";  // parallel.pp_schedule
  int chunks = 1;                 // model chunks a stage (parallel.pp_virtual under interleaved)
  std::vector<trainer::StageSchedule> stages;
  double bubble = 0;
  // The bubble the other schedules (schedule.h) would leave at this layout: interleaved with 2 chunks a
  // stage where the blocks split into 2 x pp equal ones and the micro-batches are a multiple of the
  // stages; the rest always.
  struct Alternative {
    std::string schedule;
    int chunks = 1;  // model chunks a stage
    double bubble = 0;
  };
  std::vector<Alternative> alternatives;
};

struct Plan {
  trainer::TrainSpec spec;      // device and dtype resolved for the planned device
  double total_parameters = 0;  // the logical model (position embeddings excluded: parameter_counts)
  double active_parameters = 0;
  double flops_per_token = 0;  // trainer::flops_per_token
  double attention_flops = 0;  // its attention part: 12 x layers x keys x heads x head_dim
  std::vector<StagePlan> stages;
  PipelinePlan pipeline;
  int zero_nodes = 1;  // parallel.zero_group = node: the nodes a data-parallel group spans (1 otherwise)
};

// The plan of a validated spec (train_spec). run.device = auto plans for CUDA (the cluster's nodes; an
// automatic precision.dtype then plans BF16); --run.device=cpu plans a CPU run.
// Under parallel.zero_group = node the shards are those of a data-parallel group spread over `zero_nodes`
// nodes (data_parallel_nodes).
Plan make_plan(const trainer::TrainSpec& spec, int zero_nodes = 1);
// The nodes the first data-parallel group (dp x cp ranks; all span as many) lies on, given each rank's
// node name.
int data_parallel_nodes(const Layout& layout, const std::vector<std::string>& hosts);

// run.memory_per_rank_gib > 0 and the plan's largest rank needs more: forge::Error(kUsage) naming the
// need, its largest part, and the layouts one key away (cp, tp or pp doubled up to 8x, ZeRO-1) whose plans
// fit. Called before anything is allocated.
void check_memory_cap(const Plan& plan);

std::string format_plan(const Plan& plan);      // human-readable lines
std::string format_schedule(const Plan& plan);  // every stage's actions, one line each
Json plan_json(const Plan& plan);               // the same numbers, one document

// forge-train SPEC --plan [--schedule] [--json]: validates `config` as a run does (exit 64 on a bad spec or
// layout, the run's message) and prints the plan (with `schedule`, every stage's actions), then its JSON
// on one line; or only the JSON line. Returns 0.
int plan_command(const Config& config, bool json_only, bool schedule = false);

}  // namespace forge::launcher
