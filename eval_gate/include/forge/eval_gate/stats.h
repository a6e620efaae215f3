// Per-domain evaluation statistics. Sequences are the sampling unit: the standard error of the mean loss
// comes from the spread of per-sequence mean losses (tokens inside a sequence are correlated).
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge::gate {

struct DomainStats {
  int64_t tokens = 0;
  int64_t sequences = 0;
  double loss_sum = 0;      // sum of token losses (nats)
  double seq_mean_sum = 0;  // sum over sequences of their mean loss
  double seq_mean_sq = 0;   // sum over sequences of their mean loss squared
  double bytes = 0;         // UTF-8 bytes the evaluated target tokens decode to

  void add_sequence(double mean_loss, int64_t tokens_in_sequence, double bytes_in_sequence);
  void merge(const DomainStats& other);

  double mean_loss() const;
  double loss_stderr() const;  // 0 with fewer than two sequences
  double perplexity() const;
  double bits_per_byte() const;
  double bpb_stderr() const;  // the loss's standard error carried through the same scale

  Json to_json() const;  // tokens, sequences, loss, loss_se, ppl, bpb, bpb_se (and the sums, to merge)
  static DomainStats from_json(const Json& j);
};

using DomainResults = std::map<std::string, DomainStats>;

// The fixed-size array a data-parallel evaluation all-reduces (sum), domain by domain, and back.
std::vector<double> pack(const DomainResults& results, const std::vector<std::string>& domains);
DomainResults unpack(const std::vector<double>& packed, const std::vector<std::string>& domains);

}  // namespace forge::gate
