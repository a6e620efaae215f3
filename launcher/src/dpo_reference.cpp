#include "dpo_reference.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/reader.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/model.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace forge::launcher {

namespace {

// What the values depend on; its hash names the file.
Json key_of(const trainer::TrainSpec& spec, const std::string& reference_dir,
            const data::Manifest& manifest) {
  return {{"dataset_version", manifest.version},
          {"reference", fs::absolute(reference_dir).lexically_normal().string()},
          {"reference_manifest_xxh3", xxh3_file_hex(reference_dir + "/" + ckpt::kManifestFile)},
          {"seq_len", spec.model.seq_len},
          {"split", "train"}};
}

std::string file_for(const std::string& dir, const Json& key) {
  return (fs::path(dir) / "references" / (sha256_hex(key.dump()).substr(0, 16) + ".logps")).string();
}

bool writable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return !ec && ::access(dir.c_str(), W_OK) == 0;
}

// The stored values, checked against the key and their checksum; nullopt when there is no file.
std::optional<std::vector<double>> load(const std::string& path, const Json& key, uint64_t samples) {
  std::error_code ec;
  if (!fs::exists(path + ".json", ec)) return std::nullopt;
  const Json meta = read_json(path + ".json");
  for (const auto& [name, value] : key.items())
    if (meta.value(name, Json()) != value)
      fail(ExitCode::kData,
           "{}: reference log-probabilities for {} = {}, but this run needs {}: remove the file to compute "
           "them again",
           path, name, meta.value(name, Json()).dump(), value.dump());
  const std::string bytes = read_file(path);
  if (meta.value("samples", uint64_t{0}) != samples || bytes.size() != 2 * samples * sizeof(double) ||
      meta.value("xxh3", std::string()) != xxh3_64_hex(bytes))
    fail(ExitCode::kData,
         "{}: damaged reference log-probabilities ({} bytes for {} pairs, checksum {}): remove "
         "it to compute them again",
         path, bytes.size(), samples, meta.value("xxh3", std::string("none")));
  std::vector<double> out(2 * samples);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Where the values for `key` are kept: the existing file, else the first writable place ("" when none).
std::string place_for(const trainer::TrainSpec& spec, const Json& key) {
  std::error_code ec;
  for (const std::string& dir : {spec.dataset, spec.dir}) {
    const std::string path = file_for(dir, key);
    if (fs::exists(path + ".json", ec)) return path;
  }
  for (const std::string& dir : {spec.dataset, spec.dir})
    if (writable((fs::path(dir) / "references").string())) return file_for(dir, key);
  return "";
}

// The reference's model: the policy's, without a value head (PPO's critic is not the reference's).
trainer::ModelSpec reference_spec(const trainer::TrainSpec& spec) {
  trainer::ModelSpec m = spec.model;
  m.value_head = false;
  return m;
}

// The reference checkpoint, which must hold the spec's model.
ckpt::Checkpoint open_reference(const trainer::TrainSpec& spec, const std::string& reference_dir) {
  ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(reference_dir);
  ckpt::check_expectations(
      checkpoint.manifest(),
      {.model_config = trainer::model_spec_json(reference_spec(spec)), .dataset_version = {}}, reference_dir);
  return checkpoint;
}

// A whole model of the spec's shape whose loss keeps the reply log-probabilities of what it sees.
// FP32 on the run's backend (a GPU's FP32 kernels): the reference's log-probabilities as exact as it has
// them.
std::unique_ptr<trainer::GPT> reference_model(const trainer::TrainSpec& spec,
                                              std::shared_ptr<const trainer::Loss> loss,
                                              trainer::Backend& backend) {
  return std::make_unique<trainer::GPT>(
      reference_spec(spec),
      trainer::ModelSetup{.batch = spec.batch, .backend = &backend, .loss = std::move(loss)});
}

}  // namespace

std::vector<double> reference_logps(const trainer::TrainSpec& spec, const data::Reader& reader,
                                    const std::string& reference_dir, comm::Comm& world,
                                    trainer::Backend& backend) {
  const ckpt::Checkpoint checkpoint = open_reference(spec, reference_dir);
  const uint64_t n = reader.num_samples();
  const Json key = key_of(spec, reference_dir, reader.manifest());
  // Rank 0 decides where they are, so every rank reads or writes the same file.
  std::string path = world.rank() == 0 ? place_for(spec, key) : std::string();
  {
    std::vector<char> buf(4096, 0);
    if (world.rank() == 0) std::copy_n(path.begin(), std::min(path.size(), buf.size() - 1), buf.begin());
    world.broadcast(buf.data(), buf.size(), comm::CommType::kU8, 0)->wait();
    path = buf.data();
  }
  if (!path.empty())
    if (auto stored = load(path, key, n)) return *stored;

  // Computed: rank r takes pairs r, r + size, ... in micro-batches of data.batch rows on a whole model.
  checkpoint.verify(world.rank(), world.size());
  const auto logps = std::make_shared<trainer::ReplyLogps>();
  const std::unique_ptr<trainer::GPT> model = reference_model(spec, logps, backend);
  trainer::load_checkpoint(checkpoint, *model, nullptr);
  std::vector<double> values(2 * n, 0.0);
  std::vector<uint64_t> ids;
  MicroBatch batch;
  batch.resize(spec.batch, spec.model.seq_len);
  std::optional<ProgressLine> progress;
  if (world.rank() == 0)
    progress.emplace("dpo reference", "pairs", (n + uint64_t(world.size()) - 1) / uint64_t(world.size()));
  for (uint64_t id = uint64_t(world.rank()); id < n;) {
    ids.clear();
    for (; id < n && ids.size() < size_t(spec.batch); id += uint64_t(world.size())) ids.push_back(id);
    for (int r = 0; r < spec.batch; ++r)
      reader.read_sample(ids[std::min(size_t(r), ids.size() - 1)], batch, r);
    model->forward_loss(batch);
    for (size_t r = 0; r < ids.size(); ++r) {
      values[2 * ids[r]] = logps->last()[2 * r];
      values[2 * ids[r] + 1] = logps->last()[2 * r + 1];
    }
    if (progress) progress->add(ids.size());
  }
  if (progress) progress->finish();
  world.all_reduce(values.data(), values.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  if (world.rank() == 0 && !path.empty()) {
    const std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
    write_file_atomic(path, bytes);
    Json meta = key;
    meta["samples"] = n;
    meta["xxh3"] = xxh3_64_hex(bytes);
    write_json_atomic(path + ".json", meta);  // last: a file without its sidecar is not used
    spdlog::info("reference log-probabilities of {} pairs under {}: {}", n, reference_dir, path);
  }
  return values;
}

std::unique_ptr<trainer::GPT> frozen_reference(const trainer::TrainSpec& spec, const std::string& dir,
                                               std::shared_ptr<const trainer::Loss> loss,
                                               trainer::Backend& backend) {
  const ckpt::Checkpoint checkpoint = open_reference(spec, dir);
  checkpoint.verify();
  std::unique_ptr<trainer::GPT> model = reference_model(spec, std::move(loss), backend);
  trainer::load_checkpoint(checkpoint, *model, nullptr);
  return model;
}

LiveReference::LiveReference(const trainer::TrainSpec& spec, const std::string& reference_dir,
                             trainer::Backend& backend)
    : logps_(std::make_shared<trainer::ReplyLogps>()),
      model_(frozen_reference(spec, reference_dir, logps_, backend)) {
  spdlog::info("dpo reference {}: a frozen copy computes its log-probabilities every step", reference_dir);
}

void LiveReference::fill(MicroBatch& batch) {
  model_->forward_loss(batch);
  batch.reference_logps = logps_->last();
}

}  // namespace forge::launcher
