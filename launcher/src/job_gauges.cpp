#include "job_gauges.h"

#include "forge/common/error.h"
#include "forge/common/local_rank.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

namespace forge::launcher {

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

constexpr auto kMinInterval = std::chrono::seconds(5);

}  // namespace

JobGauges::JobGauges(const comm::ProcessGroups& groups) {
  const char* dir = std::getenv("FORGE_PROMETHEUS_DIR");
  if (dir == nullptr || *dir == '\0' || local_rank().rank != 0) return;
  const std::string job = env_or("SLURM_JOB_ID", "none"), node = node_name();
  labels_ = {{"job_id", job},
             {"team", env_or("FORGE_TEAM", "")},
             {"tier", env_or("FORGE_TIER", "")},
             {"layout", groups.layout.str()},
             {"node", node}};
  path_ = (std::filesystem::path(dir) / fmt::format("forge_job_{}_{}.prom", job, node)).string();
}

JobGauges::~JobGauges() {
  std::error_code ec;  // a finished job exports nothing; a file already gone is fine
  if (!path_.empty()) std::filesystem::remove(path_, ec);
}

void JobGauges::update(const Json& record, const JobProgress& progress) {
  if (path_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_write_ != std::chrono::steady_clock::time_point{} && now - last_write_ < kMinInterval) return;
  last_write_ = now;
  PromGauges g;
  g.set("forge_job_step", "Optimizer steps done by the job.", labels_, record.at("step").get<double>());
  g.set("forge_job_loss", "Training loss of the latest step.", labels_, record.at("loss").get<double>());
  g.set("forge_job_tokens_per_second", "Tokens per second of the latest step, all ranks.", labels_,
        record.at("tokens_per_s").get<double>());
  g.set("forge_job_mfu", "Model FLOPs utilisation of the latest step, 0..1.", labels_,
        record.at("mfu").get<double>());
  g.set("forge_job_last_checkpoint_age_seconds",
        "Seconds since the newest checkpoint this process committed (since the process started if none).",
        labels_, progress.checkpoint_age_s);
  g.set("forge_job_ettr", "Effective training time ratio of this process so far, 0..1.", labels_,
        progress.ettr);
  try {
    write_file_atomic(path_, g.text());
  } catch (const Error& e) {
    spdlog::warn("Prometheus textfile off: {}; training continues", e.what());
    path_.clear();
  }
}

}  // namespace forge::launcher
