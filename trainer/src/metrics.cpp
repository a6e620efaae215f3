#include "forge/trainer/metrics.h"

#include "forge/common/error.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

namespace forge::trainer {

Json step_outcome(const StepStats& s, int64_t tokens_so_far) {
  Json record{{"step", s.step}, {"loss", s.loss},          {"grad_norm", s.grad_norm},
              {"lr", s.lr},     {"tokens", tokens_so_far}, {"scored_tokens", s.scored}};
  for (const auto& [name, value] : s.objective) record[name] = value;
  return record;
}

Json metrics_record(const StepStats& s, int64_t tokens_so_far, double flops_per_token, double peak_gflops) {
  const double tps = s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0;
  Json record = step_outcome(s, tokens_so_far);
  record["step_ms"] = s.seconds * 1e3;
  record["tokens_per_s"] = tps;
  record["mfu"] = peak_gflops > 0 ? tps * flops_per_token / (peak_gflops * 1e9) : 0.0;
  // Per MoE block: the load of its experts over the step, and what the router did.
  for (const RouterStats& r : s.moe) {
    if (r.tokens.empty()) continue;
    const auto [lo, hi] = std::minmax_element(r.tokens.begin(), r.tokens.end());
    double mean = 0, var = 0;
    for (double t : r.tokens) mean += t / double(r.tokens.size());
    for (double t : r.tokens) var += (t - mean) * (t - mean) / double(r.tokens.size());
    const double mb = std::max(r.micro_batches, 1.0);
    record["moe"].push_back({{"layer", r.layer},
                             {"tokens", r.tokens},
                             {"tokens_min", *lo},
                             {"tokens_max", *hi},
                             {"tokens_cv", mean > 0 ? std::sqrt(var) / mean : 0.0},
                             {"dropped_fraction", r.assignments > 0 ? r.dropped / r.assignments : 0.0},
                             {"router_entropy", r.token_count > 0 ? r.entropy / r.token_count : 0.0},
                             {"aux_loss", r.aux / mb},
                             {"z_loss", r.z / mb}});
  }
  if (!s.moe.empty()) {
    record["expert_comm_ms"] = s.expert_comm_s * 1e3;
    record["expert_comm_bytes"] = s.expert_comm_bytes;
  }
  if (s.cp_comm_bytes > 0) {
    record["cp_comm_ms"] = s.cp_comm_s * 1e3;
    record["cp_comm_bytes"] = s.cp_comm_bytes;
  }
  if (s.bubble_analytic > 0) {  // a pipeline: the measured bubble next to what the schedule implies
    record["bubble_fraction"] = s.seconds > 0 ? s.bubble_s / s.seconds : 0.0;
    record["bubble_analytic"] = s.bubble_analytic;
  }
  if (s.state_bytes > 0) record["state_mib"] = double(s.state_bytes) / double(1 << 20);
  if (s.gather_bytes > 0) {
    record["gather_ms"] = s.gather_s * 1e3;
    record["gather_bytes"] = s.gather_bytes;
  }
  return record;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_step, const Json& resumed_outcome)
    : path_(path) {
  std::string kept;
  if (resumed_step > 0) {
    bool has_resumed_step = false;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      const int64_t step = record.is_object() ? record.value("step", int64_t{0}) : 0;
      // Steps after the checkpoint were trained again after the resume: drop their first records.
      if (record.is_object() && step <= resumed_step) kept += line + '\n';
      has_resumed_step = has_resumed_step || step == resumed_step;
    }
    // The checkpoint commits in the background while the step's record waits for the ranks' status
    // exchange: a process lost in between leaves the checkpoint without its record.
    if (!has_resumed_step && resumed_outcome.is_object() &&
        resumed_outcome.value("step", int64_t{0}) == resumed_step) {
      restored_ = resumed_outcome;
      restored_["restored"] = true;
      kept += restored_.dump() + '\n';
    }
  }
  write_file_atomic(path, kept);
  out_.open(path, std::ios::app);
  if (!out_) fail(ExitCode::kIo, "cannot write metrics file {}: {}", path, std::strerror(errno));
}

void MetricsWriter::write(const Json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) fail(ExitCode::kIo, "cannot write metrics file {}: {}", path_, std::strerror(errno));
}

}  // namespace forge::trainer
