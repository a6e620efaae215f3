// Per-domain evaluation statistics. Sequences are the sampling unit: the standard error of the mean loss
// comes from the spread of per-sequence mean losses (tokens inside a sequence are correlated). The
// objectives' own figures follow the same rule: a distilled model's KL to its teacher per sequence, a
// preference-tuned model's reward margin per pair.
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::gate {

// What a mean over sampling units and its standard error are computed from.
struct Moments {
  double n = 0, sum = 0, sq = 0;  // units, sum of their values, sum of their squares

  void add(double x);
  void merge(const Moments& other);
  double mean() const;   // NaN when empty
  double se() const;     // the sample standard deviation / sqrt(n); 0 with fewer than two units
  Json to_json() const;  // [n, sum, sq]
  static Moments from_json(const Json& j);
};

struct DomainStats {
  int64_t tokens = 0;
  int64_t sequences = 0;
  double loss_sum = 0;      // sum of token losses (nats)
  double seq_mean_sum = 0;  // sum over sequences of their mean loss
  double seq_mean_sq = 0;   // sum over sequences of their mean loss squared
  double bytes = 0;         // UTF-8 bytes the evaluated target tokens decode to
  // Distillation (a run.objective = distill candidate): KL(teacher || model) over the same tokens and
  // sequences as the loss; empty kl_seq when not measured.
  double kl_sum = 0;  // sum of token KLs (nats)
  Moments kl_seq;     // per-sequence mean KL
  // Preference pairs (a run.objective = dpo candidate), one unit a pair: its implicit reward margin and
  // whether that ranks the pair right (1 when > 0, else 0); empty when not measured.
  Moments margin, correct;

  void add_sequence(double mean_loss, int64_t tokens_in_sequence, double bytes_in_sequence);
  void merge(const DomainStats& other);

  double mean_loss() const;
  double loss_stderr() const;  // 0 with fewer than two sequences
  double perplexity() const;
  double bits_per_byte() const;
  double bpb_stderr() const;  // the loss's standard error carried through the same scale
  double kl() const;          // mean KL per token; NaN when not measured
  double kl_stderr() const;

  // tokens, sequences, loss, loss_se, ppl, bpb, bpb_se; when measured kl, kl_se and pairs, accuracy,
  // accuracy_se, reward_margin, reward_margin_se (and the sums, to merge).
  Json to_json() const;
  static DomainStats from_json(const Json& j);
};

using DomainResults = std::map<std::string, DomainStats>;

// The fixed-size array a data-parallel evaluation all-reduces (sum), domain by domain, and back.
std::vector<double> pack(const DomainResults& results, const std::vector<std::string>& domains);
DomainResults unpack(const std::vector<double>& packed, const std::vector<std::string>& domains);

}  // namespace forge::gate
