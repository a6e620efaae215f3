// The loss seam's defaults and the preference loss (loss.h); the per-token cross-entropy is in layers.cpp.
#include "forge/trainer/loss.h"

#include "forge/common/batch.h"
#include "forge/trainer/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace forge::trainer {

double Loss::weight(const MicroBatch& batch) const {
  return batch.weight_sum();
}

double Loss::sequences(const DeviceBatch&, const float*, float*, RowGroup*) const {
  throw std::logic_error("Loss::sequences: " + name() + " is a per-token loss");
}

double DpoLoss::weight(const MicroBatch& batch) const {
  return double(batch.rows);  // one pair a row
}

double DpoLoss::chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
                      VocabGroup*) const {
  throw std::logic_error("DpoLoss::chunk: a sequence loss (the classifier calls sequences)");
}

double ReplyLogps::weight(const MicroBatch& batch) const {
  return double(batch.rows);
}

double ReplyLogps::chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
                         VocabGroup*) const {
  throw std::logic_error("ReplyLogps::chunk: a sequence loss (the classifier calls sequences)");
}

double ReplyLogps::sequences(const DeviceBatch& d, const float* nll, float* coeff, RowGroup* rows) const {
  const MicroBatch& batch = *d.host;
  reply_logps(batch, nll, last_);
  if (rows != nullptr) rows->sum(last_.data(), last_.size());
  std::fill_n(coeff, batch.size(), 0.0f);
  return 0;
}

void reply_logps(const MicroBatch& b, const float* nll, std::vector<double>& out) {
  if (b.segments.size() != b.size())
    throw std::invalid_argument("reply_logps: a batch of pairs needs its documents (segments)");
  const size_t T = size_t(b.seq_len);
  out.assign(2 * size_t(b.rows), 0.0);
  for (size_t i = 0; i < b.size(); ++i) {
    const float w = b.weight(i);
    if (w == 0.0f) continue;
    if (b.segments[i] > 1)
      throw std::invalid_argument("reply_logps: a scored token outside the pair's two documents");
    out[2 * (i / T) + size_t(b.segments[i])] -= double(w) * double(nll[i]);
  }
}

namespace {

// log(1 + exp(x)) without overflow: -log sigmoid(-x).
double softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

// The rollout losses read every row whole (train_spec refuses context parallelism for them).
void whole_rows(const RowGroup* rows, const std::string& loss) {
  if (rows != nullptr && rows->size() > 1)
    throw std::logic_error(loss + ": rows shared out over context-parallel ranks");
}

}  // namespace

double DpoLoss::sequences(const DeviceBatch& d, const float* nll, float* coeff, RowGroup* rows) const {
  const MicroBatch& b = *d.host;
  if (b.reference_logps.size() != 2 * size_t(b.rows) || b.segments.size() != b.size())
    throw std::invalid_argument("DpoLoss: the batch holds no preference pairs (reference log-probabilities)");
  const size_t T = size_t(b.seq_len);
  std::vector<double> logp;
  reply_logps(b, nll, logp);
  if (rows != nullptr) rows->sum(logp.data(), logp.size());  // each rank's tokens of both replies
  double total = 0;
  for (size_t r = 0; r < size_t(b.rows); ++r) {
    const double chosen = beta_ * (logp[2 * r] - b.reference_logps[2 * r]);
    const double rejected = beta_ * (logp[2 * r + 1] - b.reference_logps[2 * r + 1]);
    const double z = chosen - rejected;
    // -(1 - eps) log sigmoid(z) - eps log sigmoid(-z) = (1 - eps) softplus(-z) + eps softplus(z).
    total += (1 - smoothing_) * softplus(-z) + smoothing_ * softplus(z);
    const double dz = -(1 - smoothing_) * sigmoid(-z) + smoothing_ * sigmoid(z);  // dL/dz
    // logp = -sum w nll: dL/dnll = -beta dz w for the chosen reply's tokens, +beta dz w for the rejected.
    for (size_t i = r * T; i < (r + 1) * T; ++i) {
      const float w = b.weight(i);
      coeff[i] = w == 0.0f ? 0.0f : float((b.segments[i] == 0 ? -beta_ : beta_) * dz * double(w));
    }
    std::lock_guard lock(mu_);
    chosen_ += chosen;
    rejected_ += rejected;
    margin_ += z;
    correct_ += z > 0 ? 1.0 : 0.0;
  }
  return total;
}

std::vector<std::pair<std::string, double>> DpoLoss::take_metrics() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, double>> out = {{"reward_chosen", chosen_},
                                                     {"reward_rejected", rejected_},
                                                     {"reward_margin", margin_},
                                                     {"accuracy", correct_}};
  chosen_ = rejected_ = margin_ = correct_ = 0;
  return out;
}

double TokenLogps::chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
                         VocabGroup*) const {
  throw std::logic_error("TokenLogps::chunk: a sequence loss (the classifier calls sequences)");
}

double TokenLogps::sequences(const DeviceBatch& d, const float* nll, float* coeff, RowGroup* rows) const {
  whole_rows(rows, name());
  const MicroBatch& batch = *d.host;
  last_.assign(batch.size(), 0.0f);
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch.weight(i) != 0.0f) last_[i] = -nll[i];
  if (values_) last_values_.assign(d.values, d.values + batch.size());
  std::fill_n(coeff, batch.size(), 0.0f);
  return 0;
}

std::vector<float> grpo_advantages(std::span<const float> rewards, int group_size, bool scale) {
  if (group_size < 2 || rewards.size() % size_t(group_size) != 0)
    throw std::invalid_argument("grpo_advantages: groups of at least 2 that divide the rewards");
  std::vector<float> out(rewards.size());
  const size_t g = size_t(group_size);
  for (size_t at = 0; at < rewards.size(); at += g) {
    double mean = 0, var = 0;
    for (size_t i = at; i < at + g; ++i) mean += rewards[i];
    mean /= double(g);
    for (size_t i = at; i < at + g; ++i) var += (rewards[i] - mean) * (rewards[i] - mean);
    const double div = scale ? std::sqrt(var / double(g - 1)) + 1e-4 : 1.0;
    for (size_t i = at; i < at + g; ++i) out[i] = float((rewards[i] - mean) / div);
  }
  return out;
}

double GrpoLoss::weight(const MicroBatch& batch) const {
  if (o_.norm == GrpoOptions::Norm::kToken) return batch.weight_sum();
  double replies = 0;
  for (size_t r = 0; r < size_t(batch.rows); ++r)
    for (size_t i = r * size_t(batch.seq_len); i < (r + 1) * size_t(batch.seq_len); ++i)
      if (batch.weight(i) != 0.0f) {
        replies += 1;
        break;
      }
  return replies;
}

double GrpoLoss::chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
                       VocabGroup*) const {
  throw std::logic_error("GrpoLoss::chunk: a sequence loss (the classifier calls sequences)");
}

double GrpoLoss::sequences(const DeviceBatch& d, const float* nll, float* coeff, RowGroup* rows) const {
  whole_rows(rows, name());
  const MicroBatch& b = *d.host;
  if (b.advantages.size() != size_t(b.rows))
    throw std::invalid_argument("GrpoLoss: the batch holds no sampled replies (advantages)");
  std::vector<float> advantage(b.size());
  for (size_t i = 0; i < b.size(); ++i) advantage[i] = b.advantages[i / size_t(b.seq_len)];
  return clipped(b, nll, advantage, token_weights(b), coeff);
}

std::vector<double> GrpoLoss::token_weights(const MicroBatch& b) const {
  const size_t T = size_t(b.seq_len);
  std::vector<double> out(b.size());
  for (size_t r = 0; r < size_t(b.rows); ++r) {
    double scored = 0;
    for (size_t i = r * T; i < (r + 1) * T; ++i) scored += b.weight(i);
    const double per_reply = o_.norm == GrpoOptions::Norm::kSequence && scored > 0 ? 1 / scored : 1;
    for (size_t i = r * T; i < (r + 1) * T; ++i) out[i] = double(b.weight(i)) * per_reply;
  }
  return out;
}

double GrpoLoss::clipped(const MicroBatch& b, const float* nll, std::span<const float> advantage,
                         std::span<const double> token_weight, float* coeff) const {
  if (b.old_logps.size() != b.size())
    throw std::invalid_argument("GrpoLoss: the batch holds no old log-probabilities of its replies");
  if (o_.kl_coef != 0 && b.ref_logps.size() != b.size())
    throw std::invalid_argument("GrpoLoss: a KL coefficient needs the reference's log-probabilities");
  const double lo = 1 - o_.clip_low, hi = 1 + o_.clip_high;
  double total = 0, clipped = 0, kl = 0, ratios = 0, surprise = 0, diff = 0, diff_max = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double w = token_weight[i];
    coeff[i] = 0.0f;
    if (w == 0) continue;
    const double logp = -double(nll[i]);
    double old = double(b.old_logps[i]);
    if (o_.on_policy) {  // old holds the sampler's: this forward is the recomputation
      const double d = std::fabs(logp - old);
      diff += w * d;
      diff_max = std::max(diff_max, d);
      old = logp;
    }
    const double a = advantage[i];
    const double ratio = std::exp(logp - old);
    const double unclipped = ratio * a, held = std::clamp(ratio, lo, hi) * a;
    // d/dlogp of -min(unclipped, held): -ratio A where the unclipped term is the smaller (the clipped
    // one equals it inside the range), 0 where the clip holds the ratio.
    double loss = -std::min(unclipped, held), dlogp = unclipped <= held ? -unclipped : 0.0;
    double k3 = 0;
    if (o_.kl_coef != 0) {
      const double e = double(b.ref_logps[i]) - logp;
      k3 = std::exp(e) - e - 1;
      loss += o_.kl_coef * k3;
      dlogp += o_.kl_coef * (1 - std::exp(e));
    }
    total += w * loss;
    coeff[i] = float(-w * dlogp);  // logp = -nll
    clipped += unclipped > held ? w : 0.0;
    kl += w * k3;
    ratios += w * ratio;
    surprise -= w * logp;
  }
  std::lock_guard lock(mu_);
  clipped_ += clipped;
  kl_ += kl;
  ratio_ += ratios;
  entropy_ += surprise;
  diff_ += diff;
  diff_max_ = std::max(diff_max_, diff_max);
  return total;
}

std::vector<std::pair<std::string, double>> GrpoLoss::take_metrics() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, double>> out = {
      {"clip_fraction", clipped_}, {"kl", kl_}, {"ratio", ratio_}, {"entropy", entropy_}};
  if (o_.on_policy) out.emplace_back("logp_diff_mean", diff_);
  clipped_ = kl_ = ratio_ = entropy_ = diff_ = 0;
  return out;
}

std::vector<std::pair<std::string, double>> GrpoLoss::take_maxima() const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, double>> out;
  if (o_.on_policy) out.emplace_back("logp_diff_max", diff_max_);
  diff_max_ = 0;
  return out;
}

void gae(std::span<const float> rewards, std::span<const float> values, double gamma, double lambda,
         std::span<float> advantages) {
  double next_value = 0, next_advantage = 0;
  for (size_t k = rewards.size(); k-- > 0;) {
    const double delta = double(rewards[k]) + gamma * next_value - double(values[k]);
    next_advantage = delta + gamma * lambda * next_advantage;
    advantages[k] = float(next_advantage);
    next_value = values[k];
  }
}

double PpoLoss::weight(const MicroBatch& batch) const {
  return policy_.weight(batch);
}

double PpoLoss::chunk(Backend&, float*, const DeviceBatch&, int, int, int, int, float, bool,
                      VocabGroup*) const {
  throw std::logic_error("PpoLoss::chunk: a sequence loss (the classifier calls sequences)");
}

double PpoLoss::sequences(const DeviceBatch& d, const float* nll, float* coeff, RowGroup* rows) const {
  whole_rows(rows, name());
  const MicroBatch& b = *d.host;
  if (b.rewards.size() != size_t(b.rows))
    throw std::invalid_argument("PpoLoss: the batch holds no sampled replies (rewards)");
  if (d.values == nullptr || d.dvalues == nullptr)
    throw std::invalid_argument("PpoLoss: the model formed no values (a value head, model.value_head)");
  if (!b.old_values.empty() && b.old_values.size() != b.size())
    throw std::invalid_argument("PpoLoss: old_values is not one per position");
  // At one update per rollout the rollout's values are this forward's (detached), as its ratio is 1.
  const float* old_values = b.old_values.empty() ? d.values : b.old_values.data();
  // Each reply's advantages and returns along its scored tokens, from its reward at the last of them.
  const size_t T = size_t(b.seq_len);
  std::vector<float> advantage(b.size(), 0.0f), returns(b.size(), 0.0f);
  std::vector<float> reward, value, adv;
  std::vector<size_t> scored;
  for (size_t r = 0; r < size_t(b.rows); ++r) {
    scored.clear();
    for (size_t i = r * T; i < (r + 1) * T; ++i)
      if (b.weight(i) != 0.0f) scored.push_back(i);
    if (scored.empty()) continue;
    reward.assign(scored.size(), 0.0f);
    reward.back() = b.rewards[r];
    value.resize(scored.size());
    adv.resize(scored.size());
    for (size_t k = 0; k < scored.size(); ++k) value[k] = old_values[scored[k]];
    gae(reward, value, o_.gamma, o_.lambda, adv);
    for (size_t k = 0; k < scored.size(); ++k) {
      advantage[scored[k]] = adv[k];
      returns[scored[k]] = adv[k] + value[k];
    }
  }
  const std::vector<double> w = policy_.token_weights(b);
  double total = policy_.clipped(b, nll, advantage, w, coeff);
  double value_loss = 0, values = 0, clipped = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d.dvalues[i] = 0.0f;
    if (w[i] == 0) continue;
    const double v = d.values[i], old = old_values[i], g = returns[i];
    const double held = old + std::clamp(v - old, -o_.value_clip, o_.value_clip);
    const double plain = (v - g) * (v - g), capped = (held - g) * (held - g);
    // d/dv of 0.5 max(plain, capped): the larger term's; the clipped one's is 0 where the clip holds v.
    const double dv = plain >= capped ? v - g : std::fabs(v - old) < o_.value_clip ? held - g : 0.0;
    total += w[i] * o_.value_coef * 0.5 * std::max(plain, capped);
    d.dvalues[i] = float(w[i] * o_.value_coef * dv);
    value_loss += w[i] * 0.5 * std::max(plain, capped);
    values += w[i] * v;
    clipped += capped > plain ? w[i] : 0.0;
  }
  std::lock_guard lock(mu_);
  value_loss_ += value_loss;
  value_ += values;
  value_clipped_ += clipped;
  return total;
}

std::vector<std::pair<std::string, double>> PpoLoss::take_metrics() const {
  std::vector<std::pair<std::string, double>> out = policy_.take_metrics();
  std::lock_guard lock(mu_);
  out.insert(out.end(),
             {{"value_loss", value_loss_}, {"value", value_}, {"value_clip_fraction", value_clipped_}});
  value_loss_ = value_ = value_clipped_ = 0;
  return out;
}

std::vector<std::pair<std::string, double>> PpoLoss::take_maxima() const {
  return policy_.take_maxima();
}

DistillLoss::DistillLoss(double alpha, double temperature, std::shared_ptr<GPT> teacher)
    : alpha_(alpha), temperature_(temperature), teacher_(std::move(teacher)) {}

DistillLoss::~DistillLoss() = default;

void DistillLoss::begin(const DeviceBatch& batch) const {
  if (teacher_ == nullptr)
    throw std::logic_error("DistillLoss: this rank holds the classifier but no teacher");
  if (batch.host == nullptr)
    throw std::logic_error(
        "DistillLoss: the teacher reads the batch as the reader made it (DeviceBatch::host)");
  teacher_->forward_features(*batch.host);
}

double DistillLoss::chunk(Backend& backend, float* logits, const DeviceBatch& batch, int row0, int rows,
                          int V, int vocab_begin, float scale, bool backward, VocabGroup* group) const {
  if (const size_t need = size_t(rows) * size_t(V); teacher_logits_.size() < need)
    teacher_logits_ = backend.alloc<float>(need);
  teacher_->feature_logits(teacher_logits_.data(), row0, rows, vocab_begin, V);
  double kl = 0;
  const double total =
      backend.distillation(logits, teacher_logits_.data(), batch.targets + row0,
                           batch.weights != nullptr ? batch.weights + row0 : nullptr, rows, V, vocab_begin,
                           float(temperature_), float(alpha_), scale, backward, group, &kl);
  kl_ += kl;
  return total;
}

std::vector<std::pair<std::string, double>> DistillLoss::take_metrics() const {
  std::vector<std::pair<std::string, double>> out = {{"kl_teacher", kl_}};
  kl_ = 0;
  return out;
}

}  // namespace forge::trainer
