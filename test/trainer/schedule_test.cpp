// Pipeline schedules on their own (schedule.h): every stage's list complete and ordered, the stages'
// messages matched without a deadlock, the micro-batches in flight and the bubble as the schedule claims;
// and broken schedules caught, naming the stage and the action.
#include "forge/trainer/schedule.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>

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
