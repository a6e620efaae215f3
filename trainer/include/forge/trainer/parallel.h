// The training step, on every layout: one process's slice of the model (its pipeline stage's layers, its
// tensor-parallel shard), the pipeline schedule over micro-batches (schedule.h), data-parallel gradient
// reduction in buckets launched as backward finishes each layer, ZeRO-1 (optimizer state sharded across
// the data-parallel group: reduce-scatter gradients, update the local shard, all-gather parameters, each
// bucket's gather completed where the next forward first needs its layer), clipping, the schedule and AdamW.
// At layout 1,1,1 (self_comm, groups.h) it is the one-process trainer. The same spec gives the same losses on
// every layout, up to floating-point summation order.
#pragma once

#include "forge/comm/groups.h"
#include "forge/common/batch.h"
#include "forge/trainer/model.h"
#include "forge/trainer/optimizer.h"
#include "forge/trainer/schedule.h"
#include "forge/trainer/spec.h"
#include "forge/trainer/step_stats.h"
#include "forge/trainer/tensor_parallel.h"

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace forge::trainer {

// Layer boundaries of `pp` pipeline stages: stage s holds blocks [bounds[s], bounds[s+1]). `counts`
// (blocks per stage, as validated by parallel_problem) overrides; empty: balanced by forward FLOPs, the
// classifier counted on the last stage.
std::vector<int> stage_bounds(const ModelSpec& config, int pp, const std::vector<int>& counts = {});
// The pipeline's virtual stages under `parallel` (pp_schedule, pp_virtual, stage_layers): model chunks
// a stage (interleaved's pp_virtual, else 1), and the blocks [bounds[k], bounds[k + 1]) of virtual stage
// k = c x pp + s, stage s's chunk c (Megatron's placement: a micro-batch goes round the stages once per
// chunk). Interleaved chunks are equal; one chunk a stage: stage_bounds.
int pipeline_chunks(const ParallelConfig& parallel);
std::vector<int> virtual_stage_bounds(const ModelSpec& config, int pp, const ParallelConfig& parallel);
// Stage `stage`'s blocks, embedding and head of those virtual stages (tensor and expert shares left whole).
ModelSlice stage_slice(const std::vector<int>& bounds, int pp, int stage, int chunks);

// The gradient bucket a parameter belongs to (reduced as backward finishes it): its block, -1 for the
// embeddings (and an untied head), `layers` for the final norm.
int gradient_bucket(const std::string& param, int layers);

// A stretch of the flat buffers whose gradients are reduced at once: a layer's (gradient_bucket), an MoE
// block's experts (reduced over expert_dp), a part of a vision-language model (model_part: what
// train.freeze may leave out on its own).
struct GradientBucket {
  size_t lo, hi;
  int key;             // gradient_bucket
  bool experts;        // reduced over expert_dp instead of dp
  bool trains = true;  // holds a parameter train.freeze leaves in (else its gradients are never formed)
};
// The buckets of a parameter table whose flat buffers are `flat` long. Each starts where its first
// parameter does, rounded up to a multiple of `align` (so it splits evenly over its group): rounding only
// moves elements into the bucket of a layer whose backward comes later, so a bucket is complete when its
// layer's backward is.
std::vector<GradientBucket> gradient_buckets(const std::vector<ParamInfo>& params, int layers, size_t align,
                                             size_t flat, const Freeze& freeze);

// `ranges` of a model's flat buffers without the parameters train.freeze leaves out of the update: what
// the optimizer keeps state for and writes. Nothing left: the one empty range.
std::vector<FlatRange> trained_ranges(const std::vector<FlatRange>& ranges,
                                      const std::vector<ParamInfo>& params, const Freeze& freeze);

class ParallelTrainer {
 public:
  // Builds this rank's slice on `backend`, initialized from spec.seed exactly as the whole model would
  // be. The spec has passed train_spec's validation; the groups are spec.layout's. run.objective =
  // distill: `teacher` is the frozen teacher on a rank of the last stage (objective_loss).
  ParallelTrainer(const TrainSpec& spec, comm::ProcessGroups& groups, Backend& backend = cpu_backend(),
                  std::shared_ptr<GPT> teacher = nullptr);
  ~ParallelTrainer();

  // The model, its parameters complete (ZeRO-1's gathers of the last update finished; ZeRO-3's weights
  // all gathered, until the next step releases them).
  GPT& model();
  // The model as this rank holds it, nothing gathered: under ZeRO-3 only the optimizer's ranges of the
  // weights are current (what a checkpoint writes with SaveRole::owned_params).
  GPT& held_model() { return *model_; }
  // The model to load a checkpoint into (load_checkpoint with owned_ranges() under ZeRO-3): under ZeRO-3
  // what this rank does not own of the weights is released first (a pass gathers it), so a resume reads
  // and holds the rank's part only; elsewhere model().
  GPT& model_to_load();
  AdamW& optimizer() { return *optimizer_; }
  // This rank's part of the flat buffers: what it reduces gradients into, updates (less what train.freeze
  // leaves out: optimizer().ranges()) and, under ZeRO-3, holds of the weights.
  const std::vector<FlatRange>& owned_ranges() const { return owned_; }
  comm::ProcessGroups& groups() { return groups_; }
  // Which copy of its shard this rank holds: 0, or under hybrid sharding its node's place among the nodes
  // (of the dense weights' ranks, or with `experts` of an MoE block's experts'). Copy 0 is what a
  // checkpoint writes.
  int shard_copy(bool experts) const;
  int64_t steps_taken() const { return optimizer_->steps_taken(); }
  // The virtual stages' blocks: stage s's chunk c holds [bounds()[k], bounds()[k + 1]) for k = c x pp + s
  // (one chunk a stage but under parallel.pp_schedule = interleaved).
  const std::vector<int>& bounds() const { return bounds_; }

  // One optimizer step (collective over the world) on this rank's micro-batches: spec.microbatches of
  // them, each spec.batch rows of this data-parallel rank's data. The loss is normalised by the scored
  // weight of the whole step over every data-parallel rank (loss.h) and is identical on every rank; a
  // non-finite loss or norm drops the update on every rank (finite = false). A batch that does not fit
  // the model, or a step with nothing scored, is forge::Error(kData).
  StepStats step(std::span<const MicroBatch> micro_batches);
  // The loss of one micro-batch of the step (this rank's part), forward only, through the pipeline
  // (collective; the same value on every rank). Checkpoint resumes verify with it.
  double loss_of(const MicroBatch& mine);
  // The same forward under `loss` (another than the run's: a rollout's log-probabilities at sampling time,
  // TokenLogps, whose figures are then the last stage's): this stage's loss sums (the head's stage's) and
  // the batch's weight; collective over the pipeline.
  LossSums forward_loss(const MicroBatch& mine, const Loss& loss);
  // Testing hook (guard.inject_nan_step): the next step's loss is NaN on every rank.
  void inject_nan_once() { inject_nan_ = true; }

  // The plan: ranks per group and node, layers per stage, parameters and memory per rank. Collective;
  // the text on rank 0, empty elsewhere.
  std::string describe_plan();

  // Bytes per rank: parameters (+ gradients) and optimizer state (ZeRO-1: about 1/dp of unsharded).
  size_t parameter_bytes() const;
  size_t optimizer_bytes() const;
  // Activations and scratch: the model's, the ring attention's buffers under context parallelism, and
  // ZB-H1's weight-gradient queues (as big as a step has made them).
  size_t activation_bytes() const;

 private:
  // ZeRO-3: what a rank has of a bucket's weights beyond its own part. A pass reads only the BF16 working
  // copy in BF16 mode, so its gathers bring that (2 bytes a weight; kWorking); the FP32 weights
  // (kWhole) are gathered for model() only, in FP32 for every pass.
  enum class Held { kPart, kWorking, kWhole };
  struct Bucket {
    size_t lo, hi;      // flat range, a multiple of dp long
    int key;            // layer index; -1: embeddings (reduced after the schedule); layers: final LayerNorm
    comm::Comm* group;  // dp; an MoE block's experts: expert_dp. Hybrid sharding: their ranks on this node
    size_t shard_at;    // where this rank's part sits in shard_
    comm::RequestPtr request;
    // Hybrid sharding (parallel.zero_group = node): the ranks holding the same part on the other nodes,
    // whose sums of it are added by an all-reduce once the reduce-scatter is done; null otherwise.
    comm::Comm* replicas = nullptr;
    comm::RequestPtr replica_sum = {};
    size_t launch_order = 0;       // its place in launched_
    comm::RequestPtr gather = {};  // ZeRO-1: the all-gather of the updated parameters; ZeRO-3: of the layer
    // ZeRO-3: what is here of every rank's part (Held), and what the gather in flight brings; a BF16
    // gather lands in staging_[staged].
    Held held = Held::kWhole, gathering = Held::kPart;
    int staged = -1;
    bool settled = false;  // the reduction in flight is complete (settle)
    // parallel.reduce_each_microbatch: a reduction of this step is already in shard_, so the one in flight
    // writes to partial_ and settle adds it in.
    bool reduced = false, into_partial = false;
    bool trains = true;  // GradientBucket::trains: else never reduced, nor gathered after an update
  };
  void launch(Bucket& bucket);
  // Whether the bucket's reduction is complete, without blocking (hybrid sharding: it starts the sum across
  // nodes once the reduce-scatter is done).
  bool reduced(Bucket& bucket);
  // Hybrid sharding: starts the sums across nodes in the order the reduce-scatters were launched (every rank
  // issues a communicator's collectives in one order), each once its reduce-scatter is done; those up to
  // `through` (when given) after waiting for it.
  void start_replica_sums(const Bucket* through);
  // Waits for the bucket's reduction; ZeRO-2/3 then release its gradients (the rank's part is in shard_).
  void settle(Bucket& bucket);
  // parallel.reduce_each_microbatch, after a micro-batch's backward that is not the step's last: every
  // launched reduction completes (the next backward adds into released, zeroed gradients) and may be
  // launched again.
  void settle_microbatch();
  void finish_gradients();
  // ZeRO-3: gather_layer(l, next) makes the buckets of layer l readable by a pass (their all-gathers
  // started now unless prefetched) and, with parallel.prefetch, starts those of layer `next`;
  // release_weights hands back what this rank does not own of the buckets of the layers `layers` picks.
  // start_gather brings `want` (kWorking: what a pass reads; kWhole: the FP32 weights too).
  void start_gather(Bucket& bucket, Held want);
  void finish_gather(Bucket& bucket);
  void gather_layer(int layer, int next);
  void release_weights(const std::function<bool(int)>& layers);
  // ZeRO-2/3: takes back the gradients of the buckets of layer `layer` (released at the step's start and
  // after each reduction) before a pass writes them.
  void acquire_gradients(int layer);
  // The training state's resident bytes now, kept in peak_state_ when more (StepStats::state_bytes).
  void sample_state();
  // ZeRO-1 after an update: every bucket's parameter all-gather is launched; need_weights(l) completes
  // those of the buckets up to layer l (keys rise in storage order) and refreshes their part of the
  // model's working copy: the next forward calls it as it reaches each layer, so the gathers overlap it.
  void launch_gathers();
  void need_weights(int layer);
  void complete_gathers();
  // The first and the last block of this stage's model chunk `chunk` (virtual stage chunk x pp + stage).
  int first_block(int chunk) const { return bounds_[size_t(chunk * groups_.layout.pp + groups_.pp_rank)]; }
  int last_block(int chunk) const {
    return bounds_[size_t(chunk * groups_.layout.pp + groups_.pp_rank) + 1] - 1;
  }
  // Under context parallelism, this rank's part of each micro-batch (context_parallel.h); empty at cp 1.
  std::vector<MicroBatch> context_shards(std::span<const MicroBatch> batches) const;

  TrainSpec spec_;
  comm::ProcessGroups& groups_;
  Backend& backend_;
  std::vector<int> bounds_;  // of the virtual stages: pp x chunks_, chunk c of stage s being c x pp + s
  int chunks_ = 1;           // model chunks of a stage (interleaved)
  StageSchedule schedule_;   // this stage's actions in a step
  // Chunk c's activation slots (its micro-batches in flight) are the model's [slot_base_[c], slot_base_[c +
  // 1]).
  std::vector<int> slot_base_ = {0};
  // ZB-H1: the weight gradients of the micro-batches waiting for their W pass (i on i mod size()).
  std::deque<WeightGradQueue> waiting_;
  double analytic_bubble_;  // every stage's schedule simulated (schedule.h), a backward twice a forward
  std::unique_ptr<ParallelPlan> plan_;
  std::shared_ptr<const Loss> loss_;  // the spec's objective (run.objective)
  std::unique_ptr<GPT> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<Bucket> buckets_;
  comm::Comm* dense_ =
      nullptr;  // where dense gradients are reduced: dp, or dp x cp under context parallelism
  // Hybrid sharding: dense_'s and expert_dp's ranks on this node, and on the other nodes (comm::NodeSplit).
  comm::NodeSplit dense_nodes_, expert_nodes_;
  std::vector<Bucket*> launched_;  // the buckets summed across nodes, in launch order (since the last settle)
  size_t replicas_started_ = 0;    // launched_[0, replicas_started_) have their sums across nodes started
  std::vector<FlatRange> owned_;   // this rank's shard: its group rank's part of every bucket
  std::vector<FlatRange> norm_ranges_;  // owned elements counted once in the global norm
  Buffer<float> shard_;                 // reduce-scatter output, back to back
  Buffer<float> partial_;  // reduce_each_microbatch: a later micro-batch's output, shard_'s layout
  Buffer<float> recv_act_, recv_grad_;
  // BF16 ZeRO-3: the gathers' BF16 buffers (a bucket's size; as many as were ever in flight at once).
  std::vector<Buffer<uint16_t>> staging_;
  size_t gathered_ = 0;  // buckets_[0, gathered_) hold their updated parameters (need_weights)
  // Fewer key/value heads than tensor-parallel ranks: the ranks holding the same head (kv_), and per
  // block the parameters whose gradients they sum (each rank's holds its own query heads' share).
  std::unique_ptr<comm::Comm> kv_;
  std::map<int, std::vector<const ParamInfo*>> kv_params_;
  bool inject_nan_ = false;
  size_t peak_state_ = 0;
  double gather_s_ = 0;  // this step's ZeRO-3 gathers: the time waited for them, their bytes
  uint64_t gather_bytes_ = 0;
};

}  // namespace forge::trainer
