// The pipeline schedules run by the runtime (parallel.pp_schedule): on `pp` MPI ranks, two steps of an
// 8-block GPT-2 under interleaved (2 model chunks a stage) and under ZB-H1 (weight gradients in their own
// passes) must form the gradients of 1F1B's steps on the same batches within 1e-6 (FP32; measured: bit
// for bit, each layer's micro-batches being summed in the same order), with the same loss, and leave the
// same weights; so must a forward-only loss (loss_of). Their analytic bubbles are below 1F1B's.
//   schedules_test PP
#include "forge/comm/groups.h"
#include "forge/trainer/parallel.h"
#include "support/training.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace forge::trainer;
using namespace forge::comm;

namespace {

constexpr double kGradAbsTol = 1e-6;

struct Result {
  double loss = 0, forward_loss = 0, bubble = 0;
  std::vector<float> grads, weights;
};

Result run(PipeScheduleKind kind, int pp, const std::vector<forge::MicroBatch>& batches) {
  TrainSpec s;
  s.steps = 2;
  s.seed = 77;
  s.threads = 1;
  s.batch = batches[0].rows;
  s.microbatches = int(batches.size());
  s.model = gpt2_spec(8, 32, 4, 64, 16);
  s.optim.lr = 1e-2;
  s.optim.grad_clip = 0;  // the gradients stay as the backward formed them
  s.layout.pp = pp;
  s.parallel.pp_schedule = kind;
  s.parallel.pp_virtual = kind == PipeScheduleKind::kInterleaved ? 2 : 1;
  ProcessGroups groups = make_groups(mpi_world(), s.layout);
  ParallelTrainer t(s, groups);
  t.step(batches);  // the second step reuses the slots and the weight-gradient queues
  const StepStats st = t.step(batches);
  Result r{st.loss, t.loss_of(batches[0]), st.bubble_analytic, {}, {}};
  // The stages hold other blocks under each schedule: compare the logical model, each tensor from the
  // stage holding it (the tied embedding from the first).
  GPT& m = t.model();
  const std::vector<ParamInfo> whole = parameter_table(s.model);
  const ParamInfo& end = whole.back();
  for (auto* out : {&r.grads, &r.weights}) out->assign(end.offset + end.numel, 0.0f);
  for (const ParamInfo& p : m.params()) {
    if (p.name == "wte.weight" && !groups.first_stage()) continue;
    const auto at = std::ranges::find_if(whole, [&](const ParamInfo& w) { return w.name == p.name; });
    std::ranges::copy(m.grad(p.name), r.grads.begin() + ptrdiff_t(at->offset));
    std::ranges::copy(m.weight(p.name), r.weights.begin() + ptrdiff_t(at->offset));
  }
  for (auto* out : {&r.grads, &r.weights}) groups.world->all_reduce_sum(out->data(), out->size());
  return r;
}

double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(double(a[i]) - double(b[i])));
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: schedules_test PP\n");
    return 2;
  }
  const int pp = std::atoi(argv[1]);
  // 2 x pp micro-batches of 2 sequences: interleaved takes them in groups of pp.
  const int m = 2 * pp, rows = 2, T = 16;
  std::vector<forge::MicroBatch> batches;
  for (int i = 0; i < m; ++i) {
    std::vector<int32_t> tokens(size_t(rows) * (T + 1));
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = int32_t((k * 7 + size_t(i) * 13 + k * k % 5) % 64);
    batches.push_back(forge::test::window_batch(tokens, rows, T, uint64_t(i * rows)));
  }
  const Result base = run(PipeScheduleKind::k1F1B, pp, batches);
  bool ok = true;
  const std::unique_ptr<Comm> world = mpi_world();
  for (const PipeScheduleKind kind : {PipeScheduleKind::kInterleaved, PipeScheduleKind::kZbH1}) {
    const Result r = run(kind, pp, batches);
    const double g = worst(base.grads, r.grads), w = worst(base.weights, r.weights);
    // Interleaved divides 1F1B's bubble by its chunks, ZB-H1 by three (m >= pp): both below 1F1B's.
    const bool pass = g <= kGradAbsTol && w <= kGradAbsTol && r.loss == base.loss &&
                      std::abs(r.forward_loss - base.forward_loss) <= 1e-6 * std::abs(base.forward_loss) &&
                      r.bubble < base.bubble;
    ok = ok && pass;
    if (world->rank() == 0)
      std::printf(
          "pp%d %s vs 1f1b: loss %.7f vs %.7f, forward loss %.7f vs %.7f, gradients %.2e, "
          "weights %.2e apart (tol %.0e), analytic bubble %.3f vs %.3f: %s\n",
          pp, std::string(schedule_name(kind)).c_str(), r.loss, base.loss, r.forward_loss, base.forward_loss,
          g, w, kGradAbsTol, r.bubble, base.bubble, pass ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
}
