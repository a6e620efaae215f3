#include "forge/eval_gate/stats.h"

#include <cmath>
#include <numbers>

namespace forge::gate {

void DomainStats::add_sequence(double mean_loss, int64_t tokens_in_sequence, double bytes_in_sequence) {
  tokens += tokens_in_sequence;
  sequences += 1;
  loss_sum += mean_loss * static_cast<double>(tokens_in_sequence);
  seq_mean_sum += mean_loss;
  seq_mean_sq += mean_loss * mean_loss;
  bytes += bytes_in_sequence;
}

void DomainStats::merge(const DomainStats& o) {
  tokens += o.tokens;
  sequences += o.sequences;
  loss_sum += o.loss_sum;
  seq_mean_sum += o.seq_mean_sum;
  seq_mean_sq += o.seq_mean_sq;
  bytes += o.bytes;
}

double DomainStats::mean_loss() const {
  return tokens > 0 ? loss_sum / static_cast<double>(tokens) : NAN;
}

double DomainStats::loss_stderr() const {
  if (sequences < 2) return 0;
  const double n = static_cast<double>(sequences);
  const double mean = seq_mean_sum / n;
  const double var = std::max(0.0, (seq_mean_sq - n * mean * mean) / (n - 1));
  return std::sqrt(var / n);
}

double DomainStats::perplexity() const {
  return std::exp(mean_loss());
}

double DomainStats::bits_per_byte() const {
  return bytes > 0 ? loss_sum / (std::numbers::ln2 * bytes) : NAN;
}

double DomainStats::bpb_stderr() const {
  return bytes > 0 ? loss_stderr() * static_cast<double>(tokens) / (std::numbers::ln2 * bytes) : 0;
}

Json DomainStats::to_json() const {
  return {{"tokens", tokens},           {"sequences", sequences}, {"loss", mean_loss()},
          {"loss_se", loss_stderr()},   {"ppl", perplexity()},    {"bpb", bits_per_byte()},
          {"bpb_se", bpb_stderr()},     {"loss_sum", loss_sum},   {"seq_mean_sum", seq_mean_sum},
          {"seq_mean_sq", seq_mean_sq}, {"bytes", bytes}};
}

DomainStats DomainStats::from_json(const Json& j) {
  DomainStats s;
  s.tokens = j.at("tokens").get<int64_t>();
  s.sequences = j.at("sequences").get<int64_t>();
  s.loss_sum = j.at("loss_sum").get<double>();
  s.seq_mean_sum = j.at("seq_mean_sum").get<double>();
  s.seq_mean_sq = j.at("seq_mean_sq").get<double>();
  s.bytes = j.at("bytes").get<double>();
  return s;
}

namespace {
constexpr int kFields = 6;
}

std::vector<double> pack(const DomainResults& results, const std::vector<std::string>& domains) {
  std::vector<double> out;
  out.reserve(domains.size() * kFields);
  for (const auto& d : domains) {
    const auto it = results.find(d);
    const DomainStats s = it == results.end() ? DomainStats{} : it->second;
    out.insert(out.end(), {static_cast<double>(s.tokens), static_cast<double>(s.sequences), s.loss_sum,
                           s.seq_mean_sum, s.seq_mean_sq, s.bytes});
  }
  return out;
}

DomainResults unpack(const std::vector<double>& packed, const std::vector<std::string>& domains) {
  DomainResults out;
  for (size_t i = 0; i < domains.size(); ++i) {
    const double* f = packed.data() + i * kFields;
    DomainStats s;
    s.tokens = static_cast<int64_t>(f[0]);
    s.sequences = static_cast<int64_t>(f[1]);
    s.loss_sum = f[2];
    s.seq_mean_sum = f[3];
    s.seq_mean_sq = f[4];
    s.bytes = f[5];
    if (s.tokens > 0) out[domains[i]] = s;
  }
  return out;
}

}  // namespace forge::gate
