// The job-spec keys the trainer reads ([run] [model] [data] [optim] [precision] [parallel] [guard]) and their
// validation. The launcher adds its own sections to the same schema before loading the spec.
#pragma once

#include "forge/common/config.h"
#include "forge/trainer/guard.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/model.h"
#include "forge/trainer/objective.h"
#include "forge/trainer/schedule.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

struct OptimConfig {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global L2 norm; 0 disables clipping
};

// How the layout's ranks work, beyond the layout itself.
// Where a rank computes (run.device) and what its process groups move memory with (parallel.comm).
// kAuto until resolve_device decides.
enum class Device { kAuto, kCpu, kCuda };
enum class CommKind { kAuto, kNccl, kMpi };

// How context parallelism gives each rank's queries the whole sequence's keys (context_attention.h).
enum class ContextComm { kRing, kAllToAll };

struct ParallelConfig {
  CommKind comm = CommKind::kAuto;  // nccl on cuda; mpi on cpu, and host-staged mpi on cuda
  ContextComm cp_comm = ContextComm::kRing;
  bool sequence_parallel = false;  // the residual stream cut over tp (tensor_parallel.h)
  // ZeRO stage: 0; 1 the optimizer state sharded across dp; 2 the gradients too (a rank keeps its part);
  // 3 the weights too (gathered layer by layer where a pass reads them, the next one's prefetched).
  int zero = 0;
  // parallel.zero_group = node (hybrid sharding): the stage shards over the data-parallel ranks of each
  // node and replicates across nodes, the shards' gradients summed by an all-reduce across nodes, so no
  // gather or reduce-scatter spans the nodes. Off (dp): over every data-parallel rank.
  bool shard_within_node = false;
  bool prefetch = true;  // parallel.prefetch: ZeRO-3 starts the next layer's gather before it is needed
  // parallel.reduce_each_microbatch: ZeRO-2/3 reduce-scatter every micro-batch's gradients as its backward
  // produces them and keep only the rank's summed part, instead of accumulating the whole gradients until
  // the step's last micro-batch (less memory, one reduce-scatter per micro-batch).
  bool reduce_each_microbatch = false;
  std::vector<int> stage_layers;  // blocks per pipeline stage; empty: balanced
  // parallel.pp_schedule (schedule.h) and, for interleaved, parallel.pp_virtual: the model chunks of a
  // stage (stage s holds virtual stages s, s + pp, ...; model.layers splits into pp x pp_virtual equal ones).
  PipeScheduleKind pp_schedule = PipeScheduleKind::k1F1B;
  int pp_virtual = 1;
  bool elastic = false;  // parallel.elastic: dp follows the ranks started (elastic_spec)
};

// The steps a run traces (run.trace_steps; trace.h): 1-based, inclusive.
struct TraceSteps {
  int64_t first = 0, last = 0;  // first == 0: none
  bool after_start = false;     // "auto": the 3 steps after this process's first (warm caches, resumes)
  // This process's window when it trains steps (done, steps]; first == 0 when it traces nothing.
  TraceSteps window(int64_t done, int64_t steps) const;
};

// run.objective = dpo: the loss's settings and the reference model (its checkpoint directory).
struct DpoConfig {
  double beta = 0.1;
  double label_smoothing = 0.0;
  std::string reference;  // dpo.reference; empty: ckpt.init_from (forge-train resolves it)
  bool live = false;      // dpo.reference_mode = live: a frozen copy computes them every step
};

// run.objective = distill: the teacher's checkpoint and the loss's settings (DistillLoss, loss.h).
struct DistillConfig {
  std::string teacher;
  double alpha = 0.5;
  double temperature = 1.0;
};

// run.objective = grpo (docs/TRAINER.md, "Objectives"): the rollouts each step samples from the policy, the
// rewards that score them (RewardConfig) and the loss's settings (GrpoLoss, loss.h).
// The scorers a reward may weigh (reward.weights), in their order in metrics.
inline constexpr std::string_view kRewardScorers[] = {"exact_match", "code", "format", "length"};
struct RewardConfig {
  // reward.weights: each scorer's weight in a reply's reward (rewards.h, eval_gate).
  std::map<std::string, double> weights{{"exact_match", 1.0}};
  std::string answer = "last_number";  // reward.answer: what of a reply exact_match compares
};
struct RlConfig {
  int group_size = 8;  // replies sampled per prompt; their rewards' mean is each one's baseline
  bool scale_rewards = true;
  GrpoOptions loss;
  PpoOptions ppo;         // run.objective = ppo: the value head's settings (rl.gamma, lambda, value_*)
  std::string reference;  // rl.reference: the KL's frozen model (empty: ckpt.init_from)
  // Optimizer steps per rollout: a rollout samples this many steps' worth of replies at its first step,
  // under the weights of that moment, and each step trains the next mini-batch of them.
  int updates_per_rollout = 1;
  // A rollout starts at step `step` (0-based), and a checkpoint or a stop after `step` steps falls between
  // rollouts: a checkpoint holds no rollout.
  bool between_rollouts(int64_t step) const { return step % updates_per_rollout == 0; }
  int max_new_tokens = 64;
  double temperature = 1.0, top_p = 1.0;
  // rl.format_dataset: a prepared dataset whose tokenizer and chat format the policy speaks (its SFT data);
  // empty: the policy checkpoint's own files (an imported model).
  std::string format_dataset;
  int sandbox_parallel = 0;  // code rewards run at once (0: run.threads)
  // rl.overlap_rewards: each reply scored as its sampling ends (gate::RewardStream), not after the rollout.
  bool overlap_rewards = true;
  RewardConfig reward;
};

// Everything one training process needs, validated.
// train.freeze: the parts of a model whose weights a run leaves as they are (no gradient step, no
// optimizer state): a vision-language model's encoder (vision.*), its projector (projector.*), or the
// language model (every other parameter). LLaVA's stages: vision,lm (align the projector), then vision.
struct Freeze {
  bool vision = false, projector = false, lm = false;
  bool any() const { return vision || projector || lm; }
  bool frozen(std::string_view param) const;
  // frozen() as ModelSetup::frozen takes it: null when nothing is.
  std::function<bool(std::string_view)> predicate() const;
};

struct TrainSpec {
  std::string name, dir, dataset;
  std::string data_order = "block";  // the reader's sample order: "block" or "global"
  int64_t steps = 0;
  uint64_t seed = 0;
  int threads = 0;             // resolved: > 0
  double peak_gflops = 0;      // 0: measure at start
  Recompute recompute;         // model.recompute, model.recompute_every (ModelSetup)
  double memory_cap_gib = 0;   // run.memory_per_rank_gib: the plan must fit it (launcher/plan.h); 0: none
  TraceSteps trace;            // run.trace_steps
  int batch = 0;               // sequences per micro-batch and data-parallel rank
  int microbatches = 1;        // micro-batches accumulated per optimizer step
  bool document_mask = false;  // packed documents: attention and positions stop at document boundaries
  // data.domain_weights: each domain's share of the samples (the reader normalises them); empty: the
  // dataset's natural proportions.
  std::map<std::string, double> domain_weights;
  // data.cache_dir and data.cache_max_bytes: the node-local shard cache (docs/DATA.md); empty: none.
  std::string cache_dir;
  uint64_t cache_max_bytes = 0;
  Objective objective = Objective::kLm;
  DpoConfig dpo;
  DistillConfig distill;
  RlConfig rl;
  ModelSpec model;
  OptimConfig optim;
  Device device = Device::kAuto;
  DType dtype = DType::kF32;
  bool dtype_auto = false;  // precision.dtype = auto: bf16 on cuda, fp32 on cpu (resolve_device)
  Layout layout;
  ParallelConfig parallel;
  GuardConfig guard;
  Freeze freeze;
};

// Registers the trainer's keys (with defaults and help) in `schema`.
void add_trainer_keys(ConfigSchema& schema);

// Validated views of a loaded spec. Each rule violation throws a usage error (exit 64) through
// Config::reject, naming the key, where it was set and the rule; nothing is allocated before.
ModelSpec model_spec(const Config& config);
// The model of [model] keys given as overrides ("--model.layers=2", ...), every other key at its default:
// the same reader, for checkpoint records (checkpoint_io.h), tools and tests. Throws forge::Error(kUsage).
ModelSpec model_spec(const std::vector<std::string>& overrides);
// A GPT-2 model of these dimensions (max_positions 0: seq_len).
ModelSpec gpt2_spec(int layers, int d_model, int heads, int vocab, int seq_len, int max_positions = 0);
OptimConfig optim_config(const Config& config);
TrainSpec train_spec(const Config& config);
// The loss of the spec's objective (the LM cross-entropy for lm and sft, DpoLoss for dpo, DistillLoss with
// `teacher` for distill: the launcher loads it on the ranks that hold the classifier).
std::shared_ptr<const Loss> objective_loss(const TrainSpec& spec, std::shared_ptr<GPT> teacher = nullptr);

// The first rule the layout and its options break for this model and `microbatches` a step, as the key to
// change and why: the layout's own rules (forge::layout_problem), stage_layers consistent with pp and the
// layers, the ZeRO stage, the pipeline schedule's limits. nullopt: it can run. train_spec applies it; the
// runtime assumes a spec that passed.
std::optional<LayoutProblem> parallel_problem(const ModelSpec& model, const Layout& layout,
                                              const ParallelConfig& parallel, int microbatches);

// parallel.elastic: what `ranks` started ranks train. tp, cp and pp stay; dp is the largest that the ranks
// hold, at most the spec's, and that divides the spec's global batch (parallel.dp x parallel.microbatches
// micro-batches of data.batch); micro-batches rise to keep that batch, so the samples of every step and
// the loss curve stay those of the full size. Ranks beyond the new layout's world stay idle. A usage
// error when not one replica fits.
TrainSpec elastic_spec(const TrainSpec& spec, int ranks);

// Decides run.device, parallel.comm and an automatic precision.dtype for a process that sees
// `visible_gpus` GPUs it can train on (0: `no_gpu` says why: no device, no driver, a build without CUDA):
// auto is cuda when there is one, else cpu; comm auto is nccl on cuda, mpi on cpu; dtype auto is bf16 on
// cuda, fp32 on cpu. Usage errors (64) name the key: cuda without a GPU, nccl on cpu.
void resolve_device(TrainSpec& spec, int visible_gpus, const std::string& no_gpu);
std::string_view device_name(Device device);
std::string_view dtype_name(DType dtype);  // "fp32", "bf16"
std::string_view comm_name(CommKind comm);

// Worker threads: `requested` > 0 as is; 0 means SLURM_CPUS_PER_TASK when set, else in a Slurm step the
// node's allocated CPUs (SLURM_CPUS_ON_NODE) over the step's tasks on the node, else all cores.
int resolve_threads(int requested);

}  // namespace forge::trainer
