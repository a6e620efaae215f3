#include "forge/trainer/metrics.h"

#include "forge/common/error.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace forge::trainer {

Json metrics_record(const StepStats& s, int64_t tokens_so_far, double flops_per_token, double peak_gflops) {
  const double tps = s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0;
  Json record{{"step", s.step},
              {"loss", s.loss},
              {"grad_norm", s.grad_norm},
              {"lr", s.lr},
              {"tokens", tokens_so_far},
              {"scored_tokens", s.scored},
              {"step_ms", s.seconds * 1e3},
              {"tokens_per_s", tps},
              {"mfu", peak_gflops > 0 ? tps * flops_per_token / (peak_gflops * 1e9) : 0.0}};
  for (const auto& [name, value] : s.objective) record[name] = value;
  return record;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_step) : path_(path) {
  std::string kept;
  if (resumed_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      // Steps after the checkpoint were trained again after the resume: drop their first records.
      if (record.is_object() && record.value("step", int64_t{0}) <= resumed_step) kept += line + '\n';
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
