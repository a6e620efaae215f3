#include "data_source.h"

#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/synthetic.h"

#include <algorithm>

namespace forge::launcher {

namespace {

class Synthetic final : public DataSource {
 public:
  Synthetic(const trainer::TrainSpec& spec)
      : stream_(uint32_t(spec.model.vocab), spec.seed),
        rows_(int64_t(spec.batch) * spec.microbatches * spec.parallel.dp),
        cols_(size_t(spec.model.seq_len) + 1) {}
  void next(int64_t step, std::span<int32_t> out) override {
    for (int64_t r = 0; r < rows_; ++r)
      stream_.sample(uint64_t(step * rows_ + r), out.subspan(size_t(r) * cols_, cols_));
  }
  std::string describe() const override { return "synthetic stream"; }
  std::string version() const override { return ""; }

 private:
  data::SyntheticStream stream_;
  int64_t rows_;
  size_t cols_;
};

class Dataset final : public DataSource {
 public:
  Dataset(const std::string& dir, const data::ReaderOptions& options)
      : reader_(dir, options), dir_(dir), global_batch_(options.global_batch) {}
  void next(int64_t step, std::span<int32_t> out) override {
    // The cursor counts samples, so step s starts at s x global batch: a resumed run (or one that skipped
    // steps) reads exactly what an uninterrupted run reads at that step.
    data::Cursor at = reader_.cursor();
    if (at.samples != uint64_t(step) * global_batch_) {
      at.samples = uint64_t(step) * global_batch_;
      reader_.seek(at);
    }
    const data::Batch batch = reader_.next();
    std::copy(batch.tokens.begin(), batch.tokens.end(), out.begin());
  }
  std::string describe() const override {
    return "dataset " + dir_ + " (" + reader_.manifest().version + ")";
  }
  std::string version() const override { return reader_.manifest().version; }

 private:
  data::Reader reader_;
  std::string dir_;
  uint64_t global_batch_;
};

}  // namespace

std::unique_ptr<DataSource> open_data(const Config& config, const trainer::TrainSpec& spec) {
  if (spec.dataset == "synthetic") return std::make_unique<Synthetic>(spec);
  const data::Manifest manifest = data::load_manifest(spec.dataset);
  if (manifest.vocab_size != uint32_t(spec.model.vocab))
    config.reject("model.vocab", fmt::format("must equal the vocabulary of the dataset's tokenizer ({}, from "
                                             "{}/manifest.json)",
                                             manifest.vocab_size, spec.dataset));
  data::ReaderOptions options;
  options.seq_len = uint32_t(spec.model.seq_len);
  // Every rank reads the whole global step; ParallelTrainer takes its data-parallel rank's rows.
  options.global_batch = uint32_t(spec.batch * spec.microbatches * spec.parallel.dp);
  options.seed = spec.seed;
  options.order = data::parse_order(spec.data_order);
  return std::make_unique<Dataset>(spec.dataset, options);
}

}  // namespace forge::launcher
