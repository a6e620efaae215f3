// Hybrid-parallel benchmark: runs ParallelTrainer on the ranks mpirun gives it, on a spec file plus
// --section.key=value overrides, and prints one line of JSON from rank 0: tokens/s, time per step, the
// pipeline bubble and exposed communication, and the bytes each rank handed to its communicators per
// step next to the volume the layout implies analytically (bench/parallel.sh compares the layouts).
//   bench_parallel SPEC.ini [--section.key=value ...]
#include "forge/trainer/parallel.h"
#include "forge/comm/groups.h"
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/trainer/spec.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace forge;
using namespace forge::trainer;
using namespace forge::comm;

namespace {

// Bytes this rank hands to its communicators per step, counted as CommStats counts them (an all-reduce
// its buffer, a reduce-scatter its input, an all-gather its output, a send its payload).
double analytic_bytes(const TrainSpec& s, const ProcessGroups& g, ParallelTrainer& t) {
  const double N = double(s.batch) * s.model.seq_len / g.layout.cp, C = s.model.d_model, m = s.microbatches;
  const GPT& model = t.held_model();
  const double blocks = double(model.slice().blocks(s.model.layers).size());
  const double chunks = model.slice().chunks;
  double floats = 0;
  if (g.layout.tp > 1) {
    // Per micro-batch: forward one all-reduce after each row-parallel product (2 per block), the
    // embedding's, and the classifier's statistics (3 per row) and input gradient; backward 2 per block.
    const double fwd =
        (2 * blocks + (g.first_stage() ? 1 : 0)) * N * C + (g.last_stage() ? 3 * N + N * C : 0);
    floats += m * (fwd + 2 * blocks * N * C);
  }
  // A stage sends each micro-batch's output of every chunk but the head's, and the input gradient of every
  // chunk but the embedding's.
  if (g.layout.pp > 1)
    floats += m * N * C * (2 * chunks - (g.last_stage() ? 1 : 0) - (g.first_stage() ? 1 : 0));
  if (g.layout.dp * g.layout.cp > 1)
    floats += (s.parallel.zero == 1 ? 2.0 : 1.0) * double(t.parameter_bytes() / 8);
  if (g.embed) floats += double(s.model.vocab / g.layout.tp) * C;
  if (g.layout.cp > 1) {
    // Ring attention, per block and micro-batch: the key/value chunks (cp - 1) times forward and backward,
    // the travelling gradient cp times (no document ids on this stream); dense gradients over dp x cp.
    // a2a: all-to-alls of q, k, v and of the output forward, of the output, its gradient and q, k, v's
    // gradient backward (each its whole input: what this rank keeps counts too).
    const double cp = g.layout.cp, kv = std::max(1, s.model.kv_heads / g.layout.tp) * s.model.head_dim;
    const double q = double(s.model.heads / g.layout.tp) * s.model.head_dim;
    floats += s.parallel.cp_comm == ContextComm::kRing ? m * blocks * (3 * cp - 2) * N * 2 * kv
                                                       : m * blocks * N * (2 * (q + 2 * kv) + 3 * q);
  }
  // + the loss and norm reduction, and (dp > 1) the sum of the step's scored weight over the DP group.
  return 4 * floats + 16 + (g.layout.dp * g.layout.cp > 1 ? 8 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  return run_cli("bench_parallel", [&]() -> int {
    if (argc < 2) fail(ExitCode::kUsage, "usage: bench_parallel SPEC.ini [--section.key=value ...]");
    ConfigSchema schema;
    add_trainer_keys(schema);
    const Config config = load_config(schema, argv[1], std::vector<std::string>(argv + 2, argv + argc));
    const TrainSpec spec = train_spec(config);
    auto world = mpi_world();
    ProcessGroups groups = make_groups(std::move(world), spec.layout);
    ParallelTrainer trainer(spec, groups);
    // This rank's micro-batches (the same every step).
    std::vector<MicroBatch> tokens(size_t(spec.microbatches));
    std::vector<int32_t> window(size_t(spec.model.seq_len) + 1);
    uint64_t next = 0;
    for (MicroBatch& b : tokens) {
      b.resize(spec.batch, spec.model.seq_len);
      for (int r = 0; r < spec.batch; ++r) {
        for (auto& t : window) t = int32_t(splitmix64(next++) % uint64_t(spec.model.vocab));
        b.set_window(r, window.data(), uint64_t(r), 0);
      }
    }
    const int warmup = 2;
    double seconds = 0, bubble = 0, comm = 0, bytes = 0, ring = 0, analytic_bubble = 0;
    int64_t step_tokens = 0;
    for (int64_t step = 0; step < spec.steps; ++step) {
      const StepStats st = trainer.step(tokens);
      if (step < warmup) continue;
      seconds += st.seconds;
      bubble += st.bubble_s;
      comm += st.comm_s;
      bytes += double(st.comm_bytes);
      ring += st.cp_comm_s;
      step_tokens = st.tokens;
      analytic_bubble = st.bubble_analytic;
    }
    const double steps = double(spec.steps - warmup);
    // The slowest rank sets the pace; bytes are reported for the rank that moves the most.
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    double worst[7] = {seconds / steps,
                       bubble / steps,
                       comm / steps,
                       bytes / steps,
                       ring / steps,
                       double(trainer.activation_bytes()),
                       double(usage.ru_maxrss) * 1024.0};
    groups.world->all_reduce(worst, 7, CommType::kF64, ReduceOp::kMax)->wait();
    double analytic = analytic_bytes(spec, groups, trainer);
    groups.world->all_reduce(&analytic, 1, CommType::kF64, ReduceOp::kMax)->wait();
    if (groups.rank == 0) {
      const Json out{{"layout", groups.layout.str()},
                     {"schedule", std::string(schedule_name(spec.parallel.pp_schedule))},
                     {"chunks", trainer.held_model().slice().chunks},
                     {"zero", spec.parallel.zero},
                     {"threads_per_rank", spec.threads},
                     {"microbatches", spec.microbatches},
                     {"step_ms", worst[0] * 1e3},
                     {"tokens_per_s", double(step_tokens) / worst[0]},
                     {"bubble_fraction", worst[1] / worst[0]},
                     {"bubble_ideal", analytic_bubble},
                     {"exposed_comm_fraction", worst[2] / worst[0]},
                     {"comm_mb_per_step", worst[3] / 1e6},
                     {"analytic_mb_per_step", analytic / 1e6},
                     {"optimizer_mib_per_rank", double(trainer.optimizer_bytes()) / (1 << 20)},
                     {"activation_mib_per_rank", worst[5] / (1 << 20)},
                     {"peak_rss_mib_per_rank", worst[6] / (1 << 20)},
                     {"cp_comm_fraction", worst[4] / worst[0]}};
      std::printf("%s\n", out.dump().c_str());
    }
    return 0;
  });
}
