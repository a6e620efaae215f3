#include "data_source.h"

#include "dpo_reference.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/image_text.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/synthetic.h"
#include "rollouts.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

namespace forge::launcher {

namespace {

class Synthetic final : public DataSource {
 public:
  Synthetic(const trainer::TrainSpec& spec, int dp_rank)
      : stream_(uint32_t(spec.model.vocab), spec.seed),
        spec_(spec),
        dp_rank_(dp_rank),
        window_(size_t(spec.model.seq_len) + 1) {}
  void next(int64_t step, std::vector<MicroBatch>& out) override {
    const int b = spec_.batch, m = spec_.microbatches, dp = spec_.layout.dp;
    out.resize(size_t(m));
    for (int i = 0; i < m; ++i) {
      MicroBatch& batch = out[size_t(i)];
      batch.resize(b, spec_.model.seq_len);
      for (int r = 0; r < b; ++r) {
        // Sample ids count the stream's rows: step-major, then micro-batch, DP rank, row.
        const uint64_t id = uint64_t(((step * m + i) * dp + dp_rank_) * b + r);
        stream_.sample(id, window_);
        batch.set_window(r, window_.data(), id, 0);
        if (spec_.model.vision.enabled()) add_picture(batch, r, id);
      }
    }
  }
  // A vision-language model's rows carry one picture each, of seeded noise at a seeded position, so that
  // a trial run or a test without an image-text dataset exercises the tower.
  void add_picture(MicroBatch& batch, int r, uint64_t id) {
    const trainer::VisionSpec& v = spec_.model.vision;
    batch.image_size = v.image_size;
    batch.image_tokens = v.tokens();
    pixels_.resize(batch.image_bytes());
    const uint64_t key = splitmix64(spec_.seed ^ splitmix64(id ^ 0x9e3779b97f4a7c15ull));
    for (size_t i = 0; i < pixels_.size(); i += 8) {
      const uint64_t bits = splitmix64(key + i);
      std::memcpy(pixels_.data() + i, &bits, std::min<size_t>(8, pixels_.size() - i));
    }
    batch.add_image(r, int(key % uint64_t(spec_.model.seq_len - v.tokens() + 1)), pixels_.data());
  }
  std::string describe() const override { return "synthetic stream"; }
  std::string version() const override { return ""; }
  std::string tokenizer() const override { return ""; }
  uint64_t bytes_read() const override { return 0; }

 private:
  data::SyntheticStream stream_;
  const trainer::TrainSpec& spec_;
  int dp_rank_;
  std::vector<int32_t> window_;
  std::vector<uint8_t> pixels_;
};

class Dataset final : public DataSource {
 public:
  Dataset(const std::string& dir, const data::ReaderOptions& options, int microbatches)
      : reader_(dir, options), dir_(dir), global_batch_(options.global_batch), microbatches_(microbatches) {}
  const data::Reader& reader() const { return reader_; }
  // DPO: the reference log-probabilities of every sample, two per pair, attached to each row read.
  void set_reference(std::vector<double> logps) { reference_ = std::move(logps); }
  void set_reference(std::unique_ptr<LiveReference> live) { live_ = std::move(live); }
  void next(int64_t step, std::vector<MicroBatch>& out) override {
    // The cursor counts samples, so step s starts at s x (samples per step): a resumed run (or one that
    // skipped steps) reads exactly what an uninterrupted run reads at that step.
    const uint64_t at = uint64_t(step) * uint64_t(microbatches_) * global_batch_;
    if (data::Cursor c = reader_.cursor(); c.samples != at) {
      c.samples = at;
      reader_.seek(c);
    }
    out.resize(size_t(microbatches_));
    for (MicroBatch& batch : out) {
      reader_.next(batch);
      if (live_) live_->fill(batch);
      if (reference_.empty()) continue;
      batch.reference_logps.resize(2 * size_t(batch.rows));
      for (size_t r = 0; r < size_t(batch.rows); ++r)
        for (size_t k = 0; k < 2; ++k)
          batch.reference_logps[2 * r + k] = reference_[2 * batch.sample_ids[r] + k];
    }
  }
  std::string describe() const override {
    return "dataset " + dir_ + " (" + reader_.manifest().version + ")";
  }
  std::string version() const override { return reader_.manifest().version; }
  std::string tokenizer() const override { return reader_.manifest().tokenizer_sha256; }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }
  std::vector<std::string> domains() const override { return reader_.manifest().domains; }
  data::CacheStats cache_stats() const override { return reader_.cache_stats(); }
  Json cursor(int64_t steps) const override {
    data::Cursor c = reader_.cursor();
    c.samples = uint64_t(steps) * uint64_t(microbatches_) * global_batch_;
    return c.to_json();
  }

 private:
  data::Reader reader_;
  std::string dir_;
  uint64_t global_batch_;
  int microbatches_;
  std::vector<double> reference_;
  std::unique_ptr<LiveReference> live_;
};

}  // namespace

std::unique_ptr<DataSource> open_data(const Config& config, const trainer::TrainSpec& spec, int dp_rank,
                                      comm::Comm& world, trainer::Backend& backend) {
  const trainer::ObjectiveTraits& objective = trainer::traits(spec.objective);
  if (objective.rollouts) return open_rollouts(config, spec, dp_rank, backend);
  const std::string wanted = fmt::format("{}", fmt::join(objective.formats, " or "));
  if (spec.dataset == "synthetic") {
    if (!objective.synthetic)
      config.reject("run.objective", fmt::format("{} needs a {} dataset (the synthetic stream has none)",
                                                 objective.name, wanted));
    if (spec.document_mask)
      config.reject("data.document_mask", "needs a prepared dataset (the synthetic stream has no documents)");
    if (!spec.domain_weights.empty())
      config.reject("data.domain_weights", "needs a prepared dataset (the synthetic stream has no domains)");
    return std::make_unique<Synthetic>(spec, dp_rank);
  }
  const data::Manifest manifest = data::load_manifest(spec.dataset);
  // Pictures need a vision tower in front of the language model (docs/TRAINER.md, "Vision-language
  // models"), taking pictures of the size and patch the data was prepared for.
  const trainer::VisionSpec& vision = spec.model.vision;
  if (manifest.format == data::kImageTextFormat) {
    if (!vision.enabled())
      config.reject("data.dataset",
                    fmt::format("{} is format image-text, and the model has no vision tower to read its "
                                "pictures: set vision.layers (and the [vision] keys, docs/TRAINER.md)",
                                spec.dataset));
    if (!trainer::scores_replies(objective, manifest.format))
      config.reject("run.objective",
                    fmt::format("{} is format image-text: train it with sft (the loss on the captions and "
                                "replies, not on the pictures' placeholders)",
                                spec.dataset));
    const Json image = manifest.settings.value("image", Json::object());
    const int size = image.value("size", 0), patch = image.value("patch", 0);
    if (size != vision.image_size || patch != vision.patch)
      config.reject(
          "vision.image_size",
          fmt::format("{0} holds pictures of {1} x {1} pixels in {2}-pixel patches, and the vision "
                      "tower takes {3} x {3} in {4}: set vision.image_size = {1} and vision.patch = "
                      "{2}, or prepare the data with --image.size={3} --image.patch={4}",
                      spec.dataset, size, patch, vision.image_size, vision.patch));
  }
  if (manifest.vocab_size != uint32_t(spec.model.vocab))
    config.reject("model.vocab", fmt::format("must equal the vocabulary of the dataset's tokenizer ({}, from "
                                             "{}/manifest.json)",
                                             manifest.vocab_size, spec.dataset));
  for (const auto& [name, weight] : spec.domain_weights)
    if (std::find(manifest.domains.begin(), manifest.domains.end(), name) == manifest.domains.end())
      config.reject(
          "data.domain_weights",
          fmt::format("domain '{}' is not in dataset {} (its domains: {}); weigh those, or leave the "
                      "key empty for their natural proportions",
                      name, spec.dataset, fmt::join(manifest.domains, ", ")));
  if (!trainer::reads_format(objective, manifest.format))
    config.reject("run.objective",
                  fmt::format("{} needs a {} dataset, and {} is format {}: prepare one with `forge-data "
                              "prepare --format {}`, or train every token with lm",
                              objective.name, wanted, spec.dataset, manifest.format, objective.formats[0]));
  const bool replies = trainer::scores_replies(objective, manifest.format);
  const bool dpo = objective.companion == trainer::Companion::kReference;
  std::string reference = spec.dpo.reference;
  if (dpo && reference.empty()) reference = config.get<std::string>("ckpt.init_from");
  if (dpo && reference.empty())
    config.reject("run.objective",
                  "dpo needs a reference model: set ckpt.init_from (the model the run starts "
                  "from, scripts/sbatch/finetune.sbatch) or dpo.reference");
  data::ReaderOptions options;
  options.seq_len = uint32_t(spec.model.seq_len);
  // One read is one micro-batch across the data-parallel group; this rank gets its slice of it.
  options.global_batch = uint32_t(spec.batch * spec.layout.dp);
  options.dp_rank = dp_rank;
  options.dp_size = spec.layout.dp;
  options.seed = spec.seed;
  options.order = data::parse_order(spec.data_order);
  options.document_mask = spec.document_mask || replies;
  options.loss_mask = replies;
  options.domain_weights = spec.domain_weights;
  options.cache = {spec.cache_dir, spec.cache_max_bytes};
  auto dataset = std::make_unique<Dataset>(spec.dataset, options, spec.microbatches);
  if (dpo) {
    if (const uint64_t left = dataset->reader().pairs_left_out(); left > 0 && world.rank() == 0)
      spdlog::warn(
          "{} preference pairs of {} are longer than model.seq_len + 1 = {} tokens and are left out "
          "(prepare with --max-tokens {} to cut them instead)",
          left, spec.dataset, spec.model.seq_len + 1, (spec.model.seq_len + 1) / 2);
    if (spec.dpo.live)
      dataset->set_reference(std::make_unique<LiveReference>(spec, reference, backend));
    else
      dataset->set_reference(reference_logps(spec, dataset->reader(), reference, world, backend));
  }
  return dataset;
}

}  // namespace forge::launcher
