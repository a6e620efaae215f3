// Test oracle for forge-gate's DPO figures, computed another way: each reply's log-probability summed
// from the full logits (GPT::forward_logits and a log-softmax here) rather than the fused classifier's
// per-token losses (ReplyLogps, what the gate uses). Prints, for the first N validation pairs of DOMAIN,
// {"pairs", "accuracy", "reward_margin"} as JSON.
// Usage: pair_margins DATASET DOMAIN MODEL REFERENCE BETA N
#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/dataio/reader.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/model.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

std::unique_ptr<forge::trainer::GPT> load(const std::string& dir) {
  const auto checkpoint = forge::ckpt::Checkpoint::open(dir);
  auto model = std::make_unique<forge::trainer::GPT>(
      forge::trainer::model_spec_from_json(checkpoint.manifest().meta.model_config, dir),
      forge::trainer::ModelSetup{});
  forge::trainer::load_checkpoint(checkpoint, *model, nullptr);
  return model;
}

// log p(chosen reply), log p(rejected reply) of the pair in row 0 of `batch`.
std::vector<double> reply_logps(forge::trainer::GPT& model, const forge::MicroBatch& batch) {
  const size_t T = size_t(batch.seq_len), V = size_t(model.config().vocab);
  std::vector<float> logits(T * V);
  model.forward_logits(batch, logits);
  std::vector<double> out(2, 0.0);
  for (size_t i = 0; i < T; ++i) {
    if (batch.weight(i) == 0) continue;
    const float* row = logits.data() + i * V;
    double sum = 0;
    for (size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]));
    out[size_t(batch.segments[i])] += double(row[size_t(batch.targets[i])]) - std::log(sum);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: pair_margins DATASET DOMAIN MODEL REFERENCE BETA N\n");
    return 64;
  }
  return forge::run_cli("pair_margins", [&] {
    const auto model = load(argv[3]), reference = load(argv[4]);
    const double beta = std::stod(argv[5]);
    forge::data::ReaderOptions ro;
    ro.seq_len = uint32_t(model->config().seq_len);
    ro.global_batch = 1;
    ro.split = "valid";
    ro.domain = argv[2];
    ro.prefetch = 0;
    ro.document_mask = ro.loss_mask = true;
    forge::data::Reader reader(argv[1], ro);
    const uint64_t n = std::min<uint64_t>(reader.num_samples(), std::stoull(argv[6]));
    forge::MicroBatch batch;
    batch.resize(1, model->config().seq_len);
    double pairs = 0, right = 0, margins = 0;
    for (uint64_t id = 0; id < n; ++id) {
      reader.read_sample(id, batch, 0);
      const auto lp = reply_logps(*model, batch), ref = reply_logps(*reference, batch);
      const double margin = beta * ((lp[0] - ref[0]) - (lp[1] - ref[1]));
      pairs += 1;
      right += margin > 0 ? 1 : 0;
      margins += margin;
    }
    std::cout << forge::Json{{"pairs", pairs},
                             {"accuracy", right / pairs},
                             {"reward_margin", margins / pairs}}
                     .dump()
              << "\n";
    return 0;
  });
}
