// The loss seam (docs/ARCHITECTURE.md, "The loss"): an objective computed from the classifier's logits
// chunk by chunk of positions, and normalised by the GLOBAL number of scored tokens — the sum of the loss
// weights over every micro-batch of the step and every data-parallel rank — not by a mean of per-batch
// means. Weighted language-model cross-entropy is the first objective; preference and distillation
// objectives implement the same interface.
#pragma once

#include "forge/trainer/backend.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace forge {
struct MicroBatch;
}

namespace forge::trainer {

class GPT;

// What a loss adds up: the weighted sum of per-token losses and the weight that normalises it. A step's
// loss is the sum of `loss` over its micro-batches and data-parallel ranks divided by the sum of `weight`.
struct LossSums {
  double loss = 0, weight = 0;
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss;
    weight += o.weight;
    return *this;
  }
};

// A micro-batch (forge/common/batch.h) in a backend's memory: what the layers and the loss read. An
// optional field is null when the batch leaves it at its default; doc_start (derived from the segments)
// is the first position of each position's document, what attention needs.
struct DeviceBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  const float* weights = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* doc_start = nullptr;
  const MicroBatch* host = nullptr;  // the batch as the reader made it (sequence losses read it on the host)
  // For a loss that reads the value head (Loss::values), host memory, one per position: the head's
  // estimates, and where sequences() writes the gradient of the loss sum for them (zeroed before).
  const float* values = nullptr;
  float* dvalues = nullptr;
};

// The ranks that share out each row's positions (context parallelism, context_parallel.h): a loss of whole
// sequences sums its per-row figures over them, and every one of them then knows the rows' whole loss.
class RowGroup {
 public:
  virtual ~RowGroup() = default;
  virtual int size() const = 0;
  // In place, host memory: the sum over the group.
  virtual void sum(double* values, size_t count) = 0;
};

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  // Called once per micro-batch before its chunks (distillation runs its teacher here).
  virtual void begin(const DeviceBatch&) const {}
  // The micro-batch's share of the step's normaliser: its scored weight (per-token losses), or its pairs.
  virtual double weight(const MicroBatch& batch) const;
  // The summed loss of positions [row0, row0 + rows) of the batch from their logits [rows, V] (this rank's
  // vocabulary shard, columns from vocab_begin, combined across the shards through `group` when not null).
  // When `backward`, the logits are replaced by the gradient of scale x that sum.
  virtual double chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows, int V,
                       int vocab_begin, float scale, bool backward, VocabGroup* group) const = 0;

  // A loss of whole sequences (DPO) needs the log-probability of every target before any gradient: the
  // classifier then runs twice over the chunks, first for the targets' negative log-likelihoods `nll`
  // (one per position, 0 where not scored), which `sequences` turns into the loss sum and each position's
  // gradient weight `coeff` (dL/dlogits = coeff x (softmax - onehot(target))); then with those weights.
  // Under context parallelism `rows` (else null) holds the rest of each row: the loss sums its per-row
  // figures over it, and the whole rows' loss and figures come out on every one of its ranks (the trainer
  // counts one rank's, and weighs the step by whole rows).
  virtual bool per_sequence() const { return false; }
  virtual double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const;
  // Whether sequences() reads the model's value head (DeviceBatch::values; PPO): the model then forms the
  // estimates before and backpropagates their gradient after.
  virtual bool values() const { return false; }
  // The loss's own figures summed over what it saw since the last call (DPO: rewards, margin, accuracy per
  // pair), in a fixed order; the trainer sums them over the ranks and divides by the step's weight.
  virtual std::vector<std::pair<std::string, double>> take_metrics() const { return {}; }
  // Its figures that are maxima (the same rules, the largest over the ranks, not divided).
  virtual std::vector<std::pair<std::string, double>> take_maxima() const { return {}; }
};

// Cross-entropy of every target, weighted by the batch's loss weights (pretraining: all 1).
class LmCrossEntropy final : public Loss {
 public:
  std::string name() const override { return "lm"; }
  double chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows, int V,
               int vocab_begin, float scale, bool backward, VocabGroup* group) const override;
};

// Per row of a batch of preference pairs, from the targets' negative log-likelihoods `nll` (one per
// position): the summed log-probability of the chosen reply (document 0) and of the rejected one
// (document 1) over their scored tokens, as out[2r] and out[2r + 1].
void reply_logps(const MicroBatch& batch, const float* nll, std::vector<double>& out);

// The reference model's side of DPO: a sequence "loss" of 0 that keeps the reply log-probabilities of the
// last batch it saw (`last`), which the reference pass stores for the run.
class ReplyLogps final : public Loss {
 public:
  std::string name() const override { return "reply-logps"; }
  double weight(const MicroBatch& batch) const override;
  double chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
               VocabGroup*) const override;
  bool per_sequence() const override { return true; }
  double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const override;
  const std::vector<double>& last() const { return last_; }

 private:
  mutable std::vector<double> last_;
};

// Direct preference optimisation (Rafailov et al., 2023) on batches of pairs (MicroBatch::reference_logps;
// row r: chosen conversation as document 0, rejected as document 1). Per pair, with log-probabilities
// summed over each reply's scored tokens, z = beta x ((logp(chosen) - ref(chosen)) - (logp(rejected) -
// ref(rejected))) and loss = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z) (eps: label smoothing,
// "conservative" DPO); normalised by the number of pairs of the step. Metrics: the implicit rewards
// beta x (logp - ref) of both replies, their margin and the share of pairs it ranks right.
class DpoLoss final : public Loss {
 public:
  DpoLoss(double beta, double label_smoothing) : beta_(beta), smoothing_(label_smoothing) {}
  std::string name() const override { return "dpo"; }
  double weight(const MicroBatch& batch) const override;
  double chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
               VocabGroup*) const override;
  bool per_sequence() const override { return true; }
  double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const override;
  std::vector<std::pair<std::string, double>> take_metrics() const override;

 private:
  double beta_, smoothing_;
  mutable std::mutex mu_;  // the sums below; a step runs its micro-batches one after another
  mutable double chosen_ = 0, rejected_ = 0, margin_ = 0, correct_ = 0;
};

// The log-probability of every position's target (0 where not scored), kept from the last batch it saw
// (`last`): a sequence "loss" of 0 that records what a rollout's tokens had under the weights that ran it
// (MicroBatch::old_logps) or under a frozen reference (ref_logps). With `values`, also the value head's
// estimates (`last_values`: MicroBatch::old_values).
class TokenLogps final : public Loss {
 public:
  explicit TokenLogps(bool values = false) : values_(values) {}
  std::string name() const override { return "token-logps"; }
  bool values() const override { return values_; }
  const std::vector<float>& last_values() const { return last_values_; }
  double chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
               VocabGroup*) const override;
  bool per_sequence() const override { return true; }
  double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const override;
  const std::vector<float>& last() const { return last_; }

 private:
  bool values_;
  mutable std::vector<float> last_, last_values_;
};

// GRPO's advantages (Shao et al., 2024): each group of `group_size` consecutive rewards minus the group's
// mean, divided by the group's standard deviation (unbiased) + 1e-4 when `scale`. A group of equal rewards
// gets 0: it carries no signal. Throws std::invalid_argument unless group_size >= 2 divides the count.
std::vector<float> grpo_advantages(std::span<const float> rewards, int group_size, bool scale);

// Group relative policy optimisation on a batch of sampled replies (MicroBatch::advantages, old_logps,
// ref_logps). Per scored token t of reply r, with ratio = exp(logp - old):
//   -min(ratio A_r, clip(ratio, 1 - clip_low, 1 + clip_high) A_r) + kl_coef k3,
//   k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's estimator of KL(policy || reference), >= 0),
// times the token's loss weight; averaged over the step's scored tokens (kToken, as DAPO recommends, so a
// long reply's tokens count as much as a short one's) or over each reply's tokens and then the replies
// (kSequence, the original GRPO). At the first update of a rollout the ratio is exactly 1 and, against the
// same weights as reference, k3 exactly 0. Metrics, per scored token (kSequence: per reply): clip_fraction
// (the ratios the clip held), kl (k3), ratio, and entropy: the sampled tokens' -logp under the policy, an
// unbiased estimate of its entropy on the replies' prefixes at the first update of a rollout sampled at
// temperature 1 (at another temperature, the cross-entropy of the sampler's distribution and the policy's).
//
// `on_policy` (one update per rollout: the weights being trained are those that sampled the batch): the
// ratio divides by the policy's own log-probability (detached), which is exactly what a forward under the
// sampling weights would have recomputed, so no such forward runs; old_logps then hold the sampler's own
// (the decode kernels'), and the loss reports how far the training forward is from them: logp_diff_mean
// (per scored token, weighted as the loss) and logp_diff_max (take_maxima).
struct GrpoOptions {
  double clip_low = 0.2, clip_high = 0.2, kl_coef = 0;
  enum class Norm { kToken, kSequence } norm = Norm::kToken;
  bool on_policy = false;
};
class GrpoLoss final : public Loss {
 public:
  explicit GrpoLoss(const GrpoOptions& options) : o_(options) {}
  std::string name() const override { return "grpo"; }
  double weight(const MicroBatch& batch) const override;
  double chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
               VocabGroup*) const override;
  bool per_sequence() const override { return true; }
  double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const override;
  std::vector<std::pair<std::string, double>> take_metrics() const override;
  std::vector<std::pair<std::string, double>> take_maxima() const override;

 private:
  friend class PpoLoss;  // the same clipped term, with an advantage per token
  // Each position's share of the normaliser: its loss weight, divided by its reply's under kSequence.
  std::vector<double> token_weights(const MicroBatch& batch) const;
  // The clipped term and the KL of every scored position with its `advantage` and `token_weight` (one of
  // each per position; the weights token_weights's) into the loss sum and `coeff`, counted into the figures.
  double clipped(const MicroBatch& batch, const float* nll, std::span<const float> advantage,
                 std::span<const double> token_weight, float* coeff) const;

  GrpoOptions o_;
  mutable std::mutex mu_;
  mutable double clipped_ = 0, kl_ = 0, ratio_ = 0, entropy_ = 0, diff_ = 0, diff_max_ = 0;
};

// Generalised advantage estimation over one reply's scored tokens: rewards[k] and values[k] at its k-th,
// the value after the last 0; advantages[k] = sum over j >= k of (gamma lambda)^(j - k) delta_j with
// delta_j = rewards[j] + gamma values[j + 1] - values[j]. The spans have one length.
void gae(std::span<const float> rewards, std::span<const float> values, double gamma, double lambda,
         std::span<float> advantages);

// Proximal policy optimisation (Schulman et al., 2017) with a learned value head (ModelSpec::value_head) on
// a batch of sampled replies (MicroBatch::rewards, old_logps, ref_logps, old_values). A reply's reward
// comes at its last scored token; along its scored tokens t, with the values V_old the rollout's weights
// gave (old_values; at one update per rollout, the forward's own, detached), generalised advantage
// estimation (Schulman et al., 2016):
//   delta_t = r_t + gamma V_old(t + 1) - V_old(t) (V_old after the last token: 0),
//   A_t = delta_t + gamma lambda A_(t + 1), and the return G_t = A_t + V_old(t).
// Per scored token, GRPO's clipped policy term and KL (GrpoOptions) with A_t, plus
//   value_coef x 0.5 max((V - G_t)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - G_t)^2),
// weighted and normalised as GRPO's. Metrics beside GRPO's: value_loss (the clipped squared error, per
// token), value (the head's mean estimate) and value_clip_fraction (where the clipped error was larger).
struct PpoOptions {
  double gamma = 1.0, lambda = 0.95, value_coef = 0.1, value_clip = 0.2;
};
class PpoLoss final : public Loss {
 public:
  PpoLoss(const GrpoOptions& policy, const PpoOptions& options) : policy_(policy), o_(options) {}
  std::string name() const override { return "ppo"; }
  double weight(const MicroBatch& batch) const override;
  double chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
               VocabGroup*) const override;
  bool per_sequence() const override { return true; }
  bool values() const override { return true; }
  double sequences(const DeviceBatch& batch, const float* nll, float* coeff, RowGroup* rows) const override;
  std::vector<std::pair<std::string, double>> take_metrics() const override;
  std::vector<std::pair<std::string, double>> take_maxima() const override;

 private:
  GrpoLoss policy_;  // its per-token term and figures
  PpoOptions o_;
  mutable std::mutex mu_;
  mutable double value_loss_ = 0, value_ = 0, value_clipped_ = 0;
};

// Knowledge distillation (Hinton et al., 2015) from a frozen teacher with the same tokenizer: per scored
// position, alpha x T^2 x KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) x cross-entropy
// to the target, weighted and normalised as LmCrossEntropy. The teacher (a whole GPT of any size with the
// same vocabulary, on every rank that holds the student's classifier; null elsewhere) runs over each
// micro-batch in begin(), and its logits are formed chunk by chunk beside the student's, over the same
// vocabulary columns: neither model's logits of a whole batch ever exist. Metric: kl_teacher, the mean
// KL per scored token.
class DistillLoss final : public Loss {
 public:
  DistillLoss(double alpha, double temperature, std::shared_ptr<GPT> teacher);
  ~DistillLoss() override;
  std::string name() const override { return "distill"; }
  void begin(const DeviceBatch& batch) const override;
  double chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows, int V,
               int vocab_begin, float scale, bool backward, VocabGroup* group) const override;
  std::vector<std::pair<std::string, double>> take_metrics() const override;

 private:
  double alpha_, temperature_;
  std::shared_ptr<GPT> teacher_;
  mutable Buffer<float> teacher_logits_;  // one chunk
  mutable double kl_ = 0;                 // weighted KL since the last take_metrics
};

}  // namespace forge::trainer
