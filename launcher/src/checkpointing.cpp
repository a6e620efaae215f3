#include "checkpointing.h"

#include "forge/ckpt/resume.h"
#include "forge/common/error.h"
#include "forge/common/image.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/hf.h"
#include "forge/trainer/metrics.h"
#include "forge/trainer/objective.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace forge::launcher {

void add_checkpoint_keys(ConfigSchema& s) {
  s.add<int64_t>("ckpt.recovery_every", 0, "steps between recovery checkpoints (0: off)")
      .add<double>("ckpt.recovery_every_s", 0, "seconds between recovery checkpoints (0: off)")
      .add<int>("ckpt.recovery_keep", 3, "newest recovery checkpoints kept")
      .add<int64_t>("ckpt.milestone_every", 0,
                    "steps between milestone checkpoints (0: off; the last step always saves one)")
      .add_choice("ckpt.async_policy", "wait", {"wait", "skip"},
                  "a save due while one is in flight waits or is skipped")
      .add<std::string>("ckpt.init_from", "", "checkpoint whose weights start a fresh run (fine-tuning)")
      .add<std::string>("ckpt.init_vision_from", "",
                        "Hugging Face SiglipVisionModel or SiglipModel directory whose vision tower starts a "
                        "fresh run's encoder (the projector starts as initialised)")
      .add_choice("ckpt.init_optimizer", "reset", {"reset", "keep"},
                  "with ckpt.init_from: a fresh optimizer (reset), or the checkpoint's AdamW moments (keep: "
                  "continued pretraining); the schedule and its warm-up start again either way");
}

namespace {

// How the verification batch is stored: a serialized MicroBatch (forge/common/batch.h). Checkpoints
// without this format hold token rows of seq_len + 1, the pretraining batch of earlier releases.
constexpr const char* kBatchFormat = "micro-batch";

// Manifest key: the updates the optimizer's moments averaged before the run's first step, when they came
// from its parent (ckpt.init_optimizer = keep; AdamW::set_moment_steps_before).
constexpr const char* kMomentStepsBefore = "moment_steps_before";
// The step's outcome (metrics.h), for a resume that finds the step's metrics record missing.
constexpr const char* kStepOutcome = "step_outcome";

// One micro-batch of the whole data-parallel group: every rank's part, in rank order (collective).
MicroBatch gather_micro_batch(comm::Comm& dp, const MicroBatch& mine) {
  if (dp.size() == 1) return mine;
  const std::string bytes = mine.serialize();
  std::vector<uint64_t> sizes(size_t(dp.size()));
  const uint64_t size = bytes.size();
  dp.all_gather(&size, sizes.data(), sizeof size, comm::CommType::kU8)->wait();
  const uint64_t widest = *std::max_element(sizes.begin(), sizes.end());
  std::string padded = bytes;
  padded.resize(widest);
  std::string all(widest * sizes.size(), '\0');
  dp.all_gather(padded.data(), all.data(), widest, comm::CommType::kU8)->wait();
  std::vector<MicroBatch> parts;
  for (size_t r = 0; r < sizes.size(); ++r)
    parts.push_back(MicroBatch::deserialize(std::string_view(all).substr(r * widest, sizes[r])));
  return MicroBatch::concat(parts);
}

// The checkpoint's verification batch (every data-parallel rank's part), or nullopt when it has none.
std::optional<MicroBatch> verification_batch(const ckpt::Checkpoint& checkpoint, int seq_len) {
  const std::string bytes = checkpoint.verification_bytes();
  if (bytes.empty()) return std::nullopt;
  if (checkpoint.manifest().meta.verification.value("format", "") == kBatchFormat)
    return MicroBatch::deserialize(bytes);
  // Token rows of seq_len + 1: inputs and next-token targets.
  const size_t row = size_t(seq_len) + 1;
  if (bytes.size() % (row * sizeof(int32_t)) != 0)
    fail(ExitCode::kData, "{}: its verification batch is not rows of seq_len + 1 = {} tokens",
         checkpoint.dir(), row);
  std::vector<int32_t> tokens(bytes.size() / sizeof(int32_t));
  std::memcpy(tokens.data(), bytes.data(), bytes.size());
  MicroBatch b;
  b.resize(int(tokens.size() / row), seq_len);
  for (int r = 0; r < b.rows; ++r) b.set_window(r, tokens.data() + size_t(r) * row, 0, 0);
  return b;
}

std::string weights_text(const std::map<std::string, double>& weights) {
  if (weights.empty()) return "(empty: natural proportions)";
  std::string out;
  for (const auto& [name, w] : weights) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", name, w);
  return out;
}

// The domain mix is part of the sample order: a checkpoint's cursor taken under other weights cannot be
// continued (the spec check usually says so first; this covers checkpoints it cannot compare).
void check_data_cursor(const std::string& dir, const Json& cursor, const std::map<std::string, double>& now) {
  if (!cursor.is_object() || !cursor.contains("reader")) return;
  std::map<std::string, double> saved;
  try {
    saved = cursor.at("reader").at("domain_weights").get<std::map<std::string, double>>();
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: malformed data cursor: {}", dir, e.what());
  }
  if (saved != now)
    fail(ExitCode::kUsage,
         "{}: its data cursor was taken with data.domain_weights = {}, this spec has {}: the sample order "
         "would differ; resume with the same data.domain_weights, or pass --force-new to start afresh",
         dir, weights_text(saved), weights_text(now));
}

ckpt::SaverOptions saver_options(const Config& c, const trainer::TrainSpec& spec, trainer::Backend& backend) {
  ckpt::SaverOptions o;
  o.run_dir = spec.dir;
  o.policy = ckpt::parse_async_policy(c.get<std::string>("ckpt.async_policy"));
  o.recovery_keep = c.get<int>("ckpt.recovery_keep");
  if (o.recovery_keep < 1) c.reject("ckpt.recovery_keep", "must be at least 1");
  trainer::snapshot_through(backend, o);  // weights and moments in device memory
  return o;
}

}  // namespace

RunCheckpoints::RunCheckpoints(const Config& config, const trainer::TrainSpec& spec,
                               trainer::ParallelTrainer& trainer, const DataSource& data)
    : config_(config),
      spec_(spec),
      trainer_(trainer),
      data_(data),
      dataset_version_(data.version()),
      tokenizer_(data.tokenizer()),
      init_from_(config.get<std::string>("ckpt.init_from")),
      init_vision_from_(config.get<std::string>("ckpt.init_vision_from")),
      image_(running_image_digest()),
      coord_(*trainer.groups().world),
      saver_(coord_, saver_options(config, spec, trainer.held_model().backend())) {
  // Each logical element is written by one rank (trainer::SaveRole).
  const comm::ProcessGroups& g = trainer.groups();
  // Dense weights are replicated over dp x cp (dp_cp, which is dp at cp 1); under ZeRO-3 each rank holds
  // and writes its own ranges of them. Under hybrid sharding the first node's copy of a shard is written.
  const bool zero3 = spec.parallel.zero == 3, sharded = spec.parallel.zero >= 1;
  if (zero3) role_.owned_params = trainer.owned_ranges();
  const bool dense_copy = trainer.shard_copy(false) == 0, expert_copy = trainer.shard_copy(true) == 0;
  role_.params = zero3 ? dense_copy : g.dp_cp->rank() == 0;
  role_.moments = sharded ? dense_copy : g.dp_cp->rank() == 0;
  role_.expert_params = zero3 ? expert_copy : g.expert_dp->rank() == 0;
  role_.expert_moments = sharded ? expert_copy : g.expert_dp->rank() == 0;
  role_.replicated = g.tp_rank == 0;
  role_.tied_copy = g.layout.pp == 1 || g.first_stage();
  tiers_.recovery_every = config.get<int64_t>("ckpt.recovery_every");
  tiers_.recovery_every_s = config.get<double>("ckpt.recovery_every_s");
  tiers_.recovery_keep = config.get<int>("ckpt.recovery_keep");
  tiers_.milestone_every = config.get<int64_t>("ckpt.milestone_every");
  if (tiers_.recovery_every < 0) config.reject("ckpt.recovery_every", "must be >= 0");
  if (tiers_.milestone_every < 0) config.reject("ckpt.milestone_every", "must be >= 0");
  if (!(tiers_.recovery_every_s >= 0)) config.reject("ckpt.recovery_every_s", "must be >= 0");
  // grpo with several updates per rollout: checkpoints fall between rollouts (one holds no rollout), a
  // save on the clock waiting for the rollout's last update.
  for (const auto& [key, every] : {std::pair{"ckpt.recovery_every", tiers_.recovery_every},
                                   {"ckpt.milestone_every", tiers_.milestone_every}})
    if (!spec.rl.between_rollouts(every))
      config.reject(key, fmt::format("must be a multiple of rl.updates_per_rollout = {}: a checkpoint "
                                     "falls between rollouts",
                                     spec.rl.updates_per_rollout));
  if (!init_vision_from_.empty() && !spec.model.vision.enabled())
    config.reject("ckpt.init_vision_from", "is set, but the model has no vision tower (vision.layers = 0)");
  if (spec.guard.policy == trainer::NonFinitePolicy::kRewind && tiers_.recovery_every == 0 &&
      tiers_.recovery_every_s == 0)
    config.reject("guard.nonfinite",
                  "rewind needs recovery checkpoints to go back to: set ckpt.recovery_every or "
                  "ckpt.recovery_every_s, or use skip");
}

ckpt::Expectations RunCheckpoints::expectations() const {
  ckpt::Expectations expect;
  expect.model_config = trainer::model_spec_json(spec_.model);
  if (!dataset_version_.empty()) expect.dataset_version = dataset_version_;
  return expect;
}

int64_t RunCheckpoints::resume() {
  const ckpt::Expectations expect = expectations();
  auto checkpoint = ckpt::open_for_resume(coord_, spec_.dir, expect);
  if (!checkpoint) {
    if (!init_from_.empty()) start_from_parent();
    if (!init_vision_from_.empty()) start_vision_from();
    return 0;
  }
  return load(*checkpoint, "resumed from");
}

void RunCheckpoints::start_from_parent() {
  const ckpt::Expectations expect = expectations();
  // Fine-tuning and continued pretraining: the weights of another run's checkpoint (and, kept, its
  // optimizer's moments), a fresh step count and schedule.
  const auto source = ckpt::Checkpoint::open(init_from_);
  source.verify();
  const Json& saved = source.manifest().meta.model_config;
  trainer::check_model_family(saved, spec_.model, init_from_);
  // The weights do not depend on the sequence length: a run may fine-tune at another one (an imported
  // model records its longest, max_positions, which the job must match).
  Json model = *expect.model_config;
  if (saved.contains("seq_len")) model["seq_len"] = saved["seq_len"];
  // A vision-language model may start from a text-only one (LLaVA's recipe): its language model is the
  // checkpoint's, the vision tower and projector start as initialised.
  const bool parent_has_tower = trainer::model_spec_from_json(saved, init_from_).vision.enabled();
  if (parent_has_tower && !init_vision_from_.empty())
    config_.reject("ckpt.init_vision_from",
                   fmt::format("is set, but ckpt.init_from {} already holds a vision tower: give one of them",
                               init_from_));
  const bool adds_vision = spec_.model.vision.enabled() && !parent_has_tower;
  if (adds_vision)
    for (auto it = model.begin(); it != model.end();)
      it = it.key().starts_with("vision.") ? model.erase(it) : std::next(it);
  // PPO starts from a policy without a value head (an SFT run's): the head starts as initialised.
  const bool adds_value_head = spec_.model.value_head && !saved.contains("value_head");
  if (adds_value_head) model.erase("value_head");
  ckpt::check_expectations(source.manifest(), {.model_config = model, .dataset_version = {}}, init_from_);
  const ckpt::CheckpointMeta& parent = source.manifest().meta;
  const bool keep = config_.get<std::string>("ckpt.init_optimizer") == "keep";
  if (keep && adds_vision)
    config_.reject("ckpt.init_optimizer",
                   fmt::format("is keep, but {} is a text-only model and [vision] adds a tower and projector "
                               "it has no moments for: use reset",
                               init_from_));
  if (keep && adds_value_head)
    config_.reject(
        "ckpt.init_optimizer",
        fmt::format("is keep, but {} has no value head, which run.objective = ppo adds and it has no "
                    "moments for: use reset",
                    init_from_));
  const auto wanted = [&](std::string_view param) {
    if (adds_value_head && param.starts_with("value_head.")) return false;
    return !adds_vision || trainer::model_part(param) == trainer::ModelPart::kLm;
  };
  trainer::load_checkpoint(source, trainer_.model_to_load(), keep ? &trainer_.optimizer() : nullptr, wanted,
                           role_.owned_params);
  if (keep)
    trainer_.optimizer().set_moment_steps_before(parent.step +
                                                 parent.extra.value(kMomentStepsBefore, int64_t{0}));
  lineage_ = {{"parent", std::filesystem::absolute(init_from_).lexically_normal().string()},
              {"parent_step", parent.step},
              {"parent_dataset_version", parent.dataset_version},
              {"parent_spec_hash", parent.spec_hash},
              {"parent_lineage", parent.extra.value("lineage", Json())}};
  // Reinforcement learning: what the rewards were and what they were earned on, as the registry shows it.
  if (const trainer::ObjectiveTraits& objective = trainer::traits(spec_.objective); objective.rollouts)
    lineage_["rl"] = {{"objective", objective.name},
                      {"prompt_set", spec_.dataset},
                      {"prompt_set_version", dataset_version_},
                      {"reward_weights", spec_.rl.reward.weights},
                      {"reward_answer", spec_.rl.reward.answer}};
  spdlog::info("initialised weights{} from {}{}", keep ? " and optimizer moments" : "", init_from_,
               adds_vision ? " (its language model; the vision tower and projector start fresh)" : "");
}

void RunCheckpoints::start_vision_from() {
  const Json origin = trainer::load_hf_vision_tower(init_vision_from_, trainer_.model());
  if (!lineage_.is_object()) lineage_ = Json::object();
  lineage_["vision_from"] = origin;
  spdlog::info("initialised the vision tower from {} ({}, {}); the projector starts fresh", init_vision_from_,
               origin.value("architecture", ""), origin.value("model_id", "no model id"));
}

int64_t RunCheckpoints::rewind() {
  saver_.wait();
  auto checkpoint = ckpt::open_for_resume(coord_, spec_.dir, expectations());
  if (!checkpoint)
    fail(ExitCode::kNumeric,
         "guard.nonfinite = rewind, but {} has no checkpoint to rewind to; set ckpt.recovery_every or use "
         "guard.nonfinite = skip",
         spec_.dir);
  return load(*checkpoint, "rewound to");
}

int64_t RunCheckpoints::load(const ckpt::Checkpoint& checkpoint, const char* verb) {
  const auto& m = checkpoint.manifest();
  check_data_cursor(checkpoint.dir(), m.meta.data_cursor, spec_.domain_weights);
  const size_t bytes = trainer::load_checkpoint(checkpoint, trainer_.model_to_load(), &trainer_.optimizer(),
                                                {}, role_.owned_params);
  spdlog::info("read {:.2f} MiB of {}{}", double(bytes) / (1024.0 * 1024.0), checkpoint.dir(),
               role_.owned_params.empty() ? "" : " (its ranges of the weights: ZeRO-3)");
  // What computed the saved weights: checkpoints before the device keys recorded the precision in their
  // spec only, and trained on CPUs.
  std::string saved_dtype = m.meta.extra.value("dtype", std::string());
  if (saved_dtype.empty() && m.meta.extra.contains("spec"))
    saved_dtype = m.meta.extra["spec"].value("precision.dtype", std::string("fp32"));
  const std::string saved_device = m.meta.extra.value("device", std::string("cpu"));
  const std::string dtype(trainer::dtype_name(spec_.dtype));
  const std::string device(trainer::device_name(spec_.device));
  const bool same_dtype = saved_dtype == dtype || saved_dtype.empty();
  if (!same_dtype)
    spdlog::warn(
        "{} was trained in {} on {}; continuing in {} on {} from its FP32 master weights and moments",
        checkpoint.dir(), saved_dtype, saved_device, dtype, device);
  lineage_ = m.meta.extra.value("lineage", Json());
  // Another image is other software (libraries, the programs themselves): said, not refused.
  const std::string saved_image = m.meta.extra.value("image", std::string());
  if (saved_image != image_) {
    auto where = [](const std::string& d) {
      return d.empty() ? std::string("outside any image") : "in image " + d;
    };
    spdlog::warn("{} was trained {}; this run is {}", checkpoint.dir(), where(saved_image), where(image_));
  }
  loaded_outcome_ = m.meta.extra.value(kStepOutcome, Json());
  trainer_.optimizer().restore_steps(m.meta.step);
  trainer_.optimizer().set_moment_steps_before(m.meta.extra.value(kMomentStepsBefore, int64_t{0}));
  // The verification step: the batch saved with the checkpoint must give the loss it gave at save time.
  // It is one micro-batch of the whole data-parallel group; each rank checks its part.
  const std::optional<MicroBatch> global = verification_batch(checkpoint, spec_.model.seq_len);
  const int dp = spec_.layout.dp, rows = spec_.batch;
  if (global && global->rows % (dp * rows) != 0) {
    spdlog::warn(
        "{}: its verification batch of {} sequences is not whole micro-batches of this layout (dp x "
        "data.batch = {}); resuming without the verification step",
        checkpoint.dir(), global->rows, dp * rows);
  } else if (global) {
    // A smaller data-parallel group (an elastic restart) sees the saved micro-batch as several of its own,
    // all of one size: their mean loss is the saved one.
    const int parts = global->rows / (dp * rows);
    double got = 0;
    for (int p = 0; p < parts; ++p)
      got += trainer_.loss_of(global->slice_rows(p * dp * rows + trainer_.groups().dp_rank * rows, rows)) /
             parts;
    const double want = m.meta.verification.value("loss", NAN);
    // The same layout on the same device reproduces the loss to rounding; another layout or device sums
    // in another order (PARALLEL.md); another precision computes with other values (BF16: 8 bits of
    // mantissa).
    const Layout& saved = m.meta.layout;
    const Layout& now = trainer_.groups().layout;
    const bool same_layout = saved == now;
    const double tolerance = !same_dtype ? 3e-2 : same_layout && saved_device == device ? 1e-6 : 1e-4;
    if (!(std::abs(got - want) <= tolerance * std::max(1.0, std::abs(want))))
      fail(ExitCode::kData,
           "{}: verification step gave loss {:.9g}, the checkpoint recorded {:.9g} (saved on {})",
           checkpoint.dir(), got, want, saved.str());
    if (!same_layout) spdlog::info("checkpoint saved on {}, resumed on {}", saved.str(), now.str());
    spdlog::info("{} {} (step {}); verification loss {:.6f} matches", verb, checkpoint.dir(), m.meta.step,
                 got);
  }
  last_saved_step_ = m.meta.step;
  return m.meta.step;
}

ckpt::CheckpointMeta RunCheckpoints::meta(const trainer::StepStats& stats, int64_t tokens,
                                          const MicroBatch& first) {
  ckpt::CheckpointMeta m;
  m.step = stats.step;
  m.tokens = tokens;
  m.loss = stats.loss;
  m.spec_hash = config_.hash();
  // The resolved spec itself, so a resume with another spec can say which keys differ (spec_check.h).
  m.extra["spec"] = config_.values();
  if (!lineage_.is_null()) m.extra["lineage"] = lineage_;
  // Which software computed the weights: the image's digest (docs/IMAGES.md); none outside an image.
  if (!image_.empty()) m.extra["image"] = image_;
  // Which tokenizer the weights speak: a run that uses this model as a teacher checks it (teacher.h).
  m.extra["tokenizer_sha256"] = tokenizer_;
  // What computed the weights (the tensors are FP32 master weights and moments whatever it was).
  m.extra["device"] = std::string(trainer::device_name(spec_.device));
  m.extra["dtype"] = std::string(trainer::dtype_name(spec_.dtype));
  m.extra[kStepOutcome] = trainer::step_outcome(stats, tokens);
  if (const int64_t before = trainer_.optimizer().moment_steps_before(); before > 0)
    m.extra[kMomentStepsBefore] = before;
  m.dataset_version = dataset_version_;
  m.model_config = trainer::model_spec_json(spec_.model);
  // Data order is a pure function of the step (synthetic stream, or the reader's cursor = step x batch) and
  // of the spec (data.order, data.domain_weights), which the spec check holds fixed across a resume. The
  // reader's cursor records what the order depended on, so a resume can say which key changed.
  m.data_cursor = {{"step", stats.step}};
  if (Json cursor = data_.cursor(stats.step); !cursor.is_null()) m.data_cursor["reader"] = std::move(cursor);
  // The verification batch: the step's first micro-batch, every data-parallel rank's part of it.
  const MicroBatch global = gather_micro_batch(*trainer_.groups().dp, first);
  m.verification = {{"loss", trainer_.loss_of(first)}, {"rows", global.rows}, {"format", kBatchFormat}};
  m.layout = spec_.layout;
  m.verification_bytes = global.serialize();
  return m;
}

ckpt::SaveEvent RunCheckpoints::save(ckpt::Tier tier, const trainer::StepStats& stats, int64_t tokens,
                                     std::span<const MicroBatch> batches, bool wait) {
  const auto tensors = trainer::checkpoint_tensors(trainer_.held_model(), &trainer_.optimizer(), role_);
  ckpt::SaveEvent e = wait ? saver_.save(tier, meta(stats, tokens, batches.front()), tensors)
                           : saver_.save_async(tier, meta(stats, tokens, batches.front()), tensors);
  last_saved_step_ = stats.step;
  last_save_time_ = std::chrono::steady_clock::now();
  return e;
}

void RunCheckpoints::after_step(const trainer::StepStats& stats, int64_t tokens,
                                std::span<const MicroBatch> batch) {
  if (!spec_.rl.between_rollouts(stats.step)) return;
  const double since =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_time_).count();
  ckpt::Due due = ckpt::due_at(tiers_, stats.step, last_saved_step_, since);
  // A save is collective: when it depends on the clock, rank 0's clock decides for every rank.
  if (tiers_.recovery_every_s > 0 && coord_.size() > 1)
    due = ckpt::Due(std::stoi(coord_.broadcast(std::to_string(int(due)))));
  if (due == ckpt::Due::kNone) return;
  const auto tier = due == ckpt::Due::kMilestone ? ckpt::Tier::kMilestone : ckpt::Tier::kRecovery;
  save(tier, stats, tokens, batch, false);
}

void RunCheckpoints::save_now(const trainer::StepStats& stats, int64_t tokens,
                              std::span<const MicroBatch> batch) {
  saver_.wait();
  const auto e = save(ckpt::Tier::kRecovery, stats, tokens, batch, true);
  if (e.outcome != ckpt::Outcome::kCommitted)
    fail(ExitCode::kIo, "could not save the preemption checkpoint of step {}: {}", stats.step, e.error);
}

void RunCheckpoints::finish(const trainer::StepStats& stats, int64_t tokens,
                            std::span<const MicroBatch> batch) {
  saver_.wait();
  const auto committed = ckpt::list_checkpoints(spec_.dir, ckpt::Tier::kMilestone);
  if (!committed.empty() && committed.back().step == stats.step) return;
  const auto e = save(ckpt::Tier::kMilestone, stats, tokens, batch, true);
  if (e.outcome != ckpt::Outcome::kCommitted)
    fail(ExitCode::kIo, "could not save the final checkpoint of step {}: {}", stats.step, e.error);
}

}  // namespace forge::launcher
