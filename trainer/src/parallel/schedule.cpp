#include "forge/trainer/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace forge::trainer {

StageSchedule one_f_one_b(int stages, int stage, int micro_batches) {
  const int m = micro_batches;
  const int warmup = std::min(stages - stage - 1, m);
  StageSchedule s;
  for (int i = 0; i < warmup; ++i) s.push_back({PipeOp::kForward, i});
  for (int j = 0; j < m - warmup; ++j) {
    s.push_back({PipeOp::kForward, warmup + j});
    s.push_back({PipeOp::kBackward, j});
  }
  for (int j = m - warmup; j < m; ++j) s.push_back({PipeOp::kBackward, j});
  return s;
}

std::vector<StageSchedule> one_f_one_b(int stages, int micro_batches) {
  std::vector<StageSchedule> out;
  for (int s = 0; s < stages; ++s) out.push_back(one_f_one_b(stages, s, micro_batches));
  return out;
}

int in_flight(const StageSchedule& schedule) {
  int now = 0, most = 0;
  for (const PipeAction& a : schedule) {
    now += a.op == PipeOp::kForward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

namespace {

std::string name(const PipeAction& a) {
  return fmt::format("{}{}", a.op == PipeOp::kForward ? 'F' : 'B', a.micro_batch);
}

}  // namespace

ScheduleTiming simulate(const std::vector<StageSchedule>& stages, int micro_batches, double forward_cost,
                        double backward_cost) {
  const size_t p = stages.size(), m = size_t(micro_batches);
  // done[op][s][i]: when stage s finished op on micro-batch i (negative: not yet).
  std::vector<std::vector<std::vector<double>>> done(
      2, std::vector<std::vector<double>>(p, std::vector<double>(m, -1)));
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0), busy(p, 0);
  for (size_t s = 0; s < p; ++s)
    for (const PipeAction& a : stages[s])
      if (a.micro_batch < 0 || size_t(a.micro_batch) >= m)
        throw std::logic_error(fmt::format("stage {}: {} is not one of the {} micro-batches", s, name(a), m));
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < p; ++s) {
      for (; next[s] < stages[s].size(); ++next[s]) {
        const PipeAction& a = stages[s][next[s]];
        const size_t i = size_t(a.micro_batch);
        const bool forward = a.op == PipeOp::kForward;
        if (done[forward ? 0 : 1][s][i] >= 0)
          throw std::logic_error(fmt::format("stage {}: {} runs twice", s, name(a)));
        if (!forward && done[0][s][i] < 0)
          throw std::logic_error(fmt::format("stage {}: {} runs before its forward", s, name(a)));
        // The message this action waits for: the previous stage's output, the next stage's gradient.
        double ready = free_at[s];
        if (forward && s > 0) {
          if (done[0][s - 1][i] < 0) break;
          ready = std::max(ready, done[0][s - 1][i]);
        }
        if (!forward && s + 1 < p) {
          if (done[1][s + 1][i] < 0) break;
          ready = std::max(ready, done[1][s + 1][i]);
        }
        const double cost = forward ? forward_cost : backward_cost;
        done[forward ? 0 : 1][s][i] = free_at[s] = ready + cost;
        busy[s] += cost;
        progress = true;
      }
    }
  }
  ScheduleTiming t;
  for (size_t s = 0; s < p; ++s) {
    if (next[s] < stages[s].size())
      throw std::logic_error(fmt::format("stage {}: {} waits for a message no stage sends (deadlock)", s,
                                         name(stages[s][next[s]])));
    for (size_t i = 0; i < m; ++i)
      if (done[1][s][i] < 0)
        throw std::logic_error(fmt::format("stage {}: micro-batch {} is never {}", s, i,
                                           done[0][s][i] < 0 ? "forwarded" : "backwarded"));
    t.makespan = std::max(t.makespan, free_at[s]);
  }
  double idle = 0;
  for (size_t s = 0; s < p; ++s) idle += t.makespan - busy[s];
  t.bubble = p > 0 && t.makespan > 0 ? idle / (double(p) * t.makespan) : 0;
  return t;
}

std::string describe(const StageSchedule& schedule) {
  std::string out;
  for (const PipeAction& a : schedule) {
    if (!out.empty()) out += ' ';
    out += name(a);
  }
  return out;
}

}  // namespace forge::trainer
