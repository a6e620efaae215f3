#include "teacher.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/trainer/checkpoint_io.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>

namespace forge::launcher {

namespace {

// The tokenizer the checkpoint's run read its data with: recorded in its manifest, or (checkpoints of
// earlier releases) the one of its dataset, when that dataset is still where its spec says. "" for the
// synthetic stream; nullopt when it cannot be told.
std::optional<std::string> trained_tokenizer(const ckpt::CheckpointMeta& meta) {
  if (const auto it = meta.extra.find("tokenizer_sha256"); it != meta.extra.end() && it->is_string())
    return it->get<std::string>();
  const Json spec = meta.extra.value("spec", Json::object());
  const std::string dataset = spec.value("data.dataset", std::string("synthetic"));
  if (dataset == "synthetic") return std::string();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dataset) / "manifest.json", ec)) return std::nullopt;
  const data::Manifest manifest = data::load_manifest(dataset);
  if (manifest.version != meta.dataset_version) return std::nullopt;
  return manifest.tokenizer_sha256;
}

}  // namespace

trainer::ModelSpec check_teacher(const Config& config, const trainer::TrainSpec& spec,
                                 const std::string& tokenizer_sha256) {
  const std::string& dir = spec.distill.teacher;
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / ckpt::kCommittedFile, ec))
    config.reject(
        "distill.teacher",
        fmt::format("{} is not a checkpoint (no {}); a run's are <run.dir>/checkpoints/<tier>/step-*", dir,
                    ckpt::kCommittedFile));
  ckpt::CheckpointMeta meta;
  try {
    meta = ckpt::Checkpoint::open(dir).manifest().meta;
  } catch (const Error& e) {
    config.reject("distill.teacher", fmt::format("is not a checkpoint: {}", e.what()));
  }
  trainer::ModelSpec teacher = trainer::model_spec_from_json(meta.model_config, dir);
  if (teacher.vocab != spec.model.vocab)
    config.reject("distill.teacher",
                  fmt::format("{} has a vocabulary of {} tokens, the run {} (model.vocab): a "
                              "teacher must share the student's tokenizer",
                              dir, teacher.vocab, spec.model.vocab));
  if (teacher.max_positions < spec.model.seq_len)
    config.reject("distill.teacher", fmt::format("{} has {} positions, fewer than model.seq_len = {}", dir,
                                                 teacher.max_positions, spec.model.seq_len));
  // Under context parallelism the teacher's sequences are shared out as the student's (load_teacher).
  const int cp = spec.layout.cp;
  if (cp > 1 && spec.parallel.cp_comm == trainer::ContextComm::kAllToAll &&
      (teacher.heads % cp != 0 || teacher.kv_heads % cp != 0))
    config.reject(
        "distill.teacher",
        fmt::format("{} has {} query and {} key/value heads, which parallel.cp_comm = a2a cannot share "
                    "out over cp = {}: use parallel.cp_comm = ring",
                    dir, teacher.heads, teacher.kv_heads, cp));
  const std::optional<std::string> trained = trained_tokenizer(meta);
  if (!trained)
    spdlog::warn(
        "distill.teacher {}: its tokenizer is not recorded and its dataset is gone; only its "
        "vocabulary size ({}) could be checked",
        dir, teacher.vocab);
  else if (*trained != tokenizer_sha256)
    config.reject("distill.teacher",
                  fmt::format("{} was trained with tokenizer {}, this run's dataset uses {}: a teacher must "
                              "share the student's tokenizer",
                              dir, trained->empty() ? "none (synthetic stream)" : *trained,
                              tokenizer_sha256.empty() ? "none (synthetic stream)" : tokenizer_sha256));
  teacher.seq_len = spec.model.seq_len;
  return teacher;
}

std::shared_ptr<trainer::GPT> load_teacher(const trainer::TrainSpec& spec, const trainer::ModelSpec& teacher,
                                           trainer::Backend& backend, const trainer::LayerFactory* context) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(spec.distill.teacher);
  checkpoint.verify();
  trainer::ModelSpec local = teacher;
  local.seq_len /= spec.layout.cp;  // a rank's chunks of each sequence (context_parallel.h)
  auto model = std::make_shared<trainer::GPT>(
      local,
      trainer::ModelSetup{.batch = spec.batch, .dtype = spec.dtype, .backend = &backend, .layers = context});
  trainer::load_checkpoint(checkpoint, *model, nullptr);
  spdlog::info("distillation teacher {} ({} layers, d_model {}, {} parameters)", spec.distill.teacher,
               teacher.layers, teacher.d_model, model->weights().size());
  return model;
}

}  // namespace forge::launcher
