#include "rollouts.h"

#include "dpo_reference.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/text.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prompts.h"
#include "forge/eval_gate/generate.h"
#include "forge/eval_gate/prompt_format.h"
#include "forge/eval_gate/rewards.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/objective.h"
#include "forge/trainer/parallel.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace forge::launcher {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

gate::RewardSettings reward_settings(const trainer::TrainSpec& spec) {
  gate::RewardSettings s;
  for (size_t k = 0; k < gate::kScorers; ++k) {
    const auto it = spec.rl.reward.weights.find(std::string(trainer::kRewardScorers[k]));
    s.weights[k] = it != spec.rl.reward.weights.end() ? it->second : 0.0;
  }
  s.answer = gate::parse_answer_rule(spec.rl.reward.answer);
  s.max_new_tokens = spec.rl.max_new_tokens;
  s.parallel = spec.rl.sandbox_parallel > 0 ? spec.rl.sandbox_parallel : spec.threads;
  return s;
}

// Every prompt must be scorable by a weighed correctness scorer (an answer for exact_match, tests for
// code); a reward of format and length only asks nothing of them.
void check_scorable(const data::PromptSet& set, const gate::RewardSettings& r) {
  const bool answers = r.weights[gate::kExactMatch] != 0, tests = r.weights[gate::kCode] != 0;
  if (!answers && !tests) return;
  size_t missing = 0;
  std::string first;
  for (const data::Prompt& p : set.prompts)
    if (!(answers && !p.answers.empty()) && !(tests && !p.tests.empty()))
      if (missing++ == 0) first = p.id;
  if (missing > 0)
    fail(ExitCode::kData,
         "{}/prompts.jsonl: {} of {} prompts (the first: '{}') have {} for the reward's scorers "
         "(reward.weights "
         "= {}): prepare a prompt set whose prompts carry them, or weigh the scorer they do carry",
         set.dir, missing, set.prompts.size(), first,
         answers && tests ? "neither an answer nor tests"
         : answers        ? "no answer"
                          : "no tests",
         answers && tests ? "exact_match and code"
         : answers        ? "exact_match"
                          : "code");
}

class Rollouts final : public DataSource {
 public:
  Rollouts(const Config& config, const trainer::TrainSpec& spec, int dp_rank, trainer::Backend& backend)
      : spec_(spec), dp_rank_(dp_rank), rewards_(reward_settings(spec)) {
    const std::string init_from = config.get<std::string>("ckpt.init_from");
    if (init_from.empty())
      config.reject(
          "ckpt.init_from",
          fmt::format("run.objective = {} improves a model that can already answer its prompts: set "
                      "it to that model's checkpoint (an SFT run's release, "
                      "scripts/sbatch/finetune.sbatch)",
                      objective_));
    const std::string format =
        spec.dataset == "synthetic" ? "synthetic" : data::load_any_manifest(spec.dataset).format;
    if (format != data::kPromptsFormat)
      config.reject(
          "run.objective",
          fmt::format("{} samples replies to a prompt set, and {} is {}: prepare one with `forge-data "
                      "prepare --format prompts` and name it in data.dataset",
                      objective_, spec.dataset,
                      format == "synthetic" ? "the synthetic stream" : "format " + format));
    set_ = data::load_prompt_set(spec.dataset);
    check_scorable(set_, rewards_.settings());
    format_ = gate::PromptFormat::of_model(init_from, spec.rl.format_dataset);
    if (!format_.can_chat())
      config.reject("rl.format_dataset",
                    fmt::format("the policy {} has no chat format of its own: name the chat dataset it was "
                                "fine-tuned on, whose tokenizer and markers it speaks",
                                init_from));
    if (format_.tokenizer->vocab_size() > uint32_t(spec.model.vocab))
      config.reject("model.vocab",
                    fmt::format("the policy's tokenizer has {} tokens: it must be at least that",
                                format_.tokenizer->vocab_size()));
    stops_ = format_.stops(true);
    std::string kl;
    if (spec.rl.loss.kl_coef > 0) {
      const std::string reference = spec.rl.reference.empty() ? init_from : spec.rl.reference;
      reference_ = frozen_reference(spec, reference, reference_logps_, backend);
      kl = fmt::format(", KL to {}", reference);
    }
    const int per_step = spec.layout.dp * spec.microbatches * spec.batch / spec.rl.group_size;
    if (dp_rank == 0)
      spdlog::info("{}: {} prompts of {} per step, {} replies each, reward {}{}", objective_, per_step,
                   set_.dir, spec.rl.group_size, spec.rl.reward.weights.size(), kl);
  }

  void set_policy(trainer::ParallelTrainer& policy) override { policy_ = &policy; }

  // A rollout serves rl.updates_per_rollout steps: sampled at its first, under the weights of that moment,
  // each step then trains the next spec.microbatches of its micro-batches. Checkpoints fall between
  // rollouts (RunCheckpoints), so a resumed or rewound run samples every rollout as it was sampled before.
  void next(int64_t step, std::vector<MicroBatch>& out) override {
    const int U = spec_.rl.updates_per_rollout, M = spec_.microbatches;
    const int64_t first = step - step % U;
    if (rollout_.empty() || rollout_step_ != first) {
      sample(first);
      rollout_step_ = first;
    } else {
      metrics_ = nullptr;  // the rollout's figures went with its first step
    }
    const auto at = rollout_.begin() + ptrdiff_t((step - first) * M);
    out.assign(at, at + M);
  }

  // The rollout of steps [first, first + rl.updates_per_rollout) into rollout_.
  void sample(int64_t first) {
    if (policy_ == nullptr) throw std::logic_error("Rollouts: no policy to sample from (set_policy)");
    trainer::GPT& model = policy_->model();
    const int B = spec_.batch, G = spec_.rl.group_size, T = spec_.model.seq_len;
    const int dp = spec_.layout.dp, M = spec_.microbatches * spec_.rl.updates_per_rollout;
    if (!generator_) generator_.emplace(model, B, T);
    // Global row (i dp + r) B + j of the rollout (micro-batch i of all its steps', rank r, row j) is reply
    // (row mod G) of the rollout's prompt row / G: the same rows on any dp x microbatches of the same global
    // batch; its prompts follow the previous rollout's.
    const uint64_t per_step = uint64_t(dp) * uint64_t(spec_.microbatches) * uint64_t(B) / uint64_t(G);
    std::vector<gate::Request> requests;
    std::vector<uint64_t> counters;  // per row: the run's prompt counter
    std::vector<size_t> prompt_of;   // per row: its prompt's index in the set
    std::vector<std::vector<int32_t>> prompt_tokens;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < B; ++j) {
        const uint64_t row = uint64_t((i * dp + dp_rank_) * B + j);
        const uint64_t counter = uint64_t(first) * per_step + row / uint64_t(G);
        const size_t p = prompt_at(counter);
        if (j % G == 0) {
          const data::ChatMessage user{data::ChatRole::kUser, set_.prompts[p].prompt};
          prompt_tokens.push_back(format_.chat_prompt(std::span(&user, 1)));
        }
        counters.push_back(counter);
        prompt_of.push_back(p);
        requests.push_back({prompt_tokens.back(), xxh3_64(set_.prompts[p].id.data(),
                                                          set_.prompts[p].id.size(), row % uint64_t(G))});
      }
    gate::Sampling sampling;
    sampling.temperature = float(spec_.rl.temperature);
    sampling.top_p = float(spec_.rl.top_p);
    sampling.max_new_tokens = spec_.rl.max_new_tokens;
    // Draws keyed by the run's seed and the rollout's first step, so a resumed run samples what it sampled
    // before.
    const uint64_t words[2] = {spec_.seed, uint64_t(first)};
    sampling.seed = xxh3_64(words, sizeof words);
    format_.set_stops(stops_, sampling);
    // Each reply is scored as soon as its sampling ends: code replies' sandboxes run while the rest of the
    // rollout samples; what is left after the last reply is the step's wait for its rewards.
    std::vector<gate::RewardTarget> targets(requests.size());
    for (size_t k = 0; k < requests.size(); ++k) {
      const data::Prompt& p = set_.prompts[prompt_of[k]];
      targets[k] = {p.answers, p.tests, p.entry_point};
    }
    std::string first_reply;  // row 0's, for the example metric
    gate::RewardStream scoring(rewards_, requests.size());
    std::vector<gate::Reply> held(spec_.rl.overlap_rewards ? 0 : requests.size());  // scored after sampling
    auto t0 = Clock::now();
    const gate::GenerationStats before = generator_->stats();
    const std::vector<gate::Generation> gens =
        generator_->run(requests, sampling, [&](size_t k, const gate::Generation& g) {
          gate::Reply reply{&targets[k], format_.completion(g.tokens, stops_), int(g.tokens.size()),
                            g.stopped};
          if (k == 0) first_reply = reply.text;
          if (held.empty())
            scoring.add(k, std::move(reply));
          else
            held[k] = std::move(reply);
        });
    const double generation_s = seconds_since(t0);
    t0 = Clock::now();
    for (size_t k = 0; k < held.size(); ++k) scoring.add(k, std::move(held[k]));
    const std::vector<gate::Reward> rewards = scoring.finish();
    const double reward_s = seconds_since(t0);
    std::vector<float> totals(rewards.size());
    for (size_t k = 0; k < rewards.size(); ++k) totals[k] = float(rewards[k].total);
    // Per reply, GRPO's advantage (its reward against its group's mean), or PPO's reward (its baseline is
    // the value head, along each reply in the loss: PpoLoss).
    const bool ppo = spec_.objective == trainer::Objective::kPpo;
    const std::vector<float> per_reply =
        ppo ? totals : trainer::grpo_advantages(totals, G, spec_.rl.scale_rewards);

    std::vector<MicroBatch>& out = rollout_;
    out.resize(size_t(M));
    double logp_diff_sum = 0, logp_diff_max = 0, scored = 0;
    const bool on_policy = spec_.rl.loss.on_policy;
    // What the head's pipeline stage recorded, to every stage's batch (MicroBatch::problem checks them).
    const auto from_last_stage = [pp = policy_->groups().pp.get()](std::vector<float>& v, size_t n) {
      if (pp->size() == 1) return;
      v.resize(n);
      pp->broadcast(v.data(), n, comm::CommType::kF32, pp->size() - 1)->wait();
    };
    for (int i = 0; i < M; ++i) {
      MicroBatch& batch = out[size_t(i)];
      batch.resize(B, T);
      std::fill(batch.inputs.begin(), batch.inputs.end(), 0);
      std::fill(batch.targets.begin(), batch.targets.end(), MicroBatch::kIgnore);
      batch.domains.resize(size_t(B));
      for (int j = 0; j < B; ++j) {
        const size_t k = size_t(i * B + j);
        const gate::Generation& g = gens[k];
        // The window the generator ran: the prompt (its last tokens when it was cut), the reply, the stop
        // token that ended it. A prompt and a reply fit seq_len + 1 tokens (the generator's max_len).
        const std::vector<int32_t>& prompt = requests[k].prompt;
        const size_t kept = std::min(prompt.size(), size_t(T - 1));
        std::vector<int32_t> window(prompt.end() - ptrdiff_t(kept), prompt.end());
        window.insert(window.end(), g.tokens.begin(), g.tokens.end());
        if (g.stop_token >= 0) window.push_back(g.stop_token);
        const size_t at = size_t(j) * size_t(T);
        for (size_t t = 0; t + 1 < window.size(); ++t) {
          batch.inputs[at + t] = window[t];
          if (t + 1 >= kept) batch.targets[at + t] = window[t + 1];  // the reply's tokens are scored
        }
        const data::Prompt& p = set_.prompts[prompt_of[k]];
        batch.sample_ids[size_t(j)] = uint64_t(prompt_of[k]) * uint64_t(G) + uint64_t(j % G);
        batch.epochs[size_t(j)] = uint32_t(counters[k] / set_.prompts.size());
        batch.domains[size_t(j)] = uint16_t(
            std::lower_bound(set_.domains.begin(), set_.domains.end(), p.domain) - set_.domains.begin());
      }
      // The sampler's log-probabilities of the scored tokens (the decode kernels' arithmetic), in place.
      std::vector<float> sampled(batch.size(), 0.0f);
      for (int j = 0; j < B; ++j) {
        const gate::Generation& g = gens[size_t(i * B + j)];
        size_t n = 0;
        for (size_t t = 0; t < size_t(T) && n < g.logps.size(); ++t)
          if (const size_t pos = size_t(j) * size_t(T) + t; batch.targets[pos] != MicroBatch::kIgnore)
            sampled[pos] = g.logps[n++];
      }
      if (reference_) {
        reference_->forward_loss(batch);
        batch.ref_logps = reference_logps_->last();
      }
      if (on_policy) {
        // One update per rollout: the training forward runs under the weights that sampled it and is the
        // recomputation (GrpoOptions::on_policy), which compares itself with the sampler's.
        batch.old_logps = std::move(sampled);
      } else {
        // The log-probabilities the ratio divides by: the trainer's own forward under the weights that
        // sampled it (so the ratio is exactly 1 at the rollout's first update), against the sampler's: ~0
        // in FP32, a metric in BF16.
        policy_->forward_loss(batch, *token_logps_);
        batch.old_logps = token_logps_->last();
        from_last_stage(batch.old_logps, batch.size());
        if (ppo) {
          batch.old_values = token_logps_->last_values();
          from_last_stage(batch.old_values, batch.size());
        }
        for (size_t pos = 0; pos < batch.size(); ++pos) {
          if (batch.targets[pos] == MicroBatch::kIgnore) continue;
          const double d = std::fabs(double(batch.old_logps[pos]) - double(sampled[pos]));
          logp_diff_sum += d;
          logp_diff_max = std::max(logp_diff_max, d);
          scored += 1;
        }
      }
      (ppo ? batch.rewards : batch.advantages)
          .assign(per_reply.begin() + ptrdiff_t(i * B), per_reply.begin() + ptrdiff_t((i + 1) * B));
    }
    summarise(rewards, gens, generator_->stats().new_tokens - before.new_tokens, generation_s, reward_s,
              scoring.span_seconds(), logp_diff_sum, logp_diff_max, scored);
    // One of the step's replies, to read what the policy says (data-parallel rank 0's first).
    metrics_["example"] = {{"prompt", printable(set_.prompts[prompt_of[0]].prompt, 160, true)},
                           {"reply", printable(first_reply, 160, true)},
                           {"reward", rewards[0].total}};
  }

  std::string describe() const override {
    return fmt::format("prompt set {} ({}), {} replies per prompt", set_.dir, set_.version,
                       spec_.rl.group_size);
  }
  std::string version() const override { return set_.version; }
  std::string tokenizer() const override { return format_.tokenizer->sha256(); }
  uint64_t bytes_read() const override { return 0; }
  std::vector<std::string> domains() const override { return set_.domains; }
  Json step_metrics() const override { return metrics_; }

 private:
  // The set's prompt the run's `counter`-th prompt is: each pass over the set in its own order, a
  // permutation drawn from the run's seed and the pass.
  size_t prompt_at(uint64_t counter) {
    const size_t n = set_.prompts.size();
    const uint64_t epoch = counter / n;
    if (order_.empty() || epoch != order_epoch_) {
      order_.resize(n);
      std::iota(order_.begin(), order_.end(), size_t{0});
      for (size_t i = n; i > 1; --i) {
        const uint64_t words[3] = {spec_.seed, epoch, uint64_t(i)};
        std::swap(order_[i - 1], order_[xxh3_64(words, sizeof words) % i]);
      }
      order_epoch_ = epoch;
    }
    return order_[counter % n];
  }

  // The step's figures over the data-parallel group: sums, then means; times are the slowest rank's.
  void summarise(const std::vector<gate::Reward>& rewards, const std::vector<gate::Generation>& gens,
                 int64_t new_tokens, double generation_s, double reward_s, double scoring_s, double diff_sum,
                 double diff_max, double scored) {
    const int G = spec_.rl.group_size;
    enum : size_t {
      kReplies,
      kReward,
      kReward2,
      kFlatGroups,
      kGroups,
      kTokens,
      kStopped,
      kNewTokens,
      kDiff,
      kScored,
      kParts
    };
    // kParts: per scorer its summed score and the replies it applied to; then the sandbox outcomes.
    std::vector<double> sums(kParts + 2 * gate::kScorers + gate::kSandboxOutcomes.size(), 0.0);
    for (size_t k = 0; k < rewards.size(); ++k) {
      const gate::Reward& r = rewards[k];
      sums[kReplies] += 1;
      sums[kReward] += r.total;
      sums[kReward2] += r.total * r.total;
      sums[kTokens] += double(gens[k].tokens.size());
      sums[kStopped] += gens[k].stopped ? 1 : 0;
      for (size_t s = 0; s < gate::kScorers; ++s)
        if (r.applies[s]) {
          sums[kParts + 2 * s] += r.parts[s];
          sums[kParts + 2 * s + 1] += 1;
        }
      if (r.sandbox_outcome >= 0) sums[kParts + 2 * gate::kScorers + size_t(r.sandbox_outcome)] += 1;
    }
    for (size_t at = 0; at < rewards.size(); at += size_t(G)) {
      sums[kGroups] += 1;
      bool flat = true;
      for (size_t k = at + 1; k < at + size_t(G); ++k) flat = flat && rewards[k].total == rewards[at].total;
      sums[kFlatGroups] += flat ? 1 : 0;
    }
    sums[kNewTokens] = double(new_tokens);
    sums[kDiff] = diff_sum;
    sums[kScored] = scored;
    comm::Comm& dp = *policy_->groups().dp;
    dp.all_reduce(sums.data(), sums.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
    double slowest[4] = {generation_s, reward_s, diff_max, scoring_s};
    dp.all_reduce(slowest, 4, comm::CommType::kF64, comm::ReduceOp::kMax)->wait();
    const double n = sums[kReplies], mean = sums[kReward] / n;
    Json parts = Json::object(), sandbox = Json::object();
    for (size_t s = 0; s < gate::kScorers; ++s)
      if (sums[kParts + 2 * s + 1] > 0)
        parts[std::string(trainer::kRewardScorers[s])] = sums[kParts + 2 * s] / sums[kParts + 2 * s + 1];
    for (size_t o = 0; o < gate::kSandboxOutcomes.size(); ++o)
      if (const double c = sums[kParts + 2 * gate::kScorers + o]; c > 0)
        sandbox[std::string(gate::kSandboxOutcomes[o])] = int64_t(c);
    metrics_ = {{"reward", mean},
                {"reward_std", std::sqrt(std::max(0.0, sums[kReward2] / n - mean * mean))},
                {"reward_parts", parts},
                {"reply_tokens", sums[kTokens] / n},
                {"stopped", sums[kStopped] / n},
                {"generation_ms", slowest[0] * 1e3},
                {"reward_ms", slowest[1] * 1e3},
                {"reward_span_ms", slowest[3] * 1e3},
                {"generation_tokens_per_s", slowest[0] > 0 ? sums[kNewTokens] / slowest[0] : 0.0}};
    // At one update per rollout the loss measures them, in the training forward (train_run.cpp moves its
    // figures here).
    if (!spec_.rl.loss.on_policy) {
      metrics_["logp_diff_mean"] = sums[kScored] > 0 ? sums[kDiff] / sums[kScored] : 0.0;
      metrics_["logp_diff_max"] = slowest[2];
    }
    if (!sandbox.empty()) metrics_["sandbox"] = sandbox;
    if (G >= 2)
      metrics_["flat_groups"] = sums[kFlatGroups] / sums[kGroups];  // a group of one is its own mean
  }

  const trainer::TrainSpec& spec_;
  std::string_view objective_ = trainer::traits(spec_.objective).name;
  int dp_rank_;
  gate::RewardModel rewards_;
  data::PromptSet set_;
  gate::PromptFormat format_;
  gate::Stops stops_;
  trainer::ParallelTrainer* policy_ = nullptr;
  std::optional<gate::Generator> generator_;
  // The rollout's log-probabilities (and PPO's values) under the weights that sampled it.
  std::shared_ptr<trainer::TokenLogps> token_logps_ =
      std::make_shared<trainer::TokenLogps>(spec_.objective == trainer::Objective::kPpo);
  std::shared_ptr<trainer::TokenLogps> reference_logps_ = std::make_shared<trainer::TokenLogps>();
  std::unique_ptr<trainer::GPT> reference_;
  std::vector<size_t> order_;
  uint64_t order_epoch_ = 0;
  std::vector<MicroBatch> rollout_;  // every micro-batch of the rollout of steps from rollout_step_ on
  int64_t rollout_step_ = -1;
  Json metrics_;
};

}  // namespace

std::unique_ptr<DataSource> open_rollouts(const Config& config, const trainer::TrainSpec& spec, int dp_rank,
                                          trainer::Backend& backend) {
  return std::make_unique<Rollouts>(config, spec, dp_rank, backend);
}

}  // namespace forge::launcher
