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

StageSchedule interleaved(int stages, int stage, int chunks, int micro_batches) {
  const int p = stages, v = chunks, m = micro_batches, total = m * v;
  if (p < 1 || v < 1 || m % p != 0)
    throw std::invalid_argument(fmt::format(
        "interleaved schedule: {} micro-batches are not a multiple of {} stages", micro_batches, stages));
  // The k-th forward (backward) of the stage: group k / (p v) of p micro-batches, chunk (k / p) mod v
  // (backwards run the chunks downwards).
  const auto action = [&](PipeOp op, int k) {
    const int c = (k / p) % v;
    return PipeAction{op, (k / (p * v)) * p + k % p, op == PipeOp::kForward ? c : v - 1 - c};
  };
  const int warmup = m == p ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  StageSchedule s;
  for (int k = 0; k < warmup; ++k) s.push_back(action(PipeOp::kForward, k));
  for (int k = 0; k < total - warmup; ++k) {
    s.push_back(action(PipeOp::kForward, warmup + k));
    s.push_back(action(PipeOp::kBackward, k));
  }
  for (int k = total - warmup; k < total; ++k) s.push_back(action(PipeOp::kBackward, k));
  return s;
}

std::vector<StageSchedule> interleaved(int stages, int chunks, int micro_batches) {
  std::vector<StageSchedule> out;
  for (int s = 0; s < stages; ++s) out.push_back(interleaved(stages, s, chunks, micro_batches));
  return out;
}

std::vector<StageSchedule> zb_h1(int stages, int micro_batches) {
  // Built by running the stages against each other (forward, B and W a unit each): every stage takes its
  // forwards and B passes in 1F1B's order, and runs its oldest pending W where it would otherwise wait for
  // a message, or where another forward would leave more than p micro-batches waiting for their W (the
  // first stage's 1F1B peak, ZB-H1's bound); the rest last.
  const int p = stages, m = micro_batches;
  const std::vector<StageSchedule> order = one_f_one_b(p, m);
  std::vector<StageSchedule> out(static_cast<size_t>(p));
  // done[0 | 1][s][i]: when stage s finished the forward (B) of micro-batch i; negative: not yet.
  std::vector<std::vector<std::vector<double>>> done(
      2, std::vector<std::vector<double>>(size_t(p), std::vector<double>(size_t(m), -1)));
  std::vector<size_t> next(size_t(p), 0);
  std::vector<int> weighed(size_t(p), 0), backed(size_t(p), 0), forwarded(size_t(p), 0);
  std::vector<double> free_at(size_t(p), 0);
  const auto finished = [&](size_t s) { return next[s] == order[s].size() && weighed[s] == m; };
  for (;;) {
    // The stage free earliest that can act: what finishes later cannot unblock it earlier.
    size_t s = size_t(p);
    for (size_t k = 0; k < size_t(p); ++k) {
      if (finished(k)) continue;
      const bool can_weigh = weighed[k] < backed[k];
      bool can_go = can_weigh;
      if (next[k] < order[k].size()) {
        const PipeAction& a = order[k][next[k]];
        const size_t i = size_t(a.micro_batch);
        can_go = can_go || (a.op == PipeOp::kForward ? k == 0 || done[0][k - 1][i] >= 0
                                                     : k + 1 == size_t(p) || done[1][k + 1][i] >= 0);
      }
      if (can_go && (s == size_t(p) || free_at[k] < free_at[s])) s = k;
    }
    if (s == size_t(p)) break;
    const bool pending = weighed[s] < backed[s];
    double ready = -1;  // when the next forward or B could start; negative: its message is not sent yet
    if (next[s] < order[s].size()) {
      const PipeAction& a = order[s][next[s]];
      const size_t i = size_t(a.micro_batch);
      const double* msg = a.op == PipeOp::kForward ? (s == 0 ? nullptr : &done[0][s - 1][i])
                                                   : (s + 1 == size_t(p) ? nullptr : &done[1][s + 1][i]);
      if (msg == nullptr || *msg >= 0) ready = std::max(free_at[s], msg == nullptr ? 0.0 : *msg);
      if (a.op == PipeOp::kForward && forwarded[s] - weighed[s] >= p && pending) ready = -1;
    }
    if (pending && (ready < 0 || ready > free_at[s])) {
      out[s].push_back({PipeOp::kWeight, weighed[s]++});
      free_at[s] += 1;
      continue;
    }
    const PipeAction a = order[s][next[s]++];
    out[s].push_back(a);
    free_at[s] = ready + 1;
    done[a.op == PipeOp::kForward ? 0 : 1][s][size_t(a.micro_batch)] = free_at[s];
    (a.op == PipeOp::kForward ? forwarded : backed)[s]++;
  }
  return out;
}

StageSchedule zb_h1(int stages, int stage, int micro_batches) {
  return zb_h1(stages, micro_batches)[size_t(stage)];
}

int in_flight(const StageSchedule& schedule, int chunk) {
  int now = 0, most = 0;
  for (const PipeAction& a : schedule) {
    if (a.op == PipeOp::kWeight || (chunk >= 0 && a.chunk != chunk)) continue;
    now += a.op == PipeOp::kForward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::vector<int> chunk_slots(const StageSchedule& schedule, int chunks) {
  std::vector<int> out;
  for (int c = 0; c < chunks; ++c) out.push_back(std::max(1, in_flight(schedule, c)));
  return out;
}

int waiting_for_weights(const StageSchedule& schedule) {
  if (std::ranges::none_of(schedule, [](const PipeAction& a) { return a.op == PipeOp::kWeight; })) return 0;
  int now = 0, most = 0;
  for (const PipeAction& a : schedule) {
    if (a.op == PipeOp::kBackward) most = std::max(most, ++now);
    if (a.op == PipeOp::kWeight) --now;
  }
  return most;
}

std::vector<StageSchedule> pipeline_schedule(PipeScheduleKind kind, int stages, int chunks,
                                             int micro_batches) {
  switch (kind) {
    case PipeScheduleKind::kInterleaved:
      return interleaved(stages, chunks, micro_batches);
    case PipeScheduleKind::kZbH1:
      return zb_h1(stages, micro_batches);
    case PipeScheduleKind::k1F1B:
      break;
  }
  return one_f_one_b(stages, micro_batches);
}

namespace {

std::string name(const PipeAction& a, bool chunks) {
  const char op = a.op == PipeOp::kForward ? 'F' : a.op == PipeOp::kBackward ? 'B' : 'W';
  return chunks ? fmt::format("{}{}.{}", op, a.micro_batch, a.chunk) : fmt::format("{}{}", op, a.micro_batch);
}

}  // namespace

ScheduleTiming simulate(const std::vector<StageSchedule>& stages, int micro_batches, double forward_cost,
                        double backward_cost) {
  const size_t p = stages.size(), m = size_t(micro_batches);
  size_t v = 1;  // model chunks a stage
  for (const StageSchedule& st : stages)
    for (const PipeAction& a : st) v = std::max(v, size_t(std::max(a.chunk, 0)) + 1);
  const bool chunked = v > 1;
  // done[op][virtual stage][i]: when that (virtual) stage finished op on micro-batch i (negative: not yet).
  // Stage s's chunk c is virtual stage c x p + s.
  std::vector<std::vector<std::vector<double>>> done(
      3, std::vector<std::vector<double>>(p * v, std::vector<double>(m, -1)));
  std::vector<bool> split(p, false);  // the stage runs W passes apart
  for (size_t s = 0; s < p; ++s)
    for (const PipeAction& a : stages[s]) {
      if (a.micro_batch < 0 || size_t(a.micro_batch) >= m || a.chunk < 0)
        throw std::logic_error(
            fmt::format("stage {}: {} is not one of the {} micro-batches", s, name(a, chunked), m));
      split[s] = split[s] || a.op == PipeOp::kWeight;
    }
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0), busy(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < p; ++s) {
      for (; next[s] < stages[s].size(); ++next[s]) {
        const PipeAction& a = stages[s][next[s]];
        const size_t i = size_t(a.micro_batch), at = size_t(a.chunk) * p + s, op = size_t(a.op);
        if (done[op][at][i] >= 0)
          throw std::logic_error(fmt::format("stage {}: {} runs twice", s, name(a, chunked)));
        if (a.op == PipeOp::kBackward && done[0][at][i] < 0)
          throw std::logic_error(fmt::format("stage {}: {} runs before its forward", s, name(a, chunked)));
        if (a.op == PipeOp::kWeight && done[1][at][i] < 0)
          throw std::logic_error(fmt::format("stage {}: {} runs before its backward", s, name(a, chunked)));
        // The message this action waits for: the previous virtual stage's output, the next one's gradient.
        double ready = free_at[s];
        if (a.op == PipeOp::kForward && at > 0) {
          if (done[0][at - 1][i] < 0) break;
          ready = std::max(ready, done[0][at - 1][i]);
        }
        if (a.op == PipeOp::kBackward && at + 1 < p * v) {
          if (done[1][at + 1][i] < 0) break;
          ready = std::max(ready, done[1][at + 1][i]);
        }
        const double cost = (a.op == PipeOp::kForward ? forward_cost
                             : split[s]               ? backward_cost / 2
                                                      : backward_cost) /
                            double(v);
        done[op][at][i] = free_at[s] = ready + cost;
        busy[s] += cost;
        progress = true;
      }
    }
  }
  ScheduleTiming t;
  for (size_t s = 0; s < p; ++s) {
    if (next[s] < stages[s].size())
      throw std::logic_error(fmt::format("stage {}: {} waits for a message no stage sends (deadlock)", s,
                                         name(stages[s][next[s]], chunked)));
    for (size_t c = 0; c < v; ++c)
      for (size_t i = 0; i < m; ++i) {
        const size_t at = c * p + s;
        const char* missing = done[0][at][i] < 0               ? "forwarded"
                              : done[1][at][i] < 0             ? "backwarded"
                              : split[s] && done[2][at][i] < 0 ? "given its weight pass"
                                                               : nullptr;
        if (missing != nullptr)
          throw std::logic_error(fmt::format("stage {}: micro-batch {}{} is never {}", s, i,
                                             chunked ? fmt::format(" of chunk {}", c) : "", missing));
      }
    t.makespan = std::max(t.makespan, free_at[s]);
  }
  double idle = 0;
  for (size_t s = 0; s < p; ++s) idle += t.makespan - busy[s];
  t.bubble = p > 0 && t.makespan > 0 ? idle / (double(p) * t.makespan) : 0;
  return t;
}

std::string describe(const StageSchedule& schedule) {
  const bool chunked = std::ranges::any_of(schedule, [](const PipeAction& a) { return a.chunk > 0; });
  std::string out;
  for (const PipeAction& a : schedule) {
    if (!out.empty()) out += ' ';
    out += name(a, chunked);
  }
  return out;
}

}  // namespace forge::trainer
