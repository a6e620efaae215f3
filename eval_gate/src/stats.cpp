#include "forge/eval_gate/stats.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace forge::gate {

void Moments::add(double x) {
  n += 1;
  sum += x;
  sq += x * x;
}

void Moments::merge(const Moments& o) {
  n += o.n;
  sum += o.sum;
  sq += o.sq;
}

double Moments::mean() const {
  return n > 0 ? sum / n : NAN;
}

double Moments::se() const {
  if (n < 2) return 0;
  const double m = sum / n;
  const double var = std::max(0.0, (sq - n * m * m) / (n - 1));
  return std::sqrt(var / n);
}

Json Moments::to_json() const {
  return Json::array({n, sum, sq});
}

Moments Moments::from_json(const Json& j) {
  return {j.at(0).get<double>(), j.at(1).get<double>(), j.at(2).get<double>()};
}

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
  kl_sum += o.kl_sum;
  kl_seq.merge(o.kl_seq);
  margin.merge(o.margin);
  correct.merge(o.correct);
}

double DomainStats::mean_loss() const {
  return tokens > 0 ? loss_sum / static_cast<double>(tokens) : NAN;
}

double DomainStats::loss_stderr() const {
  return Moments{static_cast<double>(sequences), seq_mean_sum, seq_mean_sq}.se();
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

double DomainStats::kl() const {
  return kl_seq.n > 0 && tokens > 0 ? kl_sum / static_cast<double>(tokens) : NAN;
}

double DomainStats::kl_stderr() const {
  return kl_seq.se();
}

Json DomainStats::to_json() const {
  Json j = {{"tokens", tokens},           {"sequences", sequences}, {"loss", mean_loss()},
            {"loss_se", loss_stderr()},   {"ppl", perplexity()},    {"bpb", bits_per_byte()},
            {"bpb_se", bpb_stderr()},     {"loss_sum", loss_sum},   {"seq_mean_sum", seq_mean_sum},
            {"seq_mean_sq", seq_mean_sq}, {"bytes", bytes}};
  if (kl_seq.n > 0) {
    j["kl"] = kl();
    j["kl_se"] = kl_stderr();
    j["kl_sum"] = kl_sum;
    j["kl_seq"] = kl_seq.to_json();
  }
  if (margin.n > 0) {
    j["pairs"] = static_cast<int64_t>(margin.n);
    j["accuracy"] = correct.mean();
    j["accuracy_se"] = correct.se();
    j["reward_margin"] = margin.mean();
    j["reward_margin_se"] = margin.se();
    j["margins"] = margin.to_json();
    j["correct"] = correct.to_json();
  }
  return j;
}

DomainStats DomainStats::from_json(const Json& j) {
  DomainStats s;
  s.tokens = j.at("tokens").get<int64_t>();
  s.sequences = j.at("sequences").get<int64_t>();
  s.loss_sum = j.at("loss_sum").get<double>();
  s.seq_mean_sum = j.at("seq_mean_sum").get<double>();
  s.seq_mean_sq = j.at("seq_mean_sq").get<double>();
  s.bytes = j.at("bytes").get<double>();
  if (j.contains("kl_seq")) {
    s.kl_sum = j.at("kl_sum").get<double>();
    s.kl_seq = Moments::from_json(j.at("kl_seq"));
  }
  if (j.contains("margins")) {
    s.margin = Moments::from_json(j.at("margins"));
    s.correct = Moments::from_json(j.at("correct"));
  }
  return s;
}

namespace {
constexpr int kFields = 16;
}

std::vector<double> pack(const DomainResults& results, const std::vector<std::string>& domains) {
  std::vector<double> out;
  out.reserve(domains.size() * kFields);
  for (const auto& d : domains) {
    const auto it = results.find(d);
    const DomainStats s = it == results.end() ? DomainStats{} : it->second;
    out.insert(out.end(),
               {static_cast<double>(s.tokens), static_cast<double>(s.sequences), s.loss_sum, s.seq_mean_sum,
                s.seq_mean_sq, s.bytes, s.kl_sum, s.kl_seq.n, s.kl_seq.sum, s.kl_seq.sq, s.margin.n,
                s.margin.sum, s.margin.sq, s.correct.n, s.correct.sum, s.correct.sq});
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
    s.kl_sum = f[6];
    s.kl_seq = {f[7], f[8], f[9]};
    s.margin = {f[10], f[11], f[12]};
    s.correct = {f[13], f[14], f[15]};
    if (s.tokens > 0) out[domains[i]] = s;
  }
  return out;
}

}  // namespace forge::gate
