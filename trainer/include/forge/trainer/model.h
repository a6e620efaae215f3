// A pre-norm decoder of any family the model spec describes (ModelSpec: GPT-2, Llama, Qwen, Mistral and their
// Mixture-of-Experts variants): token embedding (and a learned position table, GPT-2), blocks of (norm,
// attention slot, norm, FFN slot), a final norm, the classifier (tied to the embedding or its own head) and
// a loss.
//
// The model knows nothing about parallelism. It is described by a parameter table: every parameter is a
// named logical tensor with its logical shape and the rule by which tensor parallelism may shard it, so a
// checkpoint stores it independent of the layout. Its layers come from a LayerFactory (layers.h): whole
// by default, split by the parallel runtime's plan. Its ops and buffers come from a Backend (backend.h).
// Parameters, and their gradients, live in one contiguous buffer each, with a view per parameter.
#pragma once

#include "forge/common/batch.h"
#include "forge/common/layout.h"
#include "forge/trainer/backend.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/rope.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

// The model families with presets (model.family): each sets the slot defaults of ModelSpec, which any key
// may override. gpt2 is the 2019 decoder; the others are today's RMSNorm / SwiGLU / rotary /
// grouped-query decoders and their Mixture-of-Experts variants.
enum class Family { kGpt2, kLlama, kQwen2, kQwen3, kMistral, kMixtral, kQwen2Moe };
// The norm slot (model.norm): LayerNorm with a bias, or RMSNorm (a weight, no centring).
enum class Norm { kLayerNorm, kRmsNorm };
// The dense FFN's activation (model.activation): GELU (tanh) between fc and proj, or SwiGLU: silu(gate) x up
// between gate_up (one product of twice the width) and down.
enum class Activation { kGelu, kSwiglu };
// Where positions enter (model.positions): a learned table added to the embedding, or rotary positions
// applied to q and k in every attention layer.
enum class Positions { kLearned, kRotary };
// What fills a block's FFN slot: the dense MLP, or (model.ffn = moe) a Mixture-of-Experts layer in every
// moe_every-th block (moe.h).
enum class Ffn { kDense, kMoe };

// The vision tower of a vision-language model ([vision] keys; docs/TRAINER.md, "Vision-language models"): a
// ViT encoder over image_size x image_size RGB pictures cut into patch x patch squares (patch embedding by
// a product over each flattened patch, a learned position per patch, `layers` pre-norm blocks of
// bidirectional attention and a GELU MLP, a final LayerNorm unless post_norm is off) and a projector
// (Linear, GELU, Linear) into the language model's width, whose outputs replace the embeddings of a
// picture's placeholder tokens. layers = 0: a text-only model. SigLIP's vision transformer is this encoder
// (norm_eps 1e-6); LLaVA feeds its projector the last block's output, before SigLIP's final LayerNorm
// (post_norm off).
struct VisionSpec {
  int layers = 0;
  int image_size = 0;
  int patch = 0;
  int width = 0;
  int heads = 0;
  int mlp_hidden = 0;
  int projector_hidden = 0;
  float norm_eps = 1e-5f;  // of every LayerNorm of the encoder
  bool post_norm = true;   // the final LayerNorm, between the last block and the projector
  bool enabled() const { return layers > 0; }
  int grid() const { return image_size / patch; }
  int tokens() const { return grid() * grid(); }          // positions of one picture in a sequence
  int patch_values() const { return 3 * patch * patch; }  // one flattened patch: channel, row, column
};

// The part of a vision-language model a parameter belongs to, by its name: the vision tower
// ("vision.*"), the projector ("projector.*") or the language model (everything else). Freezing and
// starting from a text-only checkpoint go by it.
enum class ModelPart { kVision, kProjector, kLm };
ModelPart model_part(std::string_view param);

// The architecture of a decoder, resolved: what model_spec (spec.h) builds from the [model] keys, and what
// a checkpoint records (checkpoint_io.h) and is read back through the same code. A block is made of slots
// (docs/ARCHITECTURE.md, "The model"): norm, attention, norm, FFN (dense or MoE); around the blocks the
// embedding, the final norm and the classifier (tied to the embedding or its own head).
struct ModelSpec {
  Family family = Family::kGpt2;
  int layers = 0;
  int d_model = 0;
  int heads = 0;
  int kv_heads = 0;  // key/value heads, dividing heads (grouped-query attention; = heads: multi-head)
  int head_dim = 0;  // may differ from d_model / heads
  int vocab = 0;
  int seq_len = 0;        // tokens per training sequence
  int max_positions = 0;  // positions the model takes (>= seq_len): rows of a learned table
  // Norm slot (every norm of the model).
  Norm norm = Norm::kLayerNorm;
  float norm_eps = 1e-5f;
  // Attention slot.
  Positions positions = Positions::kLearned;
  RopeSpec rope;            // rotary positions
  bool qkv_bias = true;     // biases of the q, k and v products
  bool qk_norm = false;     // per-head RMSNorm of q and k before the rotation (Qwen 3)
  int window = 0;           // > 0: each query sees at most `window` keys (sliding window)
  bool linear_bias = true;  // biases of the attention's output product and of the FFN's products
  // Dense FFN slot.
  Activation activation = Activation::kGelu;
  int ffn_hidden = 0;  // its hidden width
  // Classifier: tied to the token embedding, or its own head.weight.
  bool tied_embeddings = true;
  // MoE FFN slot.
  Ffn ffn = Ffn::kDense;
  int experts = 0;                  // experts per MoE block
  int top_k = 1;                    // experts each token goes to
  int moe_every = 1;                // blocks moe_every - 1, 2 moe_every - 1, ... are MoE blocks
  int moe_hidden = 0;               // each expert's hidden width
  bool router_renormalize = false;  // the top_k gates divided by their sum (Mixtral); else as softmaxed
  int shared_expert_hidden = 0;     // > 0: a shared expert every token goes through, its output scaled by
                                    // sigmoid(shared_gate(x)) (Qwen2-MoE)
  double capacity_factor = 0;  // moe: an expert takes at most ceil(factor x tokens x top_k / experts); 0: all
  double router_aux_coef = 1e-2;  // moe: weight of the load-balancing loss
  double router_z_coef = 1e-3;    // moe: weight of the router z-loss
  VisionSpec vision;              // a vision-language model's encoder and projector
  // A value head (PPO's critic, loss.h): value_head.weight [1, d_model] and .bias [1] on the final norm's
  // output, one estimate per position, read by a loss that asks for it (Loss::values).
  bool value_head = false;

  // The attention's parameters are GPT-2's fused attn.qkv tensor (gpt2), or attn.q, attn.k, attn.v.
  bool fused_qkv() const { return family == Family::kGpt2; }
  bool moe_block(int layer) const { return ffn == Ffn::kMoe && (layer + 1) % moe_every == 0; }
  // Whether some block's FFN is the dense MLP (ffn_hidden wide); not in an MoE model with every block MoE.
  bool dense_blocks() const { return ffn == Ffn::kDense || moe_every > 1; }
  AttentionShape attention() const { return {heads, kv_heads, head_dim, window}; }
  ModelDims dims() const { return {layers, heads, vocab, ffn == Ffn::kMoe ? experts : 0, kv_heads, seq_len}; }
};
std::string_view family_name(Family family);
// One line: the family and what sets it apart, e.g. "llama: 2 blocks of 128, 4 heads sharing 2 key/value
// heads of 32, rmsnorm, rope (theta 500000), swiglu 384" (logs, summary.json, the run report).
std::string model_description(const ModelSpec& spec);

enum class DType { kF32, kBF16 };

// How a logical tensor is split: across the ranks of a tensor-parallel group (kSplit), or, for the
// experts of an MoE block ([experts, ...] tensors), by expert across the expert-parallel group (kExperts:
// dimension 0, whole experts; replicated across the tensor-parallel group).
struct ShardRule {
  enum class Kind { kReplicated, kSplit, kExperts };
  Kind kind = Kind::kReplicated;
  int dim = 0;     // the split dimension (kSplit, kExperts: 0)
  int groups = 1;  // the dimension is `groups` equal blocks, each split separately (fused q|k|v: 3)
  // kSplit: how many consecutive tensor-parallel ranks hold the same part (a model with fewer key/value
  // heads than ranks: each head is held by tp / kv_heads ranks, whose gradients of it are summed).
  int replicas = 1;
  int part(int tp_rank) const { return tp_rank / replicas; }
};

struct ParamInfo {
  std::string name;                  // logical name, e.g. "blocks.3.attn.qkv.weight"
  std::vector<int64_t> shape;        // logical (unsharded) shape
  std::vector<int64_t> local_shape;  // this slice's shard
  ShardRule shard;
  bool decay = true;   // AdamW weight decay applies (matrices; not norms or biases)
  float init_std = 0;  // normal(0, init_std) if > 0, else constant init_value
  float init_value = 0;
  size_t offset = 0;  // into the flat buffers
  size_t numel = 0;   // local element count
};

// The part of the logical model one process holds: blocks [first_layer, last_layer), whether it holds
// the embedding and/or the head, its tensor-parallel rank and its share of the experts. The default is
// the whole model. A stage of an interleaved pipeline holds `chunks` model chunks: chunk c is blocks
// [first_layer, last_layer) + c x chunk_stride, the embedding going with chunk 0 and the head with the last.
struct ModelSlice {
  int first_layer = 0;
  int last_layer = -1;  // -1: all layers
  bool embedding = true;
  bool head = true;
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;  // experts [ep_rank, ep_rank + 1) x experts / ep_size of each MoE block
  int ep_size = 1;
  int chunks = 1;
  int chunk_stride = 0;
  // The slice's blocks in order, chunk by chunk (`layers`: the model's, for last_layer = -1).
  std::vector<int> blocks(int layers) const;
};

// Parameter table of `slice` in storage order. The experts of each MoE block, and a vision-language model's
// encoder and its projector, are stretches whose ends are multiples of `part_align` elements (the experts'
// gradients are reduced over another group than the rest; a part train.freeze leaves out is not reduced at
// all); the parameters of each layer (the embeddings, a block, the final norm, an untied head) start at a
// multiple of `layer_align` (ZeRO-2/3 reduce, gather and release a layer's parameters alone). Throws
// std::invalid_argument if the slice does not fit.
std::vector<ParamInfo> parameter_table(const ModelSpec& config, const ModelSlice& slice = {},
                                       size_t part_align = 1, size_t layer_align = 1);

// Initial values of `slice`'s shard of `p` (GPT-2 scheme): element i of the logical tensor is a pure
// function of (seed, p.name, i), so every layout draws the same logical model.
void init_parameter(const ParamInfo& p, const ModelSlice& slice, uint64_t seed, std::span<float> out);

// Parameters of the logical model (position embeddings excluded): all of them, and those one token
// computes with (an MoE block's top_k experts of its `experts`, and its router; not the vision tower).
struct ParameterCounts {
  double total = 0, active = 0;
};
ParameterCounts parameter_counts(const ModelSpec& config);

// Model FLOPs per token (PaLM appendix B): 6 x the active parameters that multiply (not an untied token
// embedding, a lookup) + 12 x layers x the keys a query sees x heads x head_dim (the attention).
double flops_per_token(const ModelSpec& config);

// The feed-forward half of a block (the FFN slot): reads the block's second LayerNorm output and writes
// its update to the residual stream, without the output bias, which the block fuses into the residual
// add. The dense MLP fills it now; a Mixture-of-Experts layer plugs in the same way.
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  virtual void forward(int slot, ConstAct in, float* out, int rows) = 0;
  // din = dL/d(in) (overwrites) from dout = dL/d(out), for the micro-batch forward() ran on `slot`.
  virtual void backward(int slot, ConstAct in, const float* dout, float* din, int rows) = 0;
  // Full recompute (Recompute): what forward keeps for backward, without the output. Throws for a layer
  // that cannot run its forward twice (MoE: its routing statistics would count twice).
  virtual void forward_kept(int slot, ConstAct in, int rows);
  virtual const float* output_bias() const = 0;
  virtual size_t activation_bytes() const = 0;
};

// Activation recompute (model.recompute, model.recompute_every): in the blocks whose index divides by
// `every` (the whole model's indices, so every pipeline stage agrees), what is computed again in the
// backward instead of kept per micro-batch. Selective: the attention's output and SwiGLU's activation.
// Full: everything the block computes; it keeps only its input (the residual stream), and its forward runs
// again right before its backward, on one set of buffers every such block shares. The numbers are the same.
struct Recompute {
  enum class Kind { kNone, kSelective, kFull };
  Kind kind = Kind::kNone;
  int every = 1;
  bool covers(int layer) const { return kind != Kind::kNone && layer >= 0 && layer % every == 0; }
  bool selective(int layer) const { return kind == Kind::kSelective && covers(layer); }
  bool full(int layer) const { return kind == Kind::kFull && covers(layer); }
};

// How one process runs its share of a model (GPT's constructor): everything but the architecture.
struct ModelSetup {
  int batch = 1;  // sequences per micro-batch
  DType dtype = DType::kF32;
  ModelSlice slice = {};  // the whole model by default
  // Activation sets: the micro-batches a pipeline stage holds in flight, of each model chunk
  // (ModelSlice::chunks; one count: every chunk's).
  std::vector<int> slots = {1};
  Backend* backend = nullptr;            // null: cpu_backend()
  const LayerFactory* layers = nullptr;  // null: LayerFactory::whole(); a split slice needs the parallel
                                         // runtime's plan
  size_t flat_multiple = 1;  // the flat buffers padded to a multiple (data-parallel shards split evenly)
  size_t layer_align = 1;    // each layer's parameters start at a multiple (parameter_table)
  std::shared_ptr<const Loss> loss = nullptr;  // the head's objective; null: the LM cross-entropy
  Recompute recompute = {};                    // none by default
  // The parameters a run leaves as they are (train.freeze; null: none). No gradient is formed for them
  // (their layers get a null one) and their stretch of grads() is never written, not even zeroed; the
  // backward stops where nothing before it trains (a frozen vision encoder).
  std::function<bool(std::string_view param)> frozen = nullptr;
};

class GPT;
class MoeLayer;
class VisionTower;
struct RouterStats;

// Where a caller keeps the weights a pass reads (ZeRO): need(l) before the pass first reads the weights of
// layer l, done(l) once it will not read them again; layers are numbered as backward's on_grads (-1: the
// embeddings and the classifier, config.layers: the final norm). Either may be empty.
struct WeightHooks {
  std::function<void(int)> need, done;
};

// The keys and values of incremental decoding (GPT::decode): per block of the model, `sequences`
// sequences of up to `max_len` positions, in the model's backend memory.
class KvCache {
 public:
  // Throws std::invalid_argument unless 1 <= max_len <= the model's max_positions and sequences >= 1.
  KvCache(GPT& model, int sequences, int max_len);
  int sequences() const { return sequences_; }
  int max_len() const { return max_len_; }
  size_t bytes() const;

 private:
  friend class GPT;
  int sequences_, max_len_;
  std::vector<Buffer<float>> keys_, values_;  // per block: [sequences, max_len, d_model]
};

// One position run by GPT::decode: `token` at `position` of cache sequence `sequence`.
struct DecodeRow {
  int32_t sequence = 0, position = 0, token = 0;
};
// A picture in a decode call (a vision-language model): its features replace the embeddings of rows
// [row, row + the picture's tokens) of the call, consecutive positions of one sequence; `rgb` holds
// image_size^2 RGB bytes (host memory).
struct DecodePicture {
  int row = 0;
  const uint8_t* rgb = nullptr;
};

class GPT {
 public:
  // Allocates parameters, gradients and activations of setup.slice of `spec`'s model (ModelSetup).
  // Throws std::invalid_argument when the slice does not fit the spec.
  GPT(const ModelSpec& spec, const ModelSetup& setup);
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const ModelSpec& config() const { return config_; }
  const ModelSlice& slice() const { return slice_; }
  int batch() const { return batch_; }
  DType dtype() const { return dtype_; }
  Backend& backend() { return backend_; }
  const Loss& loss() const { return *loss_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& param(const std::string& name) const;

  // The flat buffers, in the backend's memory (host-readable on the CPU backend).
  std::span<float> weights() { return weights_.span(); }
  std::span<float> grads() { return grads_.span(); }
  std::span<float> weight(const std::string& name);
  std::span<float> grad(const std::string& name);

  // Deterministic initialization of every parameter (init_parameter).
  void init(uint64_t seed);
  // Zeroes the gradients of every parameter that trains (ModelSetup::frozen).
  void zero_grad();
  // Call after changing weights() (optimizer step, loading): refreshes the BF16 working copy, of every
  // weight or of the flat range `part`.
  void weights_changed();
  void weights_changed(FlatRange part);
  // Call after writing the working copy's range `part` directly (ZeRO-3's BF16 gathers): the backend's
  // copy of it follows.
  void working_copy_changed(FlatRange part);
  // BF16 mode: the working copy (FP32 slots, the weights' layout); empty in FP32. Memory a caller that
  // lets go of weights (ZeRO-3) lets go of here too.
  std::span<float> working_copy() { return work_.span(); }

  // Pipeline-stage primitives on activation set `slot`, for `batch`, this rank's micro-batch (batch()
  // rows of config.seq_len). rows() = batch x seq_len. Slots are numbered chunk by chunk: chunk c's
  // ModelSetup::slots[c] of them follow chunk c - 1's (one chunk: every slot runs the whole slice).
  // forward: a slice with the embedding reads the batch's inputs, any other reads `input` ([rows,
  // d_model] in the backend's memory, the residual stream from the previous stage). A slice with the head
  // returns the loss sums of the batch and, if `backward`, prepares the classifier's gradient for
  // backward() (of loss_scale x the loss sum: the trainer passes 1 / the step's global weight); any other
  // returns zeros and leaves its output in output(slot). `batch` must stay alive and unchanged until
  // backward(slot) returns: a host backend reads it in place. `weights`: -1 first (the embeddings, the tied
  // classifier included) and done last with the final norm; a block's need comes before the previous
  // block's done (its norm is fused with that block's residual add). Where a caller completes the
  // weights' update (ZeRO-1's all-gather) or gathers and releases them (ZeRO-3).
  // `loss`: another objective than the model's for this pass (forward only: a rollout's log-probabilities
  // under the weights being trained, TokenLogps).
  LossSums forward(int slot, const MicroBatch& batch, const float* input, float loss_scale, bool backward,
                   const WeightHooks& weights = {}, const Loss* loss = nullptr);
  std::span<const float> output(int slot) const;
  // backward of the micro-batch forward() ran on `slot`: from the classifier gradient (head) or from
  // `d_output` (the next stage's input gradient). Leaves the gradient of the slice's input in
  // input_grad(slot) (slices without the embedding). Calls on_grads(l) as soon as the gradients of layer l
  // are complete for this micro-batch; l = config.layers for the final LayerNorm, -1 for the embeddings.
  // `weights` as forward's, for the final norm and the blocks (the embedding's backward reads no weight).
  void backward(int slot, const float* d_output, const std::function<void(int)>& on_grads = {},
                const WeightHooks& weights = {});
  std::span<const float> input_grad(int slot) const;
  int64_t rows() const { return int64_t(batch_) * config_.seq_len; }
  // The rows of the residual stream this process holds (output(), input_grad()): rows() / the layer
  // factory's sequence_shards().
  int64_t stream_rows() const { return rows() / shards_; }
  // A batch this model cannot take (another shape; a token, target, weight or position out of range) is
  // forge::Error(kData) naming the sample and position.
  void check(const MicroBatch& batch) const { check_batch(batch, batch_, config_); }
  // The same for a model of `config` trained on `rows` x config.seq_len micro-batches.
  static void check_batch(const MicroBatch& batch, int rows, const ModelSpec& config);

  // Whole-model conveniences (slot 0; the slice must hold the embedding and the head). forward_backward
  // adds the gradients of loss_scale x the loss sum to grads(); a batch that does not fit the model is
  // forge::Error(kData).
  LossSums forward_backward(const MicroBatch& batch, float loss_scale);
  // `loss`: another objective than the model's, for this forward only (a rollout's log-probabilities under
  // the weights being trained: TokenLogps).
  LossSums forward_loss(const MicroBatch& batch, const Loss* loss = nullptr);
  // All logits, batch x seq_len x vocab, into host memory (tests and evaluation; an unsplit model).
  void forward_logits(const MicroBatch& batch, std::span<float> logits);

  // Incremental decoding (the whole model, or a pipeline stage's slice whose stages all call it alike:
  // LayerFactory::decode_link): runs `rows` (at most rows() of them) through the model, each
  // attending to the keys and values of its sequence's earlier positions in `cache` and of the rows
  // before it in this call, and appends theirs. A sequence's positions must arrive in order from 0 (a
  // prompt at once, then a token a step; a new sequence in a slot starts again at 0). Writes the logits of
  // the rows `logit_rows` lists into `logits` (host memory, [logit_rows.size(), vocab]). The same
  // arithmetic as forward() up to the attention's summation order: a token's logits match the full
  // forward's at its position. `pictures` go through the vision tower into their rows (a prompt's). Throws
  // std::invalid_argument for a row outside the cache or the model, or a picture the model cannot take.
  // On a pipeline stage every stage gets the logits (the last stage's, sent to each).
  void decode(KvCache& cache, std::span<const DecodeRow> rows, std::span<const int> logit_rows,
              std::span<float> logits, std::span<const DecodePicture> pictures = {});
  // Whether decoding goes on among the processes whose decode() calls are collective with this one's
  // though they decode other sequences (expert parallelism's group: each step exchanges tokens between
  // them); `mine`: whether this process has rows. Every process asks before each decode() and, while the
  // answer is true, calls it, with no rows when it has none. Elsewhere: mine.
  bool decoding(bool mine);

  // A frozen model's forward (a distillation teacher, loss.h; the whole model): runs `batch` up to the
  // final LayerNorm and keeps that; feature_logits then forms the logits of positions [row0, row0 + rows)
  // over vocabulary columns [vocab_begin, vocab_begin + V) into `out` (backend memory) — the chunk the
  // student's classifier is at, so the teacher's logits of a whole batch never exist either. The batch is
  // the student's, checked before any context-parallel split (a rank's chunks number their documents as the
  // whole row does): only its shape is checked here.
  void forward_features(const MicroBatch& batch);
  void feature_logits(float* out, int row0, int rows, int vocab_begin, int V);

  // Bytes held by activations and scratch (for memory reports).
  size_t activation_bytes() const;

  // The MoE blocks of the slice (moe.h): the weight of each micro-batch's router losses in the objective
  // (1 until set), and what their routers did since the last take, one entry per MoE block in order.
  void set_router_loss_weight(float weight);
  std::vector<RouterStats> take_router_stats();
  const std::vector<MoeLayer*>& moe_layers() const { return moe_layers_; }

 private:
  struct Block;
  struct Slot;
  struct Workspace;
  LossSums run_forward(int slot, const MicroBatch& batch, const float* input, float loss_scale, bool backward,
                       float* logits_out, bool classify = true, const WeightHooks& weights = {},
                       const Loss* loss_of = nullptr);
  // The blocks of slot `slot` over its first N rows (the stream entering them in res), and the final norm
  // when the slice has the head; attention(l, in, out) runs block l's attention slot (training or
  // decoding); weights as forward's (the blocks' need and done).
  void run_blocks(int slot, int N, const std::function<void(int, ConstAct, float*)>& attention,
                  const WeightHooks& weights = {});
  void check_whole(const MicroBatch& batch) const;
  // The value head (Loss::values): its estimates of slot s's rows into the slot's DeviceBatch (host
  // memory), and the gradient the loss left there (of loss_scale x its sum) into the final norm's and the
  // head's own.
  void form_values(Slot& s);
  void values_backward(Slot& s, float loss_scale);
  // decode() on a pipeline stage: the last stage's logits (host memory) to every stage.
  void share_logits(std::span<float> logits);
  // A vision-language model: pictures (image_size^2 RGB bytes each, host memory) through the vision tower,
  // their features in place of the embeddings of their runs, from stream rows `starts`, in slot's stream.
  void place_pictures(int slot, const uint8_t* pixels, std::span<const int64_t> starts);
  ParamRef ref(const std::string& name);
  ParamRef optional_ref(const std::string& name);  // empty when the table has no such parameter
  // One tensor over parameters the table stores back to back, [sum of their rows, ...] (attn.q, k, v).
  ParamRef fused_ref(const std::vector<std::string>& names);
  std::string classifier_weight() const;  // wte.weight (tied) or head.weight
  // Model chunks (ModelSlice::chunks): block j of blocks_ is the model's layer layer_of(j); chunk c runs
  // blocks_[c x layers_, (c + 1) x layers_), the embedding with chunk 0, the head with the last.
  int layer_of(int j) const {
    return slice_.first_layer + (layers_ > 0 ? j / layers_ * slice_.chunk_stride + j % layers_ : 0);
  }
  bool embeds(int chunk) const { return slice_.embedding && chunk == 0; }
  // Slot s: its chunk, and its place among the chunk's activation sets.
  struct SlotPlace {
    int chunk, set;
  };
  SlotPlace place(int slot) const {
    int c = 0;
    while (slot >= slot_base_[size_t(c) + 1]) ++c;
    return {c, slot - slot_base_[size_t(c)]};
  }
  int chunk_sets(int chunk) const { return slot_base_[size_t(chunk) + 1] - slot_base_[size_t(chunk)]; }
  bool heads(int chunk) const { return slice_.head && chunk == chunks_ - 1; }

  ModelSpec config_;
  ModelSlice slice_;
  int batch_;
  int shards_;  // LayerFactory::sequence_shards()
  DType dtype_;
  Backend& backend_;
  std::shared_ptr<const Loss> loss_;
  int layers_;                        // blocks in each chunk of this slice
  int chunks_ = 1;                    // ModelSlice::chunks
  std::vector<int> slot_base_ = {0};  // chunk c's slots are [slot_base_[c], slot_base_[c + 1])
  std::vector<ParamInfo> params_;
  std::function<bool(std::string_view)> frozen_;  // ModelSetup::frozen
  std::vector<FlatRange> trained_;                // the stretches of grads() a backward adds to
  Buffer<float> weights_, grads_;
  Buffer<float> work_;  // BF16 mode: weights rounded to BF16 (the copy forward/backward use)
  std::unique_ptr<Workspace> ws_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Embedding> embedding_;
  std::unique_ptr<Classifier> classifier_;
  std::vector<MoeLayer*> moe_layers_;  // owned by their blocks
  std::unique_ptr<NormLayer> lnf_;
  ParamRef value_weight_, value_bias_;   // ModelSpec::value_head; empty without one
  DecodeLink* decode_link_ = nullptr;    // LayerFactory::decode_link: decoding beside other processes
  Buffer<float> shared_logits_;          // share_logits on a device backend
  std::unique_ptr<VisionTower> vision_;  // a vision-language model's slice with the embedding
  std::deque<ParamInfo> views_;          // of fused_ref
};

}  // namespace forge::trainer
