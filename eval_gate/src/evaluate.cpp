#include "forge/eval_gate/evaluate.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/tokenizer.h"
#include "forge/eval_gate/prompt_format.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/loss.h"
#include "forge/trainer/model.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/spec.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
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
    } else if (tok.file_name() == "tokenizer.json") {
      // A tokenizer.json spells pieces in its own alphabet (byte-level: U+0120 for a space): decode counts.
      bytes[id] = static_cast<double>(tok.decode(std::vector<int>{static_cast<int>(id)}).size());
    } else {
      // SentencePiece writes a space as U+2581 (3 bytes in UTF-8): count it as the 1 byte it stands for.
      size_t n = 0;
      for (size_t at = piece.find("\u2581"); at != std::string::npos; at = piece.find("\u2581", at + 3)) ++n;
      bytes[id] = static_cast<double>(piece.size() - 2 * n);
    }
  }
  return bytes;
}

// A checkpoint's model with `config` and `loss` (null: the LM cross-entropy) for `batch` rows on
// `backend`, its files verified (each rank a share) and its weights loaded, whatever layout wrote them.
std::unique_ptr<trainer::GPT> load_model(const ckpt::Checkpoint& checkpoint, const trainer::ModelSpec& config,
                                         std::shared_ptr<const trainer::Loss> loss, comm::Comm& comm,
                                         trainer::Backend& backend, int batch = 1) {
  checkpoint.verify(comm.rank(), comm.size());
  auto model = std::make_unique<trainer::GPT>(
      config, trainer::ModelSetup{.batch = batch, .backend = &backend, .loss = std::move(loss)});
  trainer::load_checkpoint(checkpoint, *model, nullptr);
  return model;
}

// The model a candidate is measured against (`role`: its DPO reference, its distillation teacher): any
// size with the evaluated model's vocabulary, reading the evaluated model's sequences.
std::unique_ptr<trainer::GPT> load_companion(const std::string& dir, const char* role, const std::string& of,
                                             const trainer::ModelSpec& evaluated,
                                             const std::string& dataset_dir,
                                             std::shared_ptr<const trainer::Loss> loss, comm::Comm& comm,
                                             trainer::Backend& backend) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(dir);
  trainer::ModelSpec config = trainer::model_spec_from_json(checkpoint.manifest().meta.model_config, dir);
  if (config.vocab != evaluated.vocab)
    fail(ExitCode::kUsage, "{} {} has a vocabulary of {} tokens but {} has {}: they must share a tokenizer",
         role, dir, config.vocab, of, evaluated.vocab);
  if (config.max_positions < evaluated.seq_len)
    fail(ExitCode::kUsage, "{} {} has {} positions, fewer than the {} of {}'s sequences", role, dir,
         config.max_positions, evaluated.seq_len, of);
  check_tokenizer(dir, dataset_dir, role);
  config.seq_len = evaluated.seq_len;
  return load_model(checkpoint, config, std::move(loss), comm, backend);
}

// log sum exp of a row of logits, in double.
double log_sum_exp(std::span<const float> row) {
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(double(x) - top);
  return top + std::log(sum);
}

}  // namespace

TokenScores score_token(std::span<const float> model, std::span<const float> teacher, int32_t target) {
  const double lse_m = log_sum_exp(model), lse_t = log_sum_exp(teacher);
  TokenScores out;
  out.loss = lse_m - double(model[size_t(target)]);
  for (size_t v = 0; v < model.size(); ++v) {
    const double log_t = double(teacher[v]) - lse_t, log_m = double(model[v]) - lse_m;
    out.kl += std::exp(log_t) * (log_t - log_m);
  }
  return out;
}

std::unique_ptr<trainer::GPT> load_for_generation(const std::string& checkpoint_dir, int batch,
                                                  comm::Comm& comm, trainer::Backend& backend) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  trainer::ModelSpec config =
      trainer::model_spec_from_json(checkpoint.manifest().meta.model_config, checkpoint_dir);
  config.seq_len = config.max_positions;
  return load_model(checkpoint, config, nullptr, comm, backend, batch);
}

MeasuredDataset measured_dataset(const std::string& checkpoint_dir, const std::string& dataset_dir) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  const Json spec = checkpoint.manifest().meta.extra.value("spec", Json::object());
  const std::string objective = spec.value("run.objective", std::string("lm"));
  const trainer::ObjectiveTraits* traits = trainer::find_objective(objective);
  const bool rollouts = traits != nullptr && traits->rollouts;
  if (data::load_any_manifest(dataset_dir).format != "prompts") return {dataset_dir, !rollouts};
  if (!rollouts)
    fail(ExitCode::kUsage,
         "{} is a prompt set, which has no replies to measure a loss on, and {} was trained with "
         "run.objective = {}: give --dataset the dataset it was trained on",
         dataset_dir, checkpoint_dir, objective);
  const std::string chat = spec.value("rl.format_dataset", std::string());
  if (chat.empty())
    fail(ExitCode::kUsage,
         "{} is a prompt set, which has no replies to measure a loss on, and {} names no rl.format_dataset "
         "(the chat dataset its policy speaks): give --dataset a chat dataset of its tokenizer",
         dataset_dir, checkpoint_dir);
  return {chat, false};
}

EvalOptions as_trained(const std::string& checkpoint_dir, const std::string& dataset_format,
                       EvalOptions options) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  const Json& extra = checkpoint.manifest().meta.extra;
  const Json spec = extra.value("spec", Json::object());
  const auto key = [&](const char* name) { return spec.value(name, std::string()); };
  // A model the run was measured against must be here to measure the candidate against it again.
  const auto companion = [&](const std::string& dir, const char* keys) {
    std::error_code ec;
    if (dir.empty() || !std::filesystem::exists(std::filesystem::path(dir) / ckpt::kManifestFile, ec))
      fail(ExitCode::kUsage,
           "{} was trained with run.objective = {} against {}, which is not a checkpoint here ({}): run the "
           "gate where that checkpoint is",
           checkpoint_dir, options.objective, dir.empty() ? "no model" : dir, keys);
    return dir;
  };
  options.seq_len =
      trainer::model_spec_from_json(checkpoint.manifest().meta.model_config, checkpoint_dir).seq_len;
  options.objective = spec.value("run.objective", std::string("lm"));
  const trainer::ObjectiveTraits* objective = trainer::find_objective(options.objective);
  if (objective == nullptr)
    fail(ExitCode::kUsage, "{} was trained with run.objective = {}, which this forge-gate does not know",
         checkpoint_dir, options.objective);
  options.replies_only = trainer::scores_replies(*objective, dataset_format);
  options.document_mask = options.replies_only || key("data.document_mask") == "true";
  if (objective->companion == trainer::Companion::kReference) {
    options.dpo_beta = std::stod(spec.value("dpo.beta", std::string("0.1")));
    // Empty dpo.reference: the model the run started from, whose absolute path its lineage keeps.
    std::string reference = key("dpo.reference");
    if (reference.empty())
      reference = extra.value("lineage", Json::object()).value("parent", key("ckpt.init_from"));
    options.dpo_reference = companion(reference, "dpo.reference, else ckpt.init_from");
  }
  if (objective->companion == trainer::Companion::kTeacher)
    options.distill_teacher = companion(key("distill.teacher"), "distill.teacher");
  return options;
}

namespace {

// What an evaluation reads, opened and checked once (check_evaluation's checks).
struct Opened {
  ckpt::Checkpoint checkpoint;
  data::Manifest manifest;
  trainer::ModelSpec config;
};

Opened open_evaluation(const std::string& checkpoint_dir, const std::string& dataset_dir,
                       const EvalOptions& options, bool own_dataset) {
  const bool dpo = !options.dpo_reference.empty();
  ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  trainer::ModelSpec config =
      trainer::model_spec_from_json(checkpoint.manifest().meta.model_config, checkpoint_dir);
  if (options.seq_len > 0 && options.seq_len != config.seq_len) {
    if (options.seq_len > config.max_positions)
      fail(ExitCode::kUsage, "{} has {} positions, fewer than the {} of the candidate's sequences",
           checkpoint_dir, config.max_positions, options.seq_len);
    config.seq_len = options.seq_len;
  }

  data::Manifest manifest = data::load_manifest(dataset_dir);
  if (dpo && manifest.format != "preference")
    fail(ExitCode::kUsage,
         "{} is measured on preference pairs (run.objective = dpo) but {} is a {} dataset: give the "
         "preference dataset (forge-data prepare --format preference)",
         checkpoint_dir, dataset_dir, manifest.format);
  const std::string& trained_on = checkpoint.manifest().meta.dataset_version;
  if (own_dataset && !trained_on.empty() && trained_on != manifest.version)
    fail(ExitCode::kData,
         "{} was trained on dataset version {} but {} is version {}: evaluate on the dataset the run used",
         checkpoint_dir, trained_on, dataset_dir, manifest.version);
  check_tokenizer(checkpoint_dir, dataset_dir, own_dataset ? "the candidate" : "the baseline");
  if (manifest.vocab_size > static_cast<uint32_t>(config.vocab))
    fail(ExitCode::kUsage, "dataset {} has {} token ids but the model's vocabulary is {}", dataset_dir,
         manifest.vocab_size, config.vocab);
  if (manifest.tokens("valid") == 0)
    fail(ExitCode::kData, "dataset {} has no validation split: prepare it with --valid-fraction > 0",
         dataset_dir);
  return {std::move(checkpoint), std::move(manifest), config};
}

}  // namespace

trainer::ModelSpec check_evaluation(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                    const EvalOptions& options, bool own_dataset) {
  return open_evaluation(checkpoint_dir, dataset_dir, options, own_dataset).config;
}

DomainResults evaluate_checkpoint(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                  const EvalOptions& options, comm::Comm& comm, bool own_dataset) {
  const int rank = comm.rank(), world = comm.size();
  const bool dpo = !options.dpo_reference.empty(), distill = !options.distill_teacher.empty();
  const auto [checkpoint, manifest, config] =
      open_evaluation(checkpoint_dir, dataset_dir, options, own_dataset);

  trainer::use_threads(trainer::resolve_threads(options.threads));
  // DPO: both models keep each reply's summed log-probability (reply_logps) instead of a loss.
  using Logps = std::shared_ptr<trainer::ReplyLogps>;
  const Logps logps = dpo ? std::make_shared<trainer::ReplyLogps>() : Logps();
  const Logps reference_logps = dpo ? std::make_shared<trainer::ReplyLogps>() : Logps();
  trainer::Backend& backend = options.backend != nullptr ? *options.backend : trainer::cpu_backend();
  const auto model = load_model(checkpoint, config, logps, comm, backend);
  std::unique_ptr<trainer::GPT> other;  // the reference or the teacher
  if (dpo)
    other = load_companion(options.dpo_reference, "the DPO reference", checkpoint_dir, config, dataset_dir,
                           reference_logps, comm, backend);
  if (distill)
    other = load_companion(options.distill_teacher, "the teacher", checkpoint_dir, config, dataset_dir,
                           nullptr, comm, backend);
  const std::vector<double> token_bytes = bytes_per_token(dataset_dir + "/" + manifest.tokenizer_file);

  const size_t T = size_t(config.seq_len), V = size_t(config.vocab);
  std::vector<float> logits(distill ? T * V : 0), teacher_logits(distill ? T * V : 0);
  MicroBatch batch;
  batch.resize(1, config.seq_len);
  // Each scores the sequence in `batch` into `s`.
  const auto score_lm = [&](DomainStats& s) {
    double bytes = 0;
    for (int32_t t : batch.targets)
      if (t != MicroBatch::kIgnore) bytes += token_bytes.at(static_cast<size_t>(t));
    const trainer::LossSums sums = model->forward_loss(batch);
    if (sums.weight == 0) return;  // nothing scored (documents of one token each)
    // Every scored target weighs 1 here: the weight is the number of tokens scored.
    s.add_sequence(sums.loss / sums.weight, int64_t(sums.weight), bytes);
  };
  const auto score_pair = [&](DomainStats& s) {
    model->forward_loss(batch);
    other->forward_loss(batch);
    const std::vector<double>&lp = logps->last(), &ref = reference_logps->last();
    // The chosen reply (document 0) gives the LM figures: its masked loss, tokens and bytes.
    int64_t tokens[2] = {0, 0};
    double bytes = 0;
    for (size_t i = 0; i < T; ++i) {
      if (batch.weight(i) == 0) continue;
      ++tokens[batch.segments[i] == 0 ? 0 : 1];
      if (batch.segments[i] == 0) bytes += token_bytes.at(static_cast<size_t>(batch.targets[i]));
    }
    if (tokens[0] == 0 || tokens[1] == 0) return;  // not a pair: a reply with nothing scored
    const double margin = options.dpo_beta * ((lp[0] - ref[0]) - (lp[1] - ref[1]));
    s.add_sequence(-lp[0] / double(tokens[0]), tokens[0], bytes);
    s.margin.add(margin);
    s.correct.add(margin > 0 ? 1 : 0);
  };
  const auto score_distill = [&](DomainStats& s) {
    model->forward_logits(batch, logits);
    other->forward_logits(batch, teacher_logits);
    double loss = 0, kl = 0, bytes = 0;
    int64_t tokens = 0;
    for (size_t i = 0; i < T; ++i) {
      const int32_t t = batch.targets[i];
      if (batch.weight(i) == 0) continue;
      const TokenScores token =
          score_token({logits.data() + i * V, V}, {teacher_logits.data() + i * V, V}, t);
      loss += token.loss;
      kl += token.kl;
      bytes += token_bytes.at(static_cast<size_t>(t));
      ++tokens;
    }
    if (tokens == 0) return;
    s.add_sequence(loss / double(tokens), tokens, bytes);
    s.kl_sum += kl;
    s.kl_seq.add(kl / double(tokens));
  };

  DomainResults local;
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
      if (dpo)
        score_pair(local[domain]);
      else if (distill)
        score_distill(local[domain]);
      else
        score_lm(local[domain]);
      if (progress) progress->add(1);
    }
  }
  std::vector<double> sums = pack(local, manifest.domains);
  comm.all_reduce(sums.data(), sums.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  return unpack(sums, manifest.domains);
}

}  // namespace forge::gate
