// Job-spec keys of the trainer and their validation (every rule names the key and what to do).
#include "forge/trainer/spec.h"

#include "forge/common/error.h"
#include "forge/common/text.h"
#include "forge/trainer/loss.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

namespace forge::trainer {

void add_trainer_keys(ConfigSchema& s) {
  s.add<std::string>("run.name", "run", "run name (metrics, summary)")
      .add<std::string>("run.dir", "runs/run", "run directory: metrics/, summary.json")
      .add<std::string>("run.image", "",
                        "container image every rank runs in: an OCI bundle made by forge-image build; the "
                        "batch scripts start the ranks in it (docs/IMAGES.md); empty: the node's software")
      .add<int64_t>("run.steps", 100, "optimizer steps to train")
      .add<int64_t>("run.seed", 1234, "seed of initialization and synthetic data")
      .add<int>("run.threads", 0, "CPU threads (0: SLURM_CPUS_PER_TASK, else all cores)")
      .add_choice("model.recompute", "none", {"none", "selective", "full"},
                  "activation recompute: selective computes each block's attention output and SwiGLU "
                  "activation again in the backward instead of keeping them; full keeps only each block's "
                  "input and runs its forward again before its backward (the same numbers, less memory)")
      .add<int>("model.recompute_every", 1,
                "model.recompute in every n-th block (those whose index divides by n)")
      .add_choice(
          "run.objective", "lm", objective_names(),
          "what the run learns: lm, every token of the data; sft, the replies (captions) a chat "
          "(image-text) dataset's loss mask marks; dpo, the preferences of a preference dataset; "
          "distill, a teacher model's distributions; grpo and ppo, rewards of the policy's own replies "
          "to a prompt set (ppo with a value head; docs/TRAINER.md)")
      .add_choice("run.device", "auto", {"auto", "cpu", "cuda"},
                  "where each rank computes: cuda (one GPU per rank), cpu, or auto (cuda when the process "
                  "sees a GPU and forge-train was built with CUDA)")
      .add<double>("run.peak_gflops", 0.0, "matrix-product peak for MFU in GFLOP/s (0: measure at start)")
      .add<double>(
          "run.memory_per_rank_gib", 0.0,
          "memory a rank may use (GiB): a layout whose plan (forge-train --plan) needs more is refused "
          "before anything is allocated (0: no cap)")
      .add<std::string>("train.freeze", "none",
                        "parts whose weights stay as they are (no update, no optimizer state): none, or a "
                        "comma-separated list of vision (the encoder), projector, lm (the language model)")
      .add<std::string>(
          "run.trace_steps", "",
          "steps to trace per rank into <run.dir>/trace/ (A-B, 1-based; auto: the 3 steps after "
          "the first; empty: none)");
  s.add_choice("model.family", "gpt2", {"gpt2", "llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe"},
               "the architecture's preset: every slot key left at auto takes the family's value "
               "(docs/TRAINER.md, 'Model families')")
      .add<int>("model.layers", 6, "transformer blocks")
      .add<int>("model.d_model", 384, "width of the residual stream")
      .add<int>("model.heads", 6, "attention (query) heads")
      .add<int>("model.kv_heads", 0, "key/value heads, dividing model.heads (0: model.heads, multi-head)")
      .add<int>("model.head_dim", 0, "width of each head (0: d_model / heads)")
      .add<int>("model.vocab", 8192, "vocabulary size (the dataset's tokenizer)")
      .add<int>("model.seq_len", 256, "tokens per training sequence")
      .add<int>("model.max_positions", 0, "positions the model takes: rows of a learned table (0: seq_len)")
      .add_choice("model.norm", "auto", {"auto", "layernorm", "rmsnorm"},
                  "the norm slot (auto: the family's)")
      .add<double>("model.norm_eps", 0.0, "epsilon of every norm (0: the family's)")
      .add_choice("model.positions", "auto", {"auto", "learned", "rope"},
                  "learned position table, or rotary positions on q and k (auto: the family's)")
      .add<double>("model.rope_theta", 0.0, "rotary base (0: the family's)")
      .add_choice("model.rope_scaling", "none", {"none", "linear", "llama3", "yarn"},
                  "rotary frequencies stretched for a longer context than pretraining's")
      .add<double>("model.rope_factor", 8.0, "rope scaling: how many times longer the context is")
      .add<double>("model.rope_low_freq_factor", 1.0, "rope_scaling = llama3: low_freq_factor")
      .add<double>("model.rope_high_freq_factor", 4.0, "rope_scaling = llama3: high_freq_factor")
      .add<int>("model.rope_original_positions", 8192,
                "rope_scaling = llama3 or yarn: the context the model was pretrained on")
      .add<double>("model.rope_beta_fast", 32.0, "rope_scaling = yarn: beta_fast")
      .add<double>("model.rope_beta_slow", 1.0, "rope_scaling = yarn: beta_slow")
      .add_choice("model.qkv_bias", "auto", {"auto", "on", "off"}, "biases of the q, k, v products")
      .add_choice("model.qk_norm", "auto", {"auto", "on", "off"},
                  "per-head RMSNorm of q and k before the rotation (Qwen 3)")
      .add<int>("model.window", -1,
                "sliding-window attention: each query sees at most this many keys (0: all; -1: the family's)")
      .add_choice("model.linear_bias", "auto", {"auto", "on", "off"},
                  "biases of the attention's output product and of the FFN's products")
      .add_choice("model.activation", "auto", {"auto", "gelu", "swiglu"}, "the dense FFN's activation")
      .add<int>("model.ffn_hidden", 0,
                "hidden width of the dense FFN (0: 4 d_model for gelu, 8/3 for swiglu)")
      .add_choice("model.tied_embeddings", "auto", {"auto", "on", "off"},
                  "the classifier reuses the token embedding (off: its own head.weight)")
      .add_choice("model.value_head", "auto", {"auto", "on", "off"},
                  "a value head on the final norm (PPO's critic; auto: on for run.objective = ppo)")
      .add_choice(
          "model.ffn", "auto", {"auto", "dense", "moe"},
          "the blocks' feed-forward network: the dense MLP, or Mixture-of-Experts blocks (docs/TRAINER.md)")
      .add<int>("model.experts", 0, "moe: experts per MoE block (>= 2)")
      .add<int>("model.top_k", 2, "moe: experts each token is routed to")
      .add<int>("model.moe_every", 1, "moe: every k-th block is an MoE block (1: all of them)")
      .add<int>("model.moe_hidden", 0, "moe: each expert's hidden width (0: as model.ffn_hidden)")
      .add_choice("model.router_renormalize", "auto", {"auto", "on", "off"},
                  "moe: the top_k gates divided by their sum (Mixtral, Qwen 3) or kept as softmaxed")
      .add<int>("model.shared_expert_hidden", -1,
                "moe: hidden width of a shared expert with a sigmoid gate (0: none; -1: the family's)")
      .add<double>("model.capacity_factor", 0.0,
                   "moe: an expert takes at most factor x tokens x top_k / experts tokens of a micro-batch, "
                   "the rest go around it (0: dropless)")
      .add<double>("model.router_aux_coef", 1e-2, "moe: weight of the load-balancing loss")
      .add<double>("model.router_z_coef", 1e-3, "moe: weight of the router z-loss");
  s.add<int>("vision.layers", 0, "blocks of the vision encoder (0: a text-only model)")
      .add<int>("vision.image_size", 224, "side of the square RGB pictures the encoder takes (pixels)")
      .add<int>("vision.patch", 14, "side of a patch (pixels): a picture is (image_size / patch)^2 tokens")
      .add<int>("vision.width", 0, "width of the encoder (0: model.d_model)")
      .add<int>("vision.heads", 0, "attention heads of the encoder (0: model.heads)")
      .add<int>("vision.mlp_hidden", 0, "hidden width of the encoder's MLP (0: 4 x vision.width)")
      .add<int>("vision.projector_hidden", 0,
                "hidden width of the projector into the language model (0: model.d_model)")
      .add<double>("vision.norm_eps", 1e-5, "epsilon of the encoder's LayerNorms (SigLIP: 1e-6)")
      .add<bool>("vision.post_norm", true,
                 "a LayerNorm after the last block (SigLIP's post_layernorm); LLaVA's projector reads the "
                 "last block's output without it: off");
  s.add<std::string>("data.dataset", "synthetic", "dataset directory, or 'synthetic'")
      .add<int>("data.batch", 8, "sequences per micro-batch (per data-parallel rank)")
      .add<std::string>(
          "data.order", "block",
          "sample order of a prepared dataset: block (block-local shuffle) or global (docs/DATA.md)")
      .add<bool>("data.document_mask", false,
                 "packed documents: attention stays inside each document, positions restart (docs/DATA.md)")
      .add<std::string>("data.domain_weights", "",
                        "share of the samples per domain, e.g. code:0.3,prose:0.7 (normalised; a domain not "
                        "named gets none; empty: the dataset's natural proportions)")
      .add<std::string>("data.cache_dir", "",
                        "node-local directory the shards are staged into and read from, shared by the jobs "
                        "of the node (empty: read the dataset directory; docs/DATA.md)")
      .add<int64_t>("data.cache_max_bytes", 0,
                    "bytes the node-local cache may hold, least recently used entries evicted first (0: as "
                    "much as leaves 10% of its filesystem free)");
  s.add<double>("dpo.beta", 0.1, "DPO: strength of the pull away from the reference (beta)")
      .add<double>("dpo.label_smoothing", 0.0,
                   "DPO: share of preferences taken as flipped (conservative DPO)")
      .add<std::string>(
          "dpo.reference", "",
          "DPO: the reference checkpoint (empty: ckpt.init_from, the model the run starts from)")
      .add_choice("dpo.reference_mode", "precomputed", {"precomputed", "live"},
                  "DPO: the reference's log-probabilities computed once and stored beside the dataset, or "
                  "by a frozen copy of the reference at every step");
  s.add<std::string>("distill.teacher", "",
                     "distillation: the teacher's checkpoint (any size and layout, the same tokenizer)")
      .add<double>("distill.alpha", 0.5, "distillation: weight of the KL term (1 - alpha: the cross-entropy)")
      .add<double>("distill.temperature", 1.0, "distillation: softmax temperature of both distributions");
  s.add<int>("rl.group_size", 8, "grpo, ppo: replies sampled per prompt (dividing data.batch; grpo: >= 2)")
      .add<bool>("rl.scale_rewards", true, "grpo: advantages divided by their group's standard deviation")
      .add<double>("rl.clip_low", 0.2, "grpo, ppo: the policy ratio is clipped below at 1 - clip_low")
      .add<double>("rl.clip_high", 0.2,
                   "grpo, ppo: the policy ratio is clipped above at 1 + clip_high (DAPO: 0.28)")
      .add_choice(
          "rl.loss_norm", "token", {"token", "sequence"},
          "grpo, ppo: the loss averaged over every scored token of the step (DAPO), or per reply first")
      .add<double>("rl.kl_coef", 0.0,
                   "grpo, ppo: weight of the KL to the frozen reference (0: no reference held)")
      .add<std::string>("rl.reference", "",
                        "grpo, ppo: the KL's reference checkpoint (empty: ckpt.init_from)")
      .add<double>("rl.gamma", 1.0, "ppo: discount of later rewards in the advantages (GAE's gamma)")
      .add<double>("rl.lambda", 0.95, "ppo: GAE's lambda (1: returns minus values; 0: one-step errors)")
      .add<double>("rl.value_coef", 0.1, "ppo: weight of the value head's loss")
      .add<double>("rl.value_clip", 0.2, "ppo: how far a value estimate may move from the rollout's")
      .add<int>("rl.updates_per_rollout", 1,
                "grpo, ppo: optimizer steps per rollout, each on its own mini-batch of the rollout's replies")
      .add<int>("rl.max_new_tokens", 64, "grpo, ppo: tokens a reply may have")
      .add<double>("rl.temperature", 1.0, "grpo, ppo: sampling temperature of the rollouts")
      .add<double>("rl.top_p", 1.0, "grpo, ppo: nucleus sampling of the rollouts (1: off)")
      .add<std::string>(
          "rl.format_dataset", "",
          "grpo, ppo: a prepared dataset whose tokenizer and chat format the policy speaks (its SFT "
          "data; empty: the policy checkpoint's own tokenizer files)")
      .add<int>("rl.sandbox_parallel", 0, "grpo, ppo: code rewards run in sandboxes at once (0: run.threads)")
      .add<bool>(
          "rl.overlap_rewards", true,
          "grpo, ppo: score each reply as its sampling ends, code sandboxes running while the rest samples "
          "(false: after the whole rollout, when sampling needs every core)")
      .add<std::string>("reward.weights", "exact_match:1",
                        "grpo, ppo: each scorer's weight in a reply's reward, SCORER:WEIGHT,... (scorers: "
                        "exact_match, code, format, length)")
      .add_choice("reward.answer", "last_number", {"last_number", "boxed", "first_line"},
                  "grpo, ppo: what of a reply exact_match compares with the prompt's answers");
  s.add<double>("optim.lr", 3e-4, "peak learning rate")
      .add<double>("optim.min_lr", 3e-5, "learning rate at the end of the cosine decay")
      .add<int64_t>("optim.warmup_steps", 0, "linear warm-up steps")
      .add<double>("optim.weight_decay", 0.1, "AdamW decoupled weight decay (not on norms and biases)")
      .add<double>("optim.beta1", 0.9, "AdamW beta1")
      .add<double>("optim.beta2", 0.95, "AdamW beta2")
      .add<double>("optim.eps", 1e-8, "AdamW epsilon")
      .add<double>("optim.grad_clip", 1.0, "global gradient-norm clip (0: off)");
  s.add_choice("precision.dtype", "auto", {"auto", "fp32", "bf16"},
               "storage of weights and activations (bf16 keeps FP32 master weights and accumulation; "
               "auto: bf16 on cuda, fp32 on cpu)");
  s.add_choice("parallel.comm", "auto", {"auto", "nccl", "mpi"},
               "what the process groups communicate with: nccl (GPUs), mpi (CPUs; on GPUs host-staged, "
               "also how ranks share one GPU); auto: nccl on cuda, mpi on cpu");
  s.add<int>("parallel.tp", 1, "tensor-parallel ranks")
      .add<int>(
          "parallel.cp", 1,
          "context-parallel ranks sharing out each sequence (2 x cp chunks; model.seq_len divides by them)")
      .add<std::string>(
          "parallel.cp_comm", "ring",
          "how context parallelism gives queries the whole sequence's keys: ring (key/value chunks "
          "sent around the cp group) or a2a (all-to-all to whole sequences of 1/cp of the heads)")
      .add<bool>("parallel.sequence_parallel", false,
                 "cut the residual stream (norms, residual adds) into tp pieces of the sequence: an "
                 "all-gather and a reduce-scatter replace each all-reduce; the same numbers as without")
      .add<int>("parallel.ep", 1, "expert-parallel ranks sharing out the experts, carved out of dp")
      .add<int>("parallel.pp", 1, "pipeline stages")
      .add<int>("parallel.dp", 1, "data-parallel ranks")
      .add<int>("parallel.microbatches", 1, "micro-batches per optimizer step (gradient accumulation)")
      .add<int>("parallel.zero", 0,
                "ZeRO stage: 0 none; 1 optimizer state sharded across data-parallel ranks; 2 gradients "
                "too; 3 weights too, gathered layer by layer where forward and backward read them")
      .add<std::string>("parallel.zero_group", "dp",
                        "where ZeRO shards: dp (over all data-parallel ranks) or node (hybrid: over the "
                        "data-parallel ranks of each node, replicated across nodes, whose shards are summed "
                        "by an all-reduce)")
      .add<bool>("parallel.prefetch", true,
                 "ZeRO-3: start gathering the next layer's weights while the current layer computes")
      .add<bool>("parallel.reduce_each_microbatch", false,
                 "ZeRO-2/3: reduce-scatter each micro-batch's gradients as backward makes them (less memory) "
                 "instead of once per step")
      .add<std::string>("parallel.stage_layers", "",
                        "blocks per pipeline stage, e.g. 3,5 (empty: balanced by compute)")
      .add<std::string>("parallel.pp_schedule", "1f1b",
                        "pipeline schedule: 1f1b; interleaved (each stage holds parallel.pp_virtual model "
                        "chunks, dividing the bubble by them); zb-h1 (zero-bubble: weight gradients computed "
                        "apart, filling the bubble; a third of 1f1b's)")
      .add<int>("parallel.pp_virtual", 0,
                "interleaved: model chunks per pipeline stage (0: 2); model.layers must split into "
                "parallel.pp x parallel.pp_virtual equal chunks")
      .add<bool>("parallel.elastic", false,
                 "run on the ranks the job got (sbatch -N MIN-MAX): tp, cp and pp fixed, dp up to "
                 "parallel.dp, micro-batches raised to keep the global batch");
  add_guard_keys(s);
}

namespace {

template <typename T>
T positive(const Config& c, const std::string& key) {
  const T v = c.get<T>(key);
  if (v <= 0) c.reject(key, "must be a positive integer");
  return v;
}

TraceSteps trace_steps(const Config& c, int64_t steps) {
  const std::string v = c.get<std::string>("run.trace_steps");
  TraceSteps t;
  if (v.empty()) return t;
  if (v == "auto") {
    t.after_start = true;
    return t;
  }
  const auto number = [&](std::string_view part) -> int64_t {
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    return ec == std::errc() && end == part.data() + part.size() && !part.empty() ? n : -1;
  };
  const size_t dash = v.find('-');
  t.first = number(std::string_view(v).substr(0, dash));
  t.last = dash == std::string::npos ? t.first : number(std::string_view(v).substr(dash + 1));
  if (!(t.first >= 1 && t.first <= t.last && t.last <= steps))
    c.reject(
        "run.trace_steps",
        fmt::format("'{}' is not a step range inside the run: give A-B (or one step A) with 1 <= A <= B <= "
                    "run.steps = {}, or auto",
                    v, steps));
  return t;
}

// NAME:WEIGHT,... (data.domain_weights, reward.weights): names of [A-Za-z0-9_-], each once; finite weights,
// negative ones only where `negative` allows; not all 0. `example` completes the rule in a rejection.
std::map<std::string, double> named_weights(const Config& c, const std::string& key, const char* what,
                                            bool negative, const char* example) {
  const std::string v = c.get<std::string>(key);
  std::map<std::string, double> out;
  const auto bad = [&](const std::string& why) {
    c.reject(key, fmt::format("{}; give NAME:WEIGHT pairs separated by commas, {}", why, example));
  };
  for (size_t at = 0; at < v.size();) {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) bad(fmt::format("entry '{}' has no ':'", item));
    const auto trim = [](std::string t) {
      t.erase(0, t.find_first_not_of(" \t"));
      t.erase(t.find_last_not_of(" \t") + 1);
      return t;
    };
    const std::string name = trim(item.substr(0, colon)), number = trim(item.substr(colon + 1));
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char ch) {
          return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
        }))
      bad(fmt::format("entry '{}': '{}' is not a {} name ([A-Za-z0-9_-]+)", item, name, what));
    char* end = nullptr;
    const double w = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0') bad(fmt::format("entry '{}': '{}' is not a number", item, number));
    if (!std::isfinite(w) || (w < 0 && !negative))
      bad(fmt::format("entry '{}': the weight must be a finite number{}", item, negative ? "" : " >= 0"));
    if (!out.emplace(name, w).second) bad(fmt::format("{} '{}' is given twice", what, name));
    at = comma + 1;
  }
  if (!v.empty() && std::all_of(out.begin(), out.end(), [](const auto& kv) { return kv.second == 0; }))
    bad("every weight is 0");
  return out;
}

std::map<std::string, double> domain_weights(const Config& c) {
  return named_weights(c, "data.domain_weights", "domain", false,
                       "e.g. code:0.3,prose:0.7, or leave it empty for the dataset's natural proportions");
}

// run.objective = grpo's and ppo's keys ([rl], [reward]).
RlConfig rl_config(const Config& c, const TrainSpec& s, const ObjectiveTraits& objective) {
  RlConfig rl;
  const bool ppo = objective.objective == Objective::kPpo;
  rl.group_size = c.get<int>("rl.group_size");
  if (!ppo && rl.group_size < 2)
    c.reject("rl.group_size", "must be >= 2: a reply's advantage is its reward against its group's mean");
  if (rl.group_size < 1) c.reject("rl.group_size", "must be >= 1");
  // The value head's keys: PPO's alone.
  const std::tuple<const char*, double*, double> value_keys[] = {
      {"rl.gamma", &rl.ppo.gamma, 1.0},
      {"rl.lambda", &rl.ppo.lambda, 1.0},
      {"rl.value_coef", &rl.ppo.value_coef, 100.0},
      {"rl.value_clip", &rl.ppo.value_clip, 100.0}};
  for (const auto& [key, value, most] : value_keys) {
    const double set = c.get<double>(key);
    if (!ppo && set != *value)
      c.reject(key,
               fmt::format("is a setting of PPO's value head, and run.objective = {} has none: remove it, "
                           "or set run.objective = ppo",
                           objective.name));
    if (!(set >= 0 && set <= most)) c.reject(key, fmt::format("must be in [0, {}]", most));
    *value = set;
  }
  if (rl.ppo.value_clip == 0) c.reject("rl.value_clip", "must be > 0 (how far a value may move an update)");
  if (s.batch % rl.group_size != 0)
    c.reject("rl.group_size",
             fmt::format("must divide data.batch = {}: a prompt's replies are sampled and scored together, "
                         "on one rank",
                         s.batch));
  rl.scale_rewards = c.get<bool>("rl.scale_rewards");
  rl.loss.clip_low = c.get<double>("rl.clip_low");
  if (!(rl.loss.clip_low > 0 && rl.loss.clip_low < 1)) c.reject("rl.clip_low", "must be in (0, 1)");
  rl.loss.clip_high = c.get<double>("rl.clip_high");
  if (!(rl.loss.clip_high > 0 && rl.loss.clip_high <= 10)) c.reject("rl.clip_high", "must be in (0, 10]");
  rl.loss.norm = c.get<std::string>("rl.loss_norm") == "sequence" ? GrpoOptions::Norm::kSequence
                                                                  : GrpoOptions::Norm::kToken;
  rl.loss.kl_coef = c.get<double>("rl.kl_coef");
  if (!(rl.loss.kl_coef >= 0 && rl.loss.kl_coef <= 100)) c.reject("rl.kl_coef", "must be in [0, 100]");
  rl.reference = c.get<std::string>("rl.reference");
  rl.updates_per_rollout = c.get<int>("rl.updates_per_rollout");
  if (rl.updates_per_rollout < 1 || rl.updates_per_rollout > 64)
    c.reject("rl.updates_per_rollout", "must be in [1, 64]");
  rl.loss.on_policy = rl.updates_per_rollout == 1;
  // A rollout's updates run between checkpoints, never across one (a checkpoint holds no rollout).
  if (!rl.between_rollouts(s.steps))
    c.reject("run.steps", fmt::format("must be a multiple of rl.updates_per_rollout = {}: a run ends with "
                                      "the last update of a rollout",
                                      rl.updates_per_rollout));
  rl.max_new_tokens = c.get<int>("rl.max_new_tokens");
  if (rl.max_new_tokens < 1 || rl.max_new_tokens >= s.model.seq_len)
    c.reject("rl.max_new_tokens",
             fmt::format("must be in [1, model.seq_len = {}): a prompt and its reply are one training row",
                         s.model.seq_len));
  rl.temperature = c.get<double>("rl.temperature");
  if (!(rl.temperature > 0 && rl.temperature <= 10))
    c.reject("rl.temperature", "must be in (0, 10]: the replies of a group must differ (greedy ones do not)");
  rl.top_p = c.get<double>("rl.top_p");
  if (!(rl.top_p > 0 && rl.top_p <= 1)) c.reject("rl.top_p", "must be in (0, 1]");
  rl.format_dataset = c.get<std::string>("rl.format_dataset");
  rl.sandbox_parallel = c.get<int>("rl.sandbox_parallel");
  rl.overlap_rewards = c.get<bool>("rl.overlap_rewards");
  if (rl.sandbox_parallel < 0) c.reject("rl.sandbox_parallel", "must be >= 0 (0: run.threads)");
  rl.reward.weights =
      named_weights(c, "reward.weights", "scorer", true, "e.g. exact_match:1,format:0.1,length:-0.05");
  if (rl.reward.weights.empty()) c.reject("reward.weights", "names no scorer: a reward needs at least one");
  for (const auto& [name, weight] : rl.reward.weights)
    if (std::find(std::begin(kRewardScorers), std::end(kRewardScorers), name) == std::end(kRewardScorers))
      c.reject("reward.weights",
               fmt::format("'{}' is not a scorer: use exact_match, code, format or length", name));
  rl.reward.answer = c.get<std::string>("reward.answer");
  return rl;
}

}  // namespace

TraceSteps TraceSteps::window(int64_t done, int64_t steps) const {
  TraceSteps w;
  if (after_start) {
    w.first = std::min(done + 2, steps);
    w.last = std::min(done + 4, steps);
  } else {
    w.first = std::max(first, done + 1);
    w.last = last;
  }
  if (w.first <= done || w.first > w.last) w = {};
  return w;
}

namespace {

// A family's slot values: what every key left at auto (or its numeric "family's" value) takes.
struct Preset {
  Norm norm = Norm::kRmsNorm;
  float norm_eps = 1e-5f;
  Positions positions = Positions::kRotary;
  double rope_theta = 1e6;
  bool qkv_bias = false, qk_norm = false, linear_bias = false, tied = false;
  int window = 0;
  Activation activation = Activation::kSwiglu;
  Ffn ffn = Ffn::kDense;
  bool renormalize = true;
  bool shared_expert = false;  // a shared expert 4 x moe_hidden wide
};

Preset preset(Family f) {
  Preset p;
  switch (f) {
    case Family::kGpt2:
      p = {Norm::kLayerNorm,
           1e-5f,
           Positions::kLearned,
           1e4,
           true,
           false,
           true,
           true,
           0,
           Activation::kGelu,
           Ffn::kDense,
           false,
           false};
      break;
    case Family::kLlama:
      p.rope_theta = 5e5;
      break;
    case Family::kQwen2:
      p.norm_eps = 1e-6f;
      p.qkv_bias = p.tied = true;
      break;
    case Family::kQwen3:
      p.norm_eps = 1e-6f;
      p.qk_norm = true;
      break;
    case Family::kMistral:
      p.window = 4096;
      break;
    case Family::kMixtral:
      p.ffn = Ffn::kMoe;
      break;
    case Family::kQwen2Moe:
      p.norm_eps = 1e-6f;
      p.qkv_bias = true;
      p.ffn = Ffn::kMoe;
      p.renormalize = false;
      p.shared_expert = true;
      break;
  }
  return p;
}

constexpr std::string_view kFamilies[] = {"gpt2",    "llama",   "qwen2",    "qwen3",
                                          "mistral", "mixtral", "qwen2_moe"};

// An on | off | auto key: on or off, else the family's value.
bool switch_key(const Config& c, const std::string& key, bool family_value) {
  const std::string v = c.get<std::string>(key);
  return v == "auto" ? family_value : v == "on";
}

}  // namespace

std::string_view family_name(Family family) {
  return kFamilies[size_t(family)];
}

std::string model_description(const ModelSpec& m) {
  std::string heads = m.kv_heads == m.heads ? fmt::format("{} heads of {}", m.heads, m.head_dim)
                                            : fmt::format("{} heads sharing {} key/value heads of {}",
                                                          m.heads, m.kv_heads, m.head_dim);
  std::string out = fmt::format("{}: {} blocks of {}, {}, {}", family_name(m.family), m.layers, m.d_model,
                                heads, m.norm == Norm::kRmsNorm ? "rmsnorm" : "layernorm");
  out += m.positions == Positions::kRotary ? fmt::format(", rope (theta {:g})", m.rope.theta)
                                           : ", learned positions";
  if (m.qk_norm) out += ", qk-norm";
  if (m.window > 0) out += fmt::format(", window {}", m.window);
  const char* act = m.activation == Activation::kSwiglu ? "swiglu" : "gelu";
  if (m.ffn == Ffn::kMoe)
    out += fmt::format(", {} {} experts of {}, top {}{}", m.experts, act, m.moe_hidden, m.top_k,
                       m.shared_expert_hidden > 0
                           ? fmt::format(" + a shared expert of {}", m.shared_expert_hidden)
                           : std::string());
  else
    out += fmt::format(", {} {}", act, m.ffn_hidden);
  if (m.tied_embeddings) out += ", tied classifier";
  const VisionSpec& v = m.vision;
  if (v.enabled())
    out += fmt::format(
        "; vision: {} blocks of {}, {} heads, {}-pixel patches of {}-pixel pictures ({} tokens), "
        "projector {}",
        v.layers, v.width, v.heads, v.patch, v.image_size, v.tokens(), v.projector_hidden);
  return out;
}

namespace {

// The [vision] keys of a model whose language side is `m` (its d_model, heads, positions, seq_len).
VisionSpec vision_spec(const Config& c, const ModelSpec& m) {
  VisionSpec v;
  v.layers = c.get<int>("vision.layers");
  if (v.layers < 0) c.reject("vision.layers", "must be >= 0 (0: a text-only model)");
  if (v.layers == 0) return v;
  v.image_size = positive<int>(c, "vision.image_size");
  v.patch = positive<int>(c, "vision.patch");
  if (v.image_size % v.patch != 0)
    c.reject("vision.image_size", fmt::format("must be a multiple of vision.patch = {}", v.patch));
  if (v.tokens() > m.seq_len)
    c.reject("vision.image_size", fmt::format("a picture is {} tokens of (image_size / patch)^2, more than "
                                              "model.seq_len = {}: use larger patches or smaller pictures",
                                              v.tokens(), m.seq_len));
  const auto width_key = [&](const std::string& key, int otherwise) {
    const int n = c.get<int>(key);
    if (n < 0) c.reject(key, "must be >= 0 (0: the default)");
    return n == 0 ? otherwise : n;
  };
  v.width = width_key("vision.width", m.d_model);
  v.heads = width_key("vision.heads", m.heads);
  if (v.width % v.heads != 0) c.reject("vision.heads", fmt::format("must divide vision.width = {}", v.width));
  v.mlp_hidden = width_key("vision.mlp_hidden", 4 * v.width);
  v.projector_hidden = width_key("vision.projector_hidden", m.d_model);
  v.norm_eps = static_cast<float>(c.get<double>("vision.norm_eps"));
  if (!(v.norm_eps > 0 && v.norm_eps < 1)) c.reject("vision.norm_eps", "must be in (0, 1)");
  v.post_norm = c.get<bool>("vision.post_norm");
  // A picture's features replace its placeholder tokens' embeddings; a learned position table would have
  // to be added to them again, which the embedding layer does not do.
  if (m.positions != Positions::kRotary)
    c.reject("model.positions",
             "a vision-language model needs rotary positions (rope): set model.positions "
             "= rope or a family that has them");
  return v;
}

// train.freeze of a model `m`.
Freeze freeze_config(const Config& c, const ModelSpec& m) {
  Freeze f;
  const std::string value = c.get<std::string>("train.freeze");
  if (value == "none" || value.empty()) return f;
  for (const std::string& part : split_list(value)) {
    bool* flag = part == "vision"      ? &f.vision
                 : part == "projector" ? &f.projector
                 : part == "lm"        ? &f.lm
                                       : nullptr;
    if (flag == nullptr)
      c.reject("train.freeze",
               fmt::format("'{}' is not a part: none, or a list of vision, projector, lm", part));
    if ((flag == &f.vision || flag == &f.projector) && !m.vision.enabled())
      c.reject("train.freeze",
               fmt::format("the model has no vision tower to freeze the {} of (vision.layers = 0)", part));
    *flag = true;
  }
  if (f.lm && (!m.vision.enabled() || (f.vision && f.projector)))
    c.reject("train.freeze", "leaves nothing to train: keep a part of the model out of it");
  return f;
}

// The [model] keys: the language model.
ModelSpec language_model_spec(const Config& c) {
  ModelSpec m;
  const std::string family = c.get<std::string>("model.family");
  for (size_t i = 0; i < std::size(kFamilies); ++i)
    if (family == kFamilies[i]) m.family = Family(i);
  const Preset f = preset(m.family);
  m.layers = positive<int>(c, "model.layers");
  m.d_model = positive<int>(c, "model.d_model");
  m.heads = positive<int>(c, "model.heads");
  m.vocab = positive<int>(c, "model.vocab");
  m.seq_len = positive<int>(c, "model.seq_len");
  m.max_positions = c.get<int>("model.max_positions");
  if (m.max_positions < 0) c.reject("model.max_positions", "must be >= 0 (0: equal to model.seq_len)");
  if (m.max_positions == 0) m.max_positions = m.seq_len;
  if (m.seq_len > m.max_positions)
    c.reject("model.seq_len", "must not exceed model.max_positions = " + std::to_string(m.max_positions));
  m.kv_heads = c.get<int>("model.kv_heads");
  if (m.kv_heads < 0) c.reject("model.kv_heads", "must be >= 0 (0: model.heads)");
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.heads % m.kv_heads != 0) {
    std::string divisors;
    for (int d = 1; d <= m.heads; ++d)
      if (m.heads % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    c.reject("model.kv_heads", fmt::format("must divide model.heads = {}: one of {}", m.heads, divisors));
  }
  m.head_dim = c.get<int>("model.head_dim");
  if (m.head_dim < 0) c.reject("model.head_dim", "must be >= 0 (0: model.d_model / model.heads)");
  if (m.head_dim == 0) {
    if (m.d_model % m.heads != 0)
      c.reject("model.d_model",
               fmt::format("must be divisible by model.heads = {}, or set model.head_dim", m.heads));
    m.head_dim = m.d_model / m.heads;
  }
  if (m.fused_qkv() && (m.kv_heads != m.heads || m.head_dim * m.heads != m.d_model))
    c.reject(m.kv_heads != m.heads ? "model.kv_heads" : "model.head_dim",
             "the gpt2 family's attention is multi-head with d_model / heads wide heads; grouped-query "
             "attention and other head widths need another family (llama, qwen2, qwen3, mistral, ...)");

  const std::string norm = c.get<std::string>("model.norm");
  m.norm = norm == "auto" ? f.norm : norm == "rmsnorm" ? Norm::kRmsNorm : Norm::kLayerNorm;
  const double eps = c.get<double>("model.norm_eps");
  if (!(eps >= 0 && eps < 1)) c.reject("model.norm_eps", "must be in [0, 1) (0: the family's)");
  m.norm_eps = eps == 0 ? f.norm_eps : float(eps);

  const std::string positions = c.get<std::string>("model.positions");
  m.positions = positions == "auto"   ? f.positions
                : positions == "rope" ? Positions::kRotary
                                      : Positions::kLearned;
  const double theta = c.get<double>("model.rope_theta");
  if (!(theta >= 0)) c.reject("model.rope_theta", "must be > 0 (0: the family's)");
  m.rope.theta = theta == 0 ? f.rope_theta : theta;
  const std::string scaling = c.get<std::string>("model.rope_scaling");
  m.rope.scaling = scaling == "linear"   ? RopeScaling::kLinear
                   : scaling == "llama3" ? RopeScaling::kLlama3
                   : scaling == "yarn"   ? RopeScaling::kYarn
                                         : RopeScaling::kNone;
  m.rope.factor = c.get<double>("model.rope_factor");
  m.rope.low_freq_factor = c.get<double>("model.rope_low_freq_factor");
  m.rope.high_freq_factor = c.get<double>("model.rope_high_freq_factor");
  m.rope.original_positions = c.get<int>("model.rope_original_positions");
  m.rope.beta_fast = c.get<double>("model.rope_beta_fast");
  m.rope.beta_slow = c.get<double>("model.rope_beta_slow");
  if (m.positions == Positions::kRotary) {
    if (m.head_dim % 2 != 0)
      c.reject("model.head_dim",
               fmt::format("is {}, but rotary positions turn pairs of a head's dimensions: use an even "
                           "head width (model.head_dim, or d_model / heads)",
                           m.head_dim));
    if (m.rope.scaling != RopeScaling::kNone && !(m.rope.factor >= 1))
      c.reject("model.rope_factor", "must be >= 1");
    if (m.rope.scaling == RopeScaling::kLlama3 &&
        !(m.rope.high_freq_factor > m.rope.low_freq_factor && m.rope.low_freq_factor > 0))
      c.reject("model.rope_high_freq_factor", "must exceed model.rope_low_freq_factor, which must be > 0");
    if (m.rope.original_positions < 1) c.reject("model.rope_original_positions", "must be >= 1");
  }
  m.qkv_bias = switch_key(c, "model.qkv_bias", f.qkv_bias);
  m.qk_norm = switch_key(c, "model.qk_norm", f.qk_norm);
  m.linear_bias = switch_key(c, "model.linear_bias", f.linear_bias);
  if (m.fused_qkv() && m.qkv_bias != m.linear_bias)
    c.reject("model.qkv_bias",
             "the gpt2 family has biases on all of its products or none: set "
             "model.linear_bias alike");
  m.window = c.get<int>("model.window");
  if (m.window < -1) c.reject("model.window", "must be >= 0 (0: every earlier key; -1: the family's)");
  if (m.window == -1) m.window = f.window;
  m.tied_embeddings = switch_key(c, "model.tied_embeddings", f.tied);

  const std::string activation = c.get<std::string>("model.activation");
  m.activation = activation == "auto"     ? f.activation
                 : activation == "swiglu" ? Activation::kSwiglu
                                          : Activation::kGelu;
  m.ffn_hidden = c.get<int>("model.ffn_hidden");
  if (m.ffn_hidden < 0) c.reject("model.ffn_hidden", "must be >= 0 (0: the activation's default)");
  if (m.ffn_hidden == 0)  // SwiGLU's three matrices hold as many weights as GELU's two at 8/3 the width
    m.ffn_hidden = m.activation == Activation::kGelu ? 4 * m.d_model : (8 * m.d_model / 3 + 63) / 64 * 64;

  const std::string ffn = c.get<std::string>("model.ffn");
  m.ffn = ffn == "auto" ? f.ffn : ffn == "moe" ? Ffn::kMoe : Ffn::kDense;
  m.experts = c.get<int>("model.experts");
  m.top_k = c.get<int>("model.top_k");
  m.moe_every = c.get<int>("model.moe_every");
  m.capacity_factor = c.get<double>("model.capacity_factor");
  m.router_aux_coef = c.get<double>("model.router_aux_coef");
  m.router_z_coef = c.get<double>("model.router_z_coef");
  if (m.ffn == Ffn::kDense) {
    if (m.experts != 0) c.reject("model.experts", "is set but model.ffn = dense: set model.ffn = moe");
    return m;
  }
  if (m.experts < 2) c.reject("model.experts", "model.ffn = moe needs at least 2 experts");
  if (m.top_k < 1 || m.top_k > m.experts)
    c.reject("model.top_k", fmt::format("must be from 1 to model.experts = {}", m.experts));
  if (m.moe_every < 1 || m.moe_every > m.layers)
    c.reject("model.moe_every", fmt::format("must be from 1 to model.layers = {}", m.layers));
  if (!(m.capacity_factor >= 0)) c.reject("model.capacity_factor", "must be >= 0 (0: dropless)");
  if (!(m.router_aux_coef >= 0)) c.reject("model.router_aux_coef", "must be >= 0");
  if (!(m.router_z_coef >= 0)) c.reject("model.router_z_coef", "must be >= 0");
  m.moe_hidden = c.get<int>("model.moe_hidden");
  if (m.moe_hidden < 0) c.reject("model.moe_hidden", "must be >= 0 (0: model.ffn_hidden)");
  if (m.moe_hidden == 0) m.moe_hidden = m.ffn_hidden;
  m.router_renormalize = switch_key(c, "model.router_renormalize", f.renormalize);
  m.shared_expert_hidden = c.get<int>("model.shared_expert_hidden");
  if (m.shared_expert_hidden < -1)
    c.reject("model.shared_expert_hidden", "must be >= 0 (0: none; -1: the family's)");
  if (m.shared_expert_hidden == -1) m.shared_expert_hidden = f.shared_expert ? 4 * m.moe_hidden : 0;
  if (m.shared_expert_hidden > 0 && m.activation != Activation::kSwiglu)
    c.reject("model.shared_expert_hidden",
             "a shared expert is a SwiGLU expert: set model.activation = swiglu");
  return m;
}

}  // namespace

ModelSpec model_spec(const Config& c) {
  ModelSpec m = language_model_spec(c);
  m.vision = vision_spec(c, m);
  m.value_head = c.get<std::string>("model.value_head") == "on";
  return m;
}

ModelSpec model_spec(const std::vector<std::string>& overrides) {
  ConfigSchema schema;
  add_trainer_keys(schema);
  return model_spec(load_config(schema, "", overrides));
}

ModelSpec gpt2_spec(int layers, int d_model, int heads, int vocab, int seq_len, int max_positions) {
  return model_spec({fmt::format("--model.layers={}", layers), fmt::format("--model.d_model={}", d_model),
                     fmt::format("--model.heads={}", heads), fmt::format("--model.vocab={}", vocab),
                     fmt::format("--model.seq_len={}", seq_len),
                     fmt::format("--model.max_positions={}", max_positions)});
}

OptimConfig optim_config(const Config& c) {
  OptimConfig o;
  o.lr = c.get<double>("optim.lr");
  o.min_lr = c.get<double>("optim.min_lr");
  o.warmup_steps = c.get<int64_t>("optim.warmup_steps");
  o.weight_decay = c.get<double>("optim.weight_decay");
  o.beta1 = c.get<double>("optim.beta1");
  o.beta2 = c.get<double>("optim.beta2");
  o.eps = c.get<double>("optim.eps");
  o.grad_clip = c.get<double>("optim.grad_clip");
  if (!(o.lr > 0)) c.reject("optim.lr", "must be > 0");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr)) c.reject("optim.min_lr", "must be in [0, optim.lr]");
  if (o.warmup_steps < 0) c.reject("optim.warmup_steps", "must be >= 0");
  if (!(o.weight_decay >= 0)) c.reject("optim.weight_decay", "must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) c.reject("optim.beta1", "must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) c.reject("optim.beta2", "must be in [0, 1)");
  if (!(o.eps > 0)) c.reject("optim.eps", "must be > 0");
  if (!(o.grad_clip >= 0)) c.reject("optim.grad_clip", "must be >= 0 (0: no clipping)");
  return o;
}

TrainSpec train_spec(const Config& c) {
  TrainSpec s;
  s.name = c.get<std::string>("run.name");
  s.dir = c.get<std::string>("run.dir");
  if (s.name.empty()) c.reject("run.name", "must not be empty");
  if (s.dir.empty()) c.reject("run.dir", "must not be empty");
  s.steps = positive<int64_t>(c, "run.steps");
  s.seed = uint64_t(c.get<int64_t>("run.seed"));
  const int threads = c.get<int>("run.threads");
  if (threads < 0) c.reject("run.threads", "must be >= 0 (0: SLURM_CPUS_PER_TASK, else all cores)");
  s.peak_gflops = c.get<double>("run.peak_gflops");
  if (!(s.peak_gflops >= 0)) c.reject("run.peak_gflops", "must be >= 0 (0: measure at start)");
  s.memory_cap_gib = c.get<double>("run.memory_per_rank_gib");
  if (!(s.memory_cap_gib >= 0)) c.reject("run.memory_per_rank_gib", "must be >= 0 (0: no cap)");
  s.trace = trace_steps(c, s.steps);
  s.model = model_spec(c);
  const std::string recompute = c.get<std::string>("model.recompute");
  s.recompute.kind = recompute == "full"        ? Recompute::Kind::kFull
                     : recompute == "selective" ? Recompute::Kind::kSelective
                                                : Recompute::Kind::kNone;
  s.recompute.every = c.get<int>("model.recompute_every");
  if (s.recompute.every < 1) c.reject("model.recompute_every", "must be >= 1");
  if (s.recompute.kind == Recompute::Kind::kFull && s.model.ffn == Ffn::kMoe)
    c.reject("model.recompute",
             "full recompute would route an MoE block's tokens twice (its router statistics and "
             "capacity drops would count again): use selective with model.ffn = moe");
  s.optim = optim_config(c);
  s.dataset = c.get<std::string>("data.dataset");
  s.batch = positive<int>(c, "data.batch");
  s.data_order = c.get<std::string>("data.order");
  if (s.data_order != "block" && s.data_order != "global") c.reject("data.order", "must be block or global");
  s.domain_weights = domain_weights(c);
  s.cache_dir = c.get<std::string>("data.cache_dir");
  const int64_t cache_max = c.get<int64_t>("data.cache_max_bytes");
  if (cache_max < 0) c.reject("data.cache_max_bytes", "must be >= 0 (0: leave 10% of the filesystem free)");
  s.cache_max_bytes = uint64_t(cache_max);
  const ObjectiveTraits& objective = *find_objective(c.get<std::string>("run.objective"));  // a choice
  s.objective = objective.objective;
  // Fine-tuning packs conversations with their boundaries always: a reply attends to its own prompt only.
  s.document_mask = c.get<bool>("data.document_mask") || objective.scored == Scored::kReplies;
  s.dpo.beta = c.get<double>("dpo.beta");
  if (!(s.dpo.beta > 0 && s.dpo.beta <= 100)) c.reject("dpo.beta", "must be in (0, 100]");
  s.dpo.label_smoothing = c.get<double>("dpo.label_smoothing");
  if (!(s.dpo.label_smoothing >= 0 && s.dpo.label_smoothing < 0.5))
    c.reject("dpo.label_smoothing", "must be in [0, 0.5)");
  s.dpo.reference = c.get<std::string>("dpo.reference");  // empty: the launcher takes ckpt.init_from
  s.dpo.live = c.get<std::string>("dpo.reference_mode") == "live";
  s.distill.teacher = c.get<std::string>("distill.teacher");
  if (objective.companion == Companion::kTeacher && s.distill.teacher.empty())
    c.reject("distill.teacher", "run.objective = distill needs the teacher's checkpoint directory");
  s.distill.alpha = c.get<double>("distill.alpha");
  if (!(s.distill.alpha >= 0 && s.distill.alpha <= 1)) c.reject("distill.alpha", "must be in [0, 1]");
  s.distill.temperature = c.get<double>("distill.temperature");
  if (!(s.distill.temperature >= 0.05 && s.distill.temperature <= 100))
    c.reject("distill.temperature", "must be in [0.05, 100]");
  if (objective.rollouts) s.rl = rl_config(c, s, objective);
  // PPO's critic is a head of the policy (PpoLoss); no other objective trains one.
  const std::string value_head = c.get<std::string>("model.value_head");
  if (objective.objective == Objective::kPpo && value_head == "off")
    c.reject("model.value_head",
             "is off, but run.objective = ppo learns its advantages' baseline with a value head: leave it at "
             "auto");
  if (objective.objective != Objective::kPpo && value_head == "on")
    c.reject("model.value_head",
             fmt::format("is on, but only run.objective = ppo trains a value head, not {}: leave it at auto",
                         objective.name));
  s.model.value_head = objective.objective == Objective::kPpo;
  const std::string device = c.get<std::string>("run.device"), comm = c.get<std::string>("parallel.comm");
  s.device = device == "cuda" ? Device::kCuda : device == "cpu" ? Device::kCpu : Device::kAuto;
  s.parallel.comm = comm == "nccl" ? CommKind::kNccl : comm == "mpi" ? CommKind::kMpi : CommKind::kAuto;
  if (s.device == Device::kCpu && s.parallel.comm == CommKind::kNccl)
    c.reject("parallel.comm", "nccl moves GPU memory; run.device = cpu needs mpi (or auto)");
  const std::string dtype = c.get<std::string>("precision.dtype");
  s.dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  s.dtype_auto = dtype == "auto";
  s.layout.tp = positive<int>(c, "parallel.tp");
  s.layout.cp = positive<int>(c, "parallel.cp");
  s.layout.ep = positive<int>(c, "parallel.ep");
  s.layout.pp = positive<int>(c, "parallel.pp");
  s.layout.dp = positive<int>(c, "parallel.dp");
  // The limits of the --train-layout spelling (forge/common/layout.h), through its parser; the message
  // names the dimension, the key is the first one out of range (else the product is too large).
  if (std::string why; !parse_layout(s.layout.str(), &why)) {
    std::string key = "parallel.dp";
    for (const char* k : {"parallel.tp", "parallel.cp", "parallel.ep", "parallel.dp", "parallel.pp"})
      if (c.get<int>(k) > 65536) {
        key = k;
        break;
      }
    c.reject(key, why);
  }
  s.parallel.zero = c.get<int>("parallel.zero");
  s.parallel.prefetch = c.get<bool>("parallel.prefetch");
  if (const std::string group = c.get<std::string>("parallel.zero_group"); group == "node")
    s.parallel.shard_within_node = true;
  else if (group != "dp")
    c.reject("parallel.zero_group", "expected dp or node");
  if (s.parallel.shard_within_node && s.parallel.zero < 1)
    c.reject("parallel.zero_group",
             "node shards the optimizer state (and more) within each node, but parallel.zero is 0: set "
             "parallel.zero = 1, 2 or 3, or leave parallel.zero_group at dp");
  s.parallel.reduce_each_microbatch = c.get<bool>("parallel.reduce_each_microbatch");
  if (s.parallel.reduce_each_microbatch && s.parallel.zero < 2)
    c.reject("parallel.reduce_each_microbatch",
             fmt::format("reduces each micro-batch's gradient shards under ZeRO-2 or 3; parallel.zero is {}: "
                         "set parallel.zero = 2 or 3, or leave it off",
                         s.parallel.zero));
  s.microbatches = positive<int>(c, "parallel.microbatches");
  s.parallel.elastic = c.get<bool>("parallel.elastic");
  const std::string stages = c.get<std::string>("parallel.stage_layers");
  for (size_t at = 0; at < stages.size();) {
    const size_t comma = std::min(stages.find(',', at), stages.size());
    const std::string item = stages.substr(at, comma - at);
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 0 || n > 1 << 20)
      c.reject("parallel.stage_layers", "expected a comma-separated list of block counts, e.g. 3,5");
    s.parallel.stage_layers.push_back(int(n));
    at = comma + 1;
  }
  const std::string schedule = c.get<std::string>("parallel.pp_schedule");
  const auto* kind =
      std::ranges::find_if(kPipeSchedules, [&](auto k) { return schedule_name(k) == schedule; });
  if (kind == std::end(kPipeSchedules))
    c.reject("parallel.pp_schedule", "expected 1f1b, interleaved or zb-h1");
  s.parallel.pp_schedule = *kind;
  const bool interleaved = *kind == PipeScheduleKind::kInterleaved;
  const int chunks = c.get<int>("parallel.pp_virtual");
  if (chunks < 0) c.reject("parallel.pp_virtual", "must be >= 0 (0: 2 under interleaved, 1 otherwise)");
  s.parallel.pp_virtual = chunks > 0 ? chunks : interleaved ? 2 : 1;
  if (const auto problem = parallel_problem(s.model, s.layout, s.parallel, s.microbatches))
    c.reject(problem->key, problem->why);
  if (interleaved && objective.rollouts)
    c.reject("parallel.pp_schedule",
             fmt::format("run.objective = {} decodes its rollouts stage by stage, which interleaved model "
                         "chunks do not do yet: use 1f1b or zb-h1",
                         objective.name));
  if (*kind != PipeScheduleKind::k1F1B && s.parallel.reduce_each_microbatch)
    c.reject(
        "parallel.reduce_each_microbatch",
        fmt::format("reduces each micro-batch's gradients as its one backward ends, which {} does not "
                    "have (its model chunks' or weight-gradient passes come apart): leave it off, or use "
                    "parallel.pp_schedule = 1f1b",
                    schedule));
  if (const std::string cp_comm = c.get<std::string>("parallel.cp_comm"); cp_comm == "a2a")
    s.parallel.cp_comm = ContextComm::kAllToAll;
  else if (cp_comm != "ring")
    c.reject("parallel.cp_comm", "expected ring or a2a");
  if (s.parallel.cp_comm == ContextComm::kAllToAll && s.layout.cp > 1) {
    const int heads = s.model.heads / s.layout.tp, kv = std::max(1, s.model.kv_heads / s.layout.tp);
    if (heads % s.layout.cp != 0 || kv % s.layout.cp != 0)
      c.reject("parallel.cp_comm",
               fmt::format("a2a gives each cp rank 1/cp of a rank's heads, but its {} query and {} key/value "
                           "heads do not divide by cp = {}: use ring, or a cp that divides both",
                           heads, kv, s.layout.cp));
  }
  if (s.layout.cp > 1) {
    if (!objective.splits_over_context)
      c.reject("parallel.cp",
               fmt::format("context parallelism does not split the rows of run.objective = {} yet (its "
                           "rollouts generate whole rows): it must be 1",
                           objective.name));
  }
  s.parallel.sequence_parallel = c.get<bool>("parallel.sequence_parallel");
  if (s.parallel.sequence_parallel && s.layout.tp > 1) {
    const int rows = s.batch * s.model.seq_len / s.layout.cp, unit = s.layout.tp * kNormChunkRows;
    if (s.model.ffn == Ffn::kMoe)
      c.reject("parallel.sequence_parallel",
               "sequence parallelism does not cut the rows of MoE blocks yet: it must be false for "
               "model.ffn = moe");
    if (rows % unit != 0)
      c.reject(
          "parallel.sequence_parallel",
          fmt::format("cuts a micro-batch's {} rows (data.batch x model.seq_len / parallel.cp) into tp = "
                      "{} pieces of whole {}-row chunks, so they must be a multiple of {}: change "
                      "data.batch or model.seq_len, or set it to false",
                      rows, s.layout.tp, kNormChunkRows, unit));
  }
  // The rollouts generate on the training ranks (generate.h's Generator): a tensor-parallel share of each
  // layer, the ranks of a tp group sampling in step from the same gathered logits; the stages of a pipeline
  // in turn, each sampling from the last stage's logits; an expert-parallel group's ranks, which sample
  // other prompts, decoding in step while one of them has rows (GPT::decoding).
  if (objective.rollouts) {
    if (s.parallel.sequence_parallel && s.layout.tp > 1)
      c.reject("parallel.sequence_parallel",
               fmt::format("run.objective = {} decodes a few rows at a time, which sequence parallelism does "
                           "not cut: set it to false",
                           objective.name));
  }
  // The vision tower (vision.h) runs in FP32 on the first pipeline stage, its products split over tp, for
  // now without context or sequence parallelism (its rows are every picture's, on every rank).
  if (s.model.vision.enabled()) {
    if (s.layout.cp > 1)
      c.reject("parallel.cp",
               "a vision-language model trains without context parallelism for now: it must be 1 (scale out "
               "with parallel.dp, parallel.tp or parallel.pp)");
    if (s.parallel.sequence_parallel && s.layout.tp > 1)
      c.reject("parallel.sequence_parallel",
               "a vision-language model trains without sequence parallelism for now: set it to false");
    if (s.dtype == DType::kBF16)
      c.reject("precision.dtype", "a vision-language model trains in fp32 for now: set fp32 or auto");
  }
  s.freeze = freeze_config(c, s.model);
  s.guard = guard_config(c);
  if (s.guard.inject_dead_layer >= 0 &&
      (!s.model.moe_block(s.guard.inject_dead_layer) || s.guard.inject_dead_layer >= s.model.layers ||
       s.guard.inject_dead_expert >= s.model.experts))
    c.reject("guard.inject_dead_expert", "names no expert of an MoE block of this model");
  s.threads = resolve_threads(threads);
  return s;
}

bool Freeze::frozen(std::string_view param) const {
  switch (model_part(param)) {
    case ModelPart::kVision:
      return vision;
    case ModelPart::kProjector:
      return projector;
    case ModelPart::kLm:
      return lm;
  }
  return lm;
}

std::function<bool(std::string_view)> Freeze::predicate() const {
  if (!any()) return nullptr;
  return [freeze = *this](std::string_view param) { return freeze.frozen(param); };
}

std::shared_ptr<const Loss> objective_loss(const TrainSpec& spec, std::shared_ptr<GPT> teacher) {
  return traits(spec.objective).make_loss(spec, std::move(teacher));
}

std::string_view device_name(Device device) {
  return device == Device::kCuda ? "cuda" : device == Device::kCpu ? "cpu" : "auto";
}

std::string_view dtype_name(DType dtype) {
  return dtype == DType::kBF16 ? "bf16" : "fp32";
}

std::string_view comm_name(CommKind comm) {
  return comm == CommKind::kNccl ? "nccl" : comm == CommKind::kMpi ? "mpi" : "auto";
}

void resolve_device(TrainSpec& spec, int visible_gpus, const std::string& no_gpu) {
  if (spec.device == Device::kCuda && visible_gpus <= 0)
    fail(ExitCode::kUsage,
         "run.device = cuda, but {}; request GPUs for the job (--gpus-per-task=1) or set run.device = cpu "
         "or auto",
         no_gpu);
  if (spec.device == Device::kAuto) spec.device = visible_gpus > 0 ? Device::kCuda : Device::kCpu;
  const bool cuda = spec.device == Device::kCuda;
  if (!cuda && spec.parallel.comm == CommKind::kNccl)
    fail(ExitCode::kUsage,
         "parallel.comm = nccl, but run.device = auto chose cpu (no GPU visible, or no CUDA build); set "
         "parallel.comm = mpi or auto, or run.device = cuda");
  if (spec.parallel.comm == CommKind::kAuto) spec.parallel.comm = cuda ? CommKind::kNccl : CommKind::kMpi;
  if (cuda && spec.model.vision.enabled())
    fail(ExitCode::kUsage,
         "vision.layers = {}: the vision tower's bidirectional attention has no CUDA kernel yet; set "
         "run.device = cpu",
         spec.model.vision.layers);
  if (spec.dtype_auto) {
    spec.dtype = cuda ? DType::kBF16 : DType::kF32;
    spec.dtype_auto = false;
  }
}

TrainSpec elastic_spec(const TrainSpec& spec, int ranks) {
  const Layout& full = spec.layout;
  const int replica = full.tp * full.cp * full.pp;
  // The global batch is dp x microbatches micro-batches of data.batch sequences: any dp that divides
  // their count keeps it, with the micro-batches that make up the rest.
  const int count = full.dp * spec.microbatches;
  int dp = std::min(full.dp, ranks / replica);
  // Expert groups are carved out of dp; the interleaved schedule takes micro-batches in groups of pp.
  const auto keeps = [&](int dp) {
    return count % dp == 0 && dp % full.ep == 0 &&
           (spec.parallel.pp_schedule != PipeScheduleKind::kInterleaved || count / dp % full.pp == 0);
  };
  while (dp > 0 && !keeps(dp)) --dp;
  if (dp < 1)
    fail(ExitCode::kUsage,
         "parallel.elastic: {} ranks cannot hold one model replica of tp*cp*pp = {} ranks ({}); submit with "
         "at least {} tasks",
         ranks, replica, full.str(), replica);
  TrainSpec out = spec;
  out.layout.dp = dp;
  out.microbatches = count / dp;
  return out;
}

std::optional<LayoutProblem> parallel_problem(const ModelSpec& m, const Layout& l, const ParallelConfig& p,
                                              int microbatches) {
  if (auto problem = layout_problem(l, m.dims())) return problem;
  const auto problem = [](std::string key, std::string why) {
    return std::optional<LayoutProblem>(LayoutProblem{std::move(key), std::move(why)});
  };
  if (p.zero < 0 || p.zero > 3) return problem("parallel.zero", "must be 0, 1, 2 or 3");
  if (l.cp > 1 && m.ffn == Ffn::kMoe && m.capacity_factor > 0)
    return problem(
        "model.capacity_factor",
        fmt::format("an expert's capacity is counted over a rank's tokens, and context parallelism "
                    "gives each rank 1/cp of them, so cp = {} would drop other tokens than one rank: "
                    "use 0 (dropless) with parallel.cp > 1",
                    l.cp));
  // Column-parallel products split their hidden width (gate and up each, under SwiGLU).
  for (const auto& [key, width] :
       {std::pair<const char*, int>{"model.ffn_hidden", m.dense_blocks() ? m.ffn_hidden : 0},
        {"model.shared_expert_hidden", m.shared_expert_hidden}})
    if (width % l.tp != 0)
      return problem("parallel.tp", fmt::format("must divide {} = {} (each rank holds a share of the FFN's "
                                                "hidden units)",
                                                key, width));
  // The vision tower splits as a block does: its heads, its MLP's and the projector's hidden units.
  if (m.vision.enabled())
    for (const auto& [key, width] : {std::pair<const char*, int>{"vision.heads", m.vision.heads},
                                     {"vision.mlp_hidden", m.vision.mlp_hidden},
                                     {"vision.projector_hidden", m.vision.projector_hidden}})
      if (width % l.tp != 0)
        return problem(
            "parallel.tp",
            fmt::format("must divide {} = {} (each rank holds a share of the vision "
                        "tower's {})",
                        key, width, key == std::string_view("vision.heads") ? "heads" : "hidden units"));
  if (p.pp_virtual < 1) return problem("parallel.pp_virtual", "must be >= 1");
  if (p.pp_schedule != PipeScheduleKind::kInterleaved && p.pp_virtual > 1)
    return problem(
        "parallel.pp_virtual",
        fmt::format("splits each stage into model chunks for parallel.pp_schedule = interleaved, but the "
                    "schedule is {}: leave it at 0",
                    schedule_name(p.pp_schedule)));
  if (p.pp_schedule == PipeScheduleKind::kInterleaved) {
    if (l.pp < 2)
      return problem("parallel.pp_schedule",
                     "interleaved runs model chunks across pipeline stages, but parallel.pp is 1: set "
                     "parallel.pp >= 2, or use 1f1b");
    if (p.pp_virtual < 2)
      return problem("parallel.pp_virtual", "interleaved needs >= 2 model chunks a stage (1 is 1f1b)");
    if (!p.stage_layers.empty())
      return problem("parallel.stage_layers",
                     "interleaved splits the blocks into equal model chunks: leave it empty, or use 1f1b");
    if (m.layers % (l.pp * p.pp_virtual) != 0)
      return problem(
          "parallel.pp_virtual",
          fmt::format("does not divide the blocks of each stage: model.layers = {} must split into "
                      "parallel.pp x parallel.pp_virtual = {} equal model chunks",
                      m.layers, l.pp * p.pp_virtual));
    if (microbatches % l.pp != 0)
      return problem("parallel.microbatches",
                     fmt::format("the interleaved schedule sends micro-batches through in groups of "
                                 "parallel.pp = {}, so it must be a multiple of {}",
                                 l.pp, l.pp));
  }
  if (!p.stage_layers.empty()) {
    int total = 0;
    for (int n : p.stage_layers) {
      if (n < 1) return problem("parallel.stage_layers", "every stage needs at least one block");
      total += n;
    }
    if (int(p.stage_layers.size()) != l.pp)
      return problem("parallel.stage_layers",
                     fmt::format("lists {} stages but parallel.pp is {}", p.stage_layers.size(), l.pp));
    if (total != m.layers)
      return problem("parallel.stage_layers",
                     fmt::format("adds up to {} blocks but model.layers is {}", total, m.layers));
  }
  return std::nullopt;
}

namespace {

// The tasks of this step on node `node` from SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2 on each of the first
// three nodes, 1 on the fourth); 0 when it does not say.
long step_tasks_on_node(const char* spec, long node) {
  std::istringstream in(spec);
  for (std::string entry; std::getline(in, entry, ',');) {
    long tasks = 0, repeat = 1;
    if (std::sscanf(entry.c_str(), "%ld(x%ld)", &tasks, &repeat) < 1 || tasks < 1 || repeat < 1) return 0;
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return 0;
}

}  // namespace

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("SLURM_CPUS_PER_TASK")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0) return int(n);
    fail(ExitCode::kUsage, "SLURM_CPUS_PER_TASK = '{}' is not a positive integer; set run.threads", env);
  }
  // A Slurm step without --cpus-per-task: the CPUs Slurm gave this node, shared by the step's tasks on
  // it. Not the machine's cores: tasks each spinning up a team of all of them oversubscribe the node, and
  // OpenMP's waiting threads then take turns with the working ones.
  const char *cpus = std::getenv("SLURM_CPUS_ON_NODE"), *tasks = std::getenv("SLURM_STEP_TASKS_PER_NODE"),
             *node = std::getenv("SLURM_NODEID");
  if (cpus != nullptr && tasks != nullptr) {
    const long on_node = step_tasks_on_node(tasks, node != nullptr ? std::atol(node) : 0);
    if (on_node > 0) return int(std::max(1L, std::atol(cpus) / on_node));
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? int(hw) : 1;
}

}  // namespace forge::trainer
