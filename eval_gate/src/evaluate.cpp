#include "forge/eval_gate/evaluate.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/tokenizer.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/model.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/spec.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <regex>
#include <vector>

namespace forge::gate {
namespace {

// UTF-8 bytes each token id decodes to, so losses convert to bits per byte whatever the tokenizer.
std::vector<double> bytes_per_token(const std::string& tokenizer_path) {
  const auto tok = data::Tokenizer::load(tokenizer_path);
  static const std::regex byte_piece("<0x[0-9A-Fa-f]{2}>");
  std::vector<double> bytes(tok.vocab_size());
  for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
    std::string piece = tok.piece(static_cast<int>(id));
    if (std::regex_match(piece, byte_piece)) {
      bytes[id] = 1;
    } else if (piece.size() > 2 && piece.front() == '<' && piece.back() == '>') {
      bytes[id] = 0;  // control symbols: <s>, </s>, <unk>, <pad>
    } else {
      // SentencePiece writes a space as U+2581 (3 bytes in UTF-8): count it as the 1 byte it stands for.
      size_t n = 0;
      for (size_t at = piece.find("\u2581"); at != std::string::npos; at = piece.find("\u2581", at + 3)) ++n;
      bytes[id] = static_cast<double>(piece.size() - 2 * n);
    }
  }
  return bytes;
}

}  // namespace

EvalOptions as_trained(const std::string& checkpoint_dir, EvalOptions options) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  const Json& spec = checkpoint.manifest().meta.extra.value("spec", Json::object());
  options.replies_only = spec.value("run.objective", std::string("lm")) == "sft";
  options.document_mask =
      options.replies_only || spec.value("data.document_mask", std::string("false")) == "true";
  return options;
}

DomainResults evaluate_checkpoint(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                  const EvalOptions& options, trainer::Comm& comm, bool own_dataset) {
  const int rank = comm.rank(), world = comm.size();

  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  checkpoint.verify(rank, world);  // each rank checks a share of the files
  const trainer::ModelConfig config =
      trainer::model_config_from_json(checkpoint.manifest().meta.model_config, checkpoint_dir);

  const data::Manifest manifest = data::load_manifest(dataset_dir);
  const std::string& trained_on = checkpoint.manifest().meta.dataset_version;
  if (own_dataset && !trained_on.empty() && trained_on != manifest.version)
    fail(ExitCode::kData,
         "{} was trained on dataset version {} but {} is version {}: evaluate on the dataset the run used",
         checkpoint_dir, trained_on, dataset_dir, manifest.version);
  if (manifest.vocab_size > static_cast<uint32_t>(config.vocab))
    fail(ExitCode::kUsage, "dataset {} has {} token ids but the model's vocabulary is {}", dataset_dir,
         manifest.vocab_size, config.vocab);
  if (manifest.tokens("valid") == 0)
    fail(ExitCode::kData, "dataset {} has no validation split: prepare it with --valid-fraction > 0",
         dataset_dir);

  trainer::use_threads(trainer::resolve_threads(options.threads));
  trainer::GPT model(config, /*batch=*/1);
  trainer::load_checkpoint(checkpoint, model, nullptr);
  const std::vector<double> token_bytes = bytes_per_token(dataset_dir + "/" + manifest.tokenizer_file);

  DomainResults local;
  MicroBatch batch;
  batch.resize(1, config.seq_len);
  for (const auto& domain : manifest.domains) {
    if (manifest.tokens("valid", domain) <= static_cast<uint64_t>(config.seq_len)) continue;
    data::ReaderOptions ro;
    ro.seq_len = static_cast<uint32_t>(config.seq_len);
    ro.global_batch = 1;
    ro.split = "valid";
    ro.domain = domain;
    ro.prefetch = 0;
    ro.verify_checksums = rank == 0;
    ro.document_mask = options.document_mask;
    ro.loss_mask = options.replies_only;
    data::Reader reader(dataset_dir, ro);
    uint64_t n = reader.num_samples();
    if (options.max_sequences > 0) n = std::min<uint64_t>(n, static_cast<uint64_t>(options.max_sequences));
    // Rank 0's share stands for every rank's (they evaluate n / world sequences each).
    std::optional<ProgressLine> progress;
    if (rank == 0)
      progress.emplace("evaluate " + domain, "sequences", (n + uint64_t(world) - 1) / uint64_t(world));
    for (uint64_t id = static_cast<uint64_t>(rank); id < n; id += static_cast<uint64_t>(world)) {
      reader.read_sample(id, batch, 0);
      double bytes = 0;
      for (int32_t t : batch.targets)
        if (t != MicroBatch::kIgnore) bytes += token_bytes.at(static_cast<size_t>(t));
      const trainer::LossSums sums = model.forward_loss(batch);
      if (progress) progress->add(1);
      if (sums.weight == 0) continue;  // nothing scored (documents of one token each)
      // Every scored target weighs 1 here: the weight is the number of tokens scored.
      local[domain].add_sequence(sums.loss / sums.weight, int64_t(sums.weight), bytes);
    }
  }
  std::vector<double> sums = pack(local, manifest.domains);
  comm.all_reduce(sums.data(), sums.size(), trainer::CommType::kF64, trainer::ReduceOp::kSum)->wait();
  return unpack(sums, manifest.domains);
}

}  // namespace forge::gate
