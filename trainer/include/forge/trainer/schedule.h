// Pipeline schedules as data: the ordered actions each pipeline stage runs in one step (as torchtitan's
// and Megatron-core's schedules are lists the runtime executes). ParallelTrainer::step runs its stage's
// list; the lists of all stages are checked and timed here, without a rank: every micro-batch's forward
// before its backward on every stage, each activation and gradient sent to a stage that receives it, no
// stage waiting for a message that never comes, the micro-batches in flight bounded as the schedule
// claims, and the bubble the schedule implies.
#pragma once

#include <string>
#include <vector>

namespace forge::trainer {

enum class PipeOp { kForward, kBackward };

struct PipeAction {
  PipeOp op;
  int micro_batch;
  bool operator==(const PipeAction&) const = default;
};

// One stage's actions in one step, in the order it runs them.
using StageSchedule = std::vector<PipeAction>;

// 1F1B (PipeDream-flush, Megatron's default): stage s of p runs min(p - s - 1, m) warm-up forwards, then
// one forward and one backward alternately, then the remaining backwards. At most min(p - s, m)
// micro-batches are in flight on stage s; the bubble is (p - 1) / (m + p - 1) of the step.
StageSchedule one_f_one_b(int stages, int stage, int micro_batches);
// Every stage's, 0..stages-1.
std::vector<StageSchedule> one_f_one_b(int stages, int micro_batches);

// The most micro-batches forwarded and not yet backwarded at any point of `schedule`: the activation
// slots the stage holds.
int in_flight(const StageSchedule& schedule);

// The schedules of stages 0..p-1 run against each other: forward i on stage s starts once stage s-1 sent
// its output (forward i done there), backward i once stage s+1 sent its input gradient (backward i done
// there) and forward i ran on s; a forward costs `forward_cost`, a backward `backward_cost`, messages
// nothing. Throws std::logic_error naming the stage and the action when a stage runs an action twice,
// a backward before its forward, misses one of the `micro_batches`, or waits for a message no stage
// will send (a deadlock).
struct ScheduleTiming {
  double makespan = 0;  // the step, from the first action to the last
  double bubble = 0;    // the stages' idle time within the step, as a fraction of stages x makespan
};
ScheduleTiming simulate(const std::vector<StageSchedule>& stages, int micro_batches, double forward_cost = 1,
                        double backward_cost = 2);

// A stage's schedule in one line: "F0 F1 B0 F2 B1 B2".
std::string describe(const StageSchedule& schedule);

}  // namespace forge::trainer
