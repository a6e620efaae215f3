#include "tensorboard_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <span>
#include <utility>

namespace forge::launcher {

namespace {

// Metrics record field -> TensorBoard tag (rank 0's file); the step-time split shares the time/ family.
constexpr std::pair<const char*, const char*> kRunScalars[] = {
    {"loss", "train/loss"},
    {"grad_norm", "train/grad_norm"},
    {"lr", "train/lr"},
    {"tokens", "train/tokens"},
    {"tokens_per_s", "throughput/tokens_per_s"},
    {"mfu", "throughput/mfu"},
    {"step_ms", "time/step_ms"},
    {"compute_ms", "time/compute_ms"},
    {"comm_ms", "time/comm_ms"},
    {"bubble_ms", "time/bubble_ms"},
    {"bubble_fraction", "time/bubble_fraction"},
    {"bubble_analytic", "time/bubble_analytic"},
    {"cp_comm_ms", "time/cp_comm_ms"},
    {"gather_ms", "time/gather_ms"},
    {"data_wait_ms", "time/data_wait_ms"},
    {"ckpt_stall_ms", "time/ckpt_stall_ms"},
    {"peak_rss_mib", "memory/peak_rss_mib"},
    {"state_mib", "memory/state_mib"},
};
// What each rank writes about itself, to compare ranks.
constexpr std::pair<const char*, const char*> kRankScalars[] = {
    {"step_ms", "rank/step_ms"},       {"compute_ms", "rank/compute_ms"},     {"comm_ms", "rank/comm_ms"},
    {"cp_comm_ms", "rank/cp_comm_ms"}, {"data_wait_ms", "rank/data_wait_ms"}, {"state_mib", "rank/state_mib"},
};

}  // namespace

template <typename F>
void TensorBoardLog::guarded(std::optional<trainer::EventFileWriter>& file, F&& body) {
  if (!file) return;
  try {
    body(*file);
    file->flush();
  } catch (const std::exception& e) {
    spdlog::warn("TensorBoard events stop: {}; training continues", e.what());
    file.reset();
  }
}

TensorBoardLog::TensorBoardLog(const std::string& run_dir, int rank, int64_t resumed_step) {
  const std::filesystem::path tb = std::filesystem::path(run_dir) / "tb";
  try {
    if (rank == 0) run_.emplace(tb.string());
    rank_.emplace((tb / fmt::format("rank-{:05d}", rank)).string());
  } catch (const std::exception& e) {
    spdlog::warn("no TensorBoard events: {}; training continues", e.what());
    run_.reset();
    rank_.reset();
  }
  if (resumed_step > 0) restart(resumed_step);
}

void TensorBoardLog::restart(int64_t step) {
  guarded(run_, [&](auto& f) { f.restart(step); });
  guarded(rank_, [&](auto& f) { f.restart(step); });
}

void TensorBoardLog::write(const Json& record) {
  const int64_t step = record.at("step").get<int64_t>();
  using Table = std::span<const std::pair<const char*, const char*>>;
  const auto scalars = [&](trainer::EventFileWriter& file, Table table) {
    for (const auto& [field, tag] : table)
      if (record.contains(field) && record.at(field).is_number())
        file.scalar(tag, step, record.at(field).get<double>());
  };
  // run.objective = grpo, ppo: the rollouts' figures (rollouts.h; nested ones under their parent's name) and
  // the loss's (PPO's value head's too).
  std::vector<std::pair<std::string, double>> rollout;
  const Json figures = record.value("rollout", Json::object());
  for (const auto& [name, value] : figures.items()) {
    if (value.is_number()) rollout.emplace_back("rl/" + name, value.get<double>());
    if (value.is_object())
      for (const auto& [part, v] : value.items())
        if (v.is_number()) rollout.emplace_back(fmt::format("rl/{}/{}", name, part), v.get<double>());
  }
  for (const char* field :
       {"clip_fraction", "kl", "ratio", "entropy", "value_loss", "value", "value_clip_fraction"})
    if (!rollout.empty() && record.contains(field) && record.at(field).is_number())
      rollout.emplace_back(std::string("rl/") + field, record.at(field).get<double>());
  guarded(run_, [&](auto& f) {
    scalars(f, kRunScalars);
    for (const char* events : {"guard_events", "ckpt_events"})
      if (record.contains(events))
        for (const Json& e : record.at(events)) f.text(fmt::format("events/{}", events), step, e.dump());
    if (record.value("skipped", false)) f.text("events/guard_events", step, "update skipped (non-finite)");
    for (const auto& [tag, value] : rollout) f.scalar(tag, step, value);
    for (const Json& m : record.value("moe", Json::array()))
      for (const char* field : {"tokens_cv", "dropped_fraction", "router_entropy", "aux_loss", "z_loss"})
        if (m.contains(field) && m.at(field).is_number())
          f.scalar(fmt::format("moe/block{}/{}", m.value("layer", 0), field), step,
                   m.at(field).get<double>());
  });
  guarded(rank_, [&](auto& f) { scalars(f, kRankScalars); });
}

}  // namespace forge::launcher
