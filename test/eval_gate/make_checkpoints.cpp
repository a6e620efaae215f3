// Test fixture for forge-gate: trains a tiny model on a dataset's train split and commits
//   RUN/checkpoints/milestone/step-<A>   (the parent)
//   RUN/checkpoints/milestone/step-<B>   (trained further on the same data)
//   DAMAGED/checkpoints/milestone/step-<B> (the step-B weights with heavy noise: a valid checkpoint of a
//                                         broken model)
// each recording the spec entries KEY=VALUE given (manifest extra.spec, what forge-gate reads the
// objective from: run.objective=distill distill.teacher=DIR makes distillation candidates).
// Usage: make_checkpoints DATASET RUN DAMAGED A B [KEY=VALUE ...]
#include "forge/ckpt/coordinator.h"
#include "forge/ckpt/saver.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/dataio/reader.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/parallel.h"

#include <cstdio>
#include <random>
#include <string>

namespace {

void save(const std::string& run, forge::trainer::ParallelTrainer& t, const forge::trainer::TrainSpec& spec,
          const std::string& dataset_version, const forge::Json& spec_entries) {
  forge::ckpt::SingleProcessCoordinator coord;
  forge::ckpt::Saver saver(coord, {.run_dir = run});
  forge::ckpt::CheckpointMeta meta;
  meta.step = t.steps_taken();
  meta.dataset_version = dataset_version;
  meta.model_config = forge::trainer::model_spec_json(spec.model);
  if (!spec_entries.empty()) meta.extra["spec"] = spec_entries;
  const auto event = saver.save(forge::ckpt::Tier::kMilestone, meta,
                                forge::trainer::checkpoint_tensors(t.model(), &t.optimizer()));
  if (event.outcome != forge::ckpt::Outcome::kCommitted)
    throw std::runtime_error("save failed: " + event.error);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: make_checkpoints DATASET RUN DAMAGED A B [KEY=VALUE ...]\n");
    return 64;
  }
  return forge::run_cli("make_checkpoints", [&] {
    const std::string dataset = argv[1], run = argv[2], damaged = argv[3];
    const int64_t parent_steps = std::stoll(argv[4]), child_steps = std::stoll(argv[5]);
    forge::Json spec_entries = forge::Json::object();
    for (int i = 6; i < argc; ++i) {
      const std::string entry = argv[i];
      const size_t eq = entry.find('=');
      if (eq == std::string::npos)
        forge::fail(forge::ExitCode::kUsage, "spec entry '{}': expected KEY=VALUE", entry);
      spec_entries[entry.substr(0, eq)] = entry.substr(eq + 1);
    }

    forge::trainer::TrainSpec spec;
    spec.steps = child_steps;
    spec.seed = 7;
    spec.threads = 1;
    spec.batch = 8;
    spec.model = forge::trainer::gpt2_spec(2, 64, 4, 1, 64);  // vocab: the tokenizer's, below
    spec.optim.lr = 3e-3;
    spec.optim.min_lr = 3e-4;
    spec.optim.warmup_steps = 10;

    forge::data::ReaderOptions ro;
    ro.seq_len = static_cast<uint32_t>(spec.model.seq_len);
    ro.global_batch = static_cast<uint32_t>(spec.batch);
    ro.seed = spec.seed;
    forge::data::Reader reader(dataset, ro);
    spec.model.vocab = static_cast<int>(reader.manifest().vocab_size);

    forge::comm::ProcessGroups groups = forge::comm::make_groups(forge::comm::self_comm(), spec.layout);
    forge::trainer::ParallelTrainer t(spec, groups);
    while (t.steps_taken() < child_steps) {
      const forge::MicroBatch batch = reader.next();
      t.step({&batch, 1});
      if (t.steps_taken() == parent_steps) save(run, t, spec, reader.manifest().version, spec_entries);
    }
    save(run, t, spec, reader.manifest().version, spec_entries);

    std::mt19937 rng(1);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (float& w : t.model().weights()) w += noise(rng);
    t.model().weights_changed();
    save(damaged, t, spec, reader.manifest().version, spec_entries);
    return 0;
  });
}
