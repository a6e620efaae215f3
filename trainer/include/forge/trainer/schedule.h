// Pipeline schedules as data: the ordered actions each pipeline stage runs in one step (as torchtitan's
// and Megatron-core's schedules are lists the runtime executes). ParallelTrainer::step runs its stage's
// list; the lists of all stages are checked and timed here, without a rank: every micro-batch's forward
// before its backward on every stage, each activation and gradient sent to a stage that receives it, no
// stage waiting for a message that never comes, the micro-batches in flight bounded as the schedule
// claims, and the bubble the schedule implies.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

// kBackward is the whole backward of a micro-batch, or, in a schedule that splits it (zero-bubble), the
// input gradient only (B), its weight gradients being the later kWeight (W).
enum class PipeOp { kForward, kBackward, kWeight };

struct PipeAction {
  PipeOp op;
  int micro_batch;
  // The model chunk of an interleaved schedule: stage s's chunk c holds virtual stage c x stages + s.
  int chunk = 0;
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

// Interleaved 1F1B (Megatron-core's): `chunks` model chunks a stage; the micro-batches go through in groups
// of `stages`, each group through every chunk in turn, with (p - s - 1) x 2 + (v - 1) x p warm-up
// forwards on stage s (all of them when m = p). micro_batches must be a multiple of stages. A chunk's
// forward and backward cost 1/v of a stage's, and the bubble is (p - 1) / (v·m + p - 1) of the step.
StageSchedule interleaved(int stages, int stage, int chunks, int micro_batches);
std::vector<StageSchedule> interleaved(int stages, int chunks, int micro_batches);

// ZB-H1 (zero-bubble, arXiv 2401.10241): 1F1B's forwards and input-gradient backwards (B), the weight-
// gradient passes (W) moved to where a stage would wait for a message, at most p micro-batches waiting for
// theirs on any stage. With F, B and W a unit each the bubble is (p - 1)(F + B - W), a third of 1F1B's
// (p - 1)(F + B + W): (p - 1) / (3m + p - 1) of the step.
StageSchedule zb_h1(int stages, int stage, int micro_batches);
std::vector<StageSchedule> zb_h1(int stages, int micro_batches);

// parallel.pp_schedule.
enum class PipeScheduleKind { k1F1B, kInterleaved, kZbH1 };
inline constexpr PipeScheduleKind kPipeSchedules[] = {PipeScheduleKind::k1F1B, PipeScheduleKind::kInterleaved,
                                                      PipeScheduleKind::kZbH1};
// Its key value.
constexpr std::string_view schedule_name(PipeScheduleKind kind) {
  return kind == PipeScheduleKind::k1F1B          ? "1f1b"
         : kind == PipeScheduleKind::kInterleaved ? "interleaved"
                                                  : "zb-h1";
}
// Every stage's schedule of `kind`; `chunks` model chunks a stage (interleaved's; 1 for the others).
std::vector<StageSchedule> pipeline_schedule(PipeScheduleKind kind, int stages, int chunks,
                                             int micro_batches);

// The most activation sets forwarded and not yet backwarded (B) at any point of `schedule`: the slots
// the stage holds (a chunk's each, in an interleaved schedule; a micro-batch waiting for its W keeps only
// what the weight gradients read, not counted). With `chunk` >= 0, those of that model chunk only.
int in_flight(const StageSchedule& schedule, int chunk = -1);
// The activation sets each of `chunks` model chunks needs to run `schedule`: its in_flight (at least 1).
std::vector<int> chunk_slots(const StageSchedule& schedule, int chunks);
// A schedule that splits its backwards (kWeight actions): the most micro-batches past their B and waiting
// for their W at any point (what ZB-H1 keeps for the weight gradients); 0 for one that does not.
int waiting_for_weights(const StageSchedule& schedule);

// The schedules of stages 0..p-1 run against each other: forward i of a (virtual) stage starts once the
// one before sent its output (forward i done there), backward i once the one after sent its input
// gradient (backward i done there) and forward i ran here; a weight pass after its backward. A forward
// costs `forward_cost`, a backward `backward_cost` (half of it each for B and W where a stage splits
// them), both divided among a stage's chunks; messages cost nothing. Throws std::logic_error naming the
// stage and the action when a stage runs an action twice, a backward before its forward (a W before its
// B), misses one of the `micro_batches`, or waits for a message no stage will send (a deadlock).
struct ScheduleTiming {
  double makespan = 0;  // the step, from the first action to the last
  double bubble = 0;    // the stages' idle time within the step, as a fraction of stages x makespan
};
ScheduleTiming simulate(const std::vector<StageSchedule>& stages, int micro_batches, double forward_cost = 1,
                        double backward_cost = 2);

// A stage's schedule in one line: "F0 F1 B0 F2 B1 B2"; "F0.1" is micro-batch 0 on chunk 1, "W0" a
// weight pass.
std::string describe(const StageSchedule& schedule);

}  // namespace forge::trainer
