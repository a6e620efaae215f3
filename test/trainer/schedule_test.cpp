// Pipeline schedules on their own (schedule.h): every stage's list complete and ordered, the stages'
// messages matched without a deadlock, the micro-batches in flight and the bubble as the schedule claims;
// and broken schedules caught, naming the stage and the action.
#include "forge/trainer/schedule.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

using namespace forge::trainer;

TEST_CASE("1F1B: warm-up forwards, then one forward and one backward, then the drain", "[schedule]") {
  CHECK(describe(one_f_one_b(2, 0, 3)) == "F0 F1 B0 F2 B1 B2");
  CHECK(describe(one_f_one_b(2, 1, 3)) == "F0 B0 F1 B1 F2 B2");
  CHECK(describe(one_f_one_b(4, 0, 2)) == "F0 F1 B0 B1");  // fewer micro-batches than stages
  CHECK(describe(one_f_one_b(1, 0, 3)) == "F0 B0 F1 B1 F2 B2");
}

TEST_CASE("1F1B over every stage: complete, deadlock-free, bounded in flight, bubble (p-1)/(m+p-1)",
          "[schedule]") {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      CAPTURE(p, m);
      const std::vector<StageSchedule> stages = one_f_one_b(p, m);
      for (int s = 0; s < p; ++s) {
        CHECK(stages[size_t(s)].size() == size_t(2 * m));
        CHECK(in_flight(stages[size_t(s)]) == std::min(p - s, m));
      }
      // A forward costs 1, a backward 2 (their FLOP ratio): the step lasts (m + p - 1) x 3 units.
      const ScheduleTiming t = simulate(stages, m, 1.0, 2.0);
      CHECK(t.makespan == Approx(3.0 * (m + p - 1)));
      CHECK(t.bubble == Approx(double(p - 1) / double(m + p - 1)).margin(1e-12));
    }
}

TEST_CASE("broken schedules are caught, naming the stage and the action", "[schedule]") {
  const auto F = [](int i) { return PipeAction{PipeOp::kForward, i}; };
  const auto B = [](int i) { return PipeAction{PipeOp::kBackward, i}; };
  // Stage 1 forwards micro-batch 1 before backwarding 0, while stage 0 waits for that backward first.
  CHECK_THROWS_WITH(simulate({{F(0), B(0), F(1), B(1)}, {F(0), F(1), B(0), B(1)}}, 2),
                    Catch::Contains("stage 0: B0 waits for a message no stage sends (deadlock)"));
  CHECK_THROWS_WITH(simulate({{B(0), F(0)}}, 1), Catch::Contains("stage 0: B0 runs before its forward"));
  CHECK_THROWS_WITH(simulate({{F(0), B(0), F(0), B(0)}}, 1), Catch::Contains("stage 0: F0 runs twice"));
  CHECK_THROWS_WITH(simulate({{F(0), B(0)}}, 2),
                    Catch::Contains("stage 0: micro-batch 1 is never forwarded"));
  CHECK_THROWS_WITH(simulate({{F(0), F(1), B(0)}}, 2),
                    Catch::Contains("stage 0: micro-batch 1 is never backwarded"));
  CHECK_THROWS_WITH(simulate({{F(2), B(2)}}, 2), Catch::Contains("stage 0: F2 is not one of the 2"));
}

TEST_CASE("interleaved 1F1B: chunks in groups of p micro-batches, bubble (p-1)/(v m+p-1)", "[schedule]") {
  // Two stages, two chunks (virtual stages 0 1 | 2 3), four micro-batches: stage 0 warms up with
  // (2 - 0 - 1) x 2 + (2 - 1) x 2 = 4 forwards; its backwards run chunk 1 before chunk 0.
  CHECK(describe(interleaved(2, 0, 2, 4)) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int groups : {1, 2, 4}) {
        const int m = groups * p;
        CAPTURE(p, v, m);
        const std::vector<StageSchedule> stages = interleaved(p, v, m);
        for (int s = 0; s < p; ++s) {
          CHECK(stages[size_t(s)].size() == size_t(2 * m * v));
          // Megatron's warm-up plus the steady state's one: (p - s - 1) x 2 + (v - 1) x p + 1 chunks'
          // activations (all of them when m = p, which runs every forward first).
          const int most = m == p ? m * v : std::min((p - s - 1) * 2 + (v - 1) * p + 1, m * v);
          CHECK(in_flight(stages[size_t(s)]) == most);
        }
        CHECK(simulate(stages, m).bubble == Approx(double(p - 1) / double(v * m + p - 1)).margin(1e-12));
        CHECK(simulate(stages, m).bubble < simulate(one_f_one_b(p, m), m).bubble);
      }
  CHECK_THROWS_WITH(interleaved(4, 2, 6), Catch::Contains("6 micro-batches are not a multiple of 4 stages"));
}

TEST_CASE("ZB-H1: weight passes fill the waits, a third of 1F1B's bubble at the same peak", "[schedule]") {
  // The last stages defer their W passes; the first runs them where it waits for a gradient.
  CHECK(describe(zb_h1(2, 0, 4)) == "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  CHECK(describe(zb_h1(2, 1, 4)) == "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      CAPTURE(p, m);
      const std::vector<StageSchedule> stages = zb_h1(p, m);
      const std::vector<StageSchedule> plain = one_f_one_b(p, m);
      for (int s = 0; s < p; ++s) {
        const StageSchedule& st = stages[size_t(s)];
        CHECK(st.size() == size_t(3 * m));
        // Forwards and B passes in 1F1B's order: the same activation slots.
        StageSchedule fb;
        std::ranges::copy_if(st, std::back_inserter(fb),
                             [](const PipeAction& a) { return a.op != PipeOp::kWeight; });
        CHECK(fb == plain[size_t(s)]);
        CHECK(in_flight(st) == std::min(p - s, m));
        // At most p micro-batches wait for their W (the first stage's 1F1B peak).
        int waiting = 0, most = 0;
        for (const PipeAction& a : st) {
          waiting += a.op == PipeOp::kForward ? 1 : a.op == PipeOp::kWeight ? -1 : 0;
          most = std::max(most, waiting);
        }
        CHECK(most <= p);
        // What the runtime keeps for the W passes: the B passes done and not yet weighed, at most.
        CHECK(waiting_for_weights(st) >= 1);
        CHECK(waiting_for_weights(st) <= most);
        CHECK(waiting_for_weights(plain[size_t(s)]) == 0);
      }
      // F, B and W a unit each (a backward twice a forward): (p - 1)(F + B - W) idle a stage once there
      // are at least as many micro-batches as stages; less than 1F1B's always, when there is a pipeline.
      const double bubble = simulate(stages, m).bubble;
      if (m >= p) CHECK(bubble == Approx(double(p - 1) / double(3 * m + p - 1)).margin(1e-12));
      if (p > 1) CHECK(bubble < simulate(plain, m).bubble);
    }
}

TEST_CASE("broken chunked and split schedules are caught", "[schedule]") {
  const auto F = [](int i, int c) { return PipeAction{PipeOp::kForward, i, c}; };
  const auto B = [](int i, int c) { return PipeAction{PipeOp::kBackward, i, c}; };
  const auto W = [](int i) { return PipeAction{PipeOp::kWeight, i}; };
  CHECK_THROWS_WITH(simulate({{F(0, 0), B(0, 0), W(0), W(0)}}, 1), Catch::Contains("stage 0: W0 runs twice"));
  CHECK_THROWS_WITH(simulate({{F(0, 0), W(0), B(0, 0)}}, 1),
                    Catch::Contains("stage 0: W0 runs before its backward"));
  CHECK_THROWS_WITH(simulate({{F(0, 0), F(1, 0), B(0, 0), B(1, 0), W(0)}}, 2),
                    Catch::Contains("stage 0: micro-batch 1 is never given its weight pass"));
  // One stage, two chunks: chunk 1's forward needs chunk 0's, its backward runs first.
  CHECK(simulate({{F(0, 0), F(0, 1), B(0, 1), B(0, 0)}}, 1).bubble == Approx(0.0).margin(1e-12));
  CHECK_THROWS_WITH(simulate({{F(0, 1), F(0, 0), B(0, 1), B(0, 0)}}, 1),
                    Catch::Contains("stage 0: F0.1 waits for a message no stage sends (deadlock)"));
  CHECK_THROWS_WITH(simulate({{F(0, 0), F(0, 1), B(0, 1)}}, 1),
                    Catch::Contains("stage 0: micro-batch 0 of chunk 0 is never backwarded"));
}

TEST_CASE("every pair of stages receives its messages in the order they are sent", "[schedule]") {
  // NCCL matches point-to-point calls by their order between two ranks, not by tag (comm.h): each stage's
  // sends to a neighbour, in its schedule's order, must be what the neighbour receives in its own. A chunk
  // sends its output to the next virtual stage and its input gradient to the previous one (ParallelTrainer;
  // from the last stage to the first stage's next chunk); a message is (direction, micro-batch, the
  // activation's receiving or the gradient's sending chunk).
  using Message = std::tuple<int, int, int>;
  for (const PipeScheduleKind kind : kPipeSchedules)
    for (int p : {2, 3, 4, 8})
      for (int m : {p, 2 * p, 4 * p})
        for (int v : {1, 2, 3}) {
          if (v > 1 && kind != PipeScheduleKind::kInterleaved) continue;
          CAPTURE(std::string(schedule_name(kind)), p, m, v);
          const std::vector<StageSchedule> stages = pipeline_schedule(kind, p, v, m);
          std::map<std::pair<int, int>, std::vector<Message>> sent, received;
          for (int s = 0; s < p; ++s) {
            const int next = (s + 1) % p, prev = (s + p - 1) % p, wrap = s == p - 1 ? 1 : 0;
            for (const PipeAction& a : stages[size_t(s)]) {
              const int c = a.chunk, i = a.micro_batch;
              const bool enters = s == 0 && c == 0, leaves = s == p - 1 && c == v - 1;
              if (a.op == PipeOp::kForward) {
                if (!enters) received[{prev, s}].emplace_back(0, i, c);
                if (!leaves) sent[{s, next}].emplace_back(0, i, c + wrap);
              } else if (a.op == PipeOp::kBackward) {
                if (!leaves) received[{next, s}].emplace_back(1, i, c + wrap);
                if (!enters) sent[{s, prev}].emplace_back(1, i, c);
              }
            }
          }
          CHECK(sent == received);
        }
}
