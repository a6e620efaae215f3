#include "data_source.h"

#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/synthetic.h"

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
      }
    }
  }
  std::string describe() const override { return "synthetic stream"; }
  std::string version() const override { return ""; }
  uint64_t bytes_read() const override { return 0; }

 private:
  data::SyntheticStream stream_;
  const trainer::TrainSpec& spec_;
  int dp_rank_;
  std::vector<int32_t> window_;
};

class Dataset final : public DataSource {
 public:
  Dataset(const std::string& dir, const data::ReaderOptions& options, int microbatches)
      : reader_(dir, options), dir_(dir), global_batch_(options.global_batch), microbatches_(microbatches) {}
  void next(int64_t step, std::vector<MicroBatch>& out) override {
    // The cursor counts samples, so step s starts at s x (samples per step): a resumed run (or one that
    // skipped steps) reads exactly what an uninterrupted run reads at that step.
    const uint64_t at = uint64_t(step) * uint64_t(microbatches_) * global_batch_;
    if (data::Cursor c = reader_.cursor(); c.samples != at) {
      c.samples = at;
      reader_.seek(c);
    }
    out.resize(size_t(microbatches_));
    for (MicroBatch& batch : out) reader_.next(batch);
  }
  std::string describe() const override {
    return "dataset " + dir_ + " (" + reader_.manifest().version + ")";
  }
  std::string version() const override { return reader_.manifest().version; }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

 private:
  data::Reader reader_;
  std::string dir_;
  uint64_t global_batch_;
  int microbatches_;
};

}  // namespace

std::unique_ptr<DataSource> open_data(const Config& config, const trainer::TrainSpec& spec, int dp_rank) {
  const bool sft = spec.objective == trainer::Objective::kSft;
  if (spec.dataset == "synthetic") {
    if (sft) config.reject("run.objective", "sft needs a chat dataset (the synthetic stream has no replies)");
    if (spec.document_mask)
      config.reject("data.document_mask", "needs a prepared dataset (the synthetic stream has no documents)");
    return std::make_unique<Synthetic>(spec, dp_rank);
  }
  const data::Manifest manifest = data::load_manifest(spec.dataset);
  if (manifest.vocab_size != uint32_t(spec.model.vocab))
    config.reject("model.vocab", fmt::format("must equal the vocabulary of the dataset's tokenizer ({}, from "
                                             "{}/manifest.json)",
                                             manifest.vocab_size, spec.dataset));
  if (sft && manifest.format != "chat")
    config.reject("run.objective",
                  fmt::format("sft needs a chat dataset, and {} is format {}: prepare one with `forge-data "
                              "prepare --format chat`, or train every token with lm",
                              spec.dataset, manifest.format));
  data::ReaderOptions options;
  options.seq_len = uint32_t(spec.model.seq_len);
  // One read is one micro-batch across the data-parallel group; this rank gets its slice of it.
  options.global_batch = uint32_t(spec.batch * spec.layout.dp);
  options.dp_rank = dp_rank;
  options.dp_size = spec.layout.dp;
  options.seed = spec.seed;
  options.order = data::parse_order(spec.data_order);
  options.document_mask = spec.document_mask;
  options.loss_mask = sft;
  return std::make_unique<Dataset>(spec.dataset, options, spec.microbatches);
}

}  // namespace forge::launcher
