#include "spec_check.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <optional>

namespace forge::launcher {

namespace fs = std::filesystem;

bool may_change_on_resume(const std::string& key) {
  // What the run trains is the model, data and optimizer; how long, on how many threads or ranks
  // (checkpoints reshard), on which device and in which precision (checkpoints hold FP32 master weights
  // and moments whatever computed them: a change is one warning line at resume), where, through which
  // node-local cache, in which image (a change is one warning line at resume), and how it is checkpointed,
  // guarded and traced may change.
  static const char* const kKeys[] = {"run.steps",
                                      "run.image",
                                      "run.threads",
                                      "run.peak_gflops",
                                      "run.memory_per_rank_gib",
                                      "model.recompute",
                                      "model.recompute_every",
                                      "run.dir",
                                      "run.trace_steps",
                                      "run.device",
                                      "precision.dtype",
                                      "parallel.comm",
                                      "parallel.tp",
                                      "parallel.cp",
                                      "parallel.cp_comm",
                                      "parallel.sequence_parallel",
                                      "parallel.ep",
                                      "parallel.pp",
                                      "parallel.dp",
                                      "parallel.zero",
                                      "parallel.zero_group",
                                      "rl.overlap_rewards",
                                      "parallel.prefetch",
                                      "parallel.reduce_each_microbatch",
                                      "parallel.stage_layers",
                                      "parallel.pp_schedule",
                                      "parallel.pp_virtual",
                                      "parallel.elastic",
                                      "data.cache_dir",
                                      "data.cache_max_bytes"};
  if (key.rfind("ckpt.", 0) == 0 || key.rfind("guard.", 0) == 0) return true;
  return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

std::vector<std::string> spec_differences(const std::map<std::string, std::string>& saved,
                                          const Config& now) {
  std::vector<std::string> out;
  const auto& current = now.values();
  for (const auto& [key, value] : current) {
    if (may_change_on_resume(key)) continue;
    const auto it = saved.find(key);
    if (it == saved.end()) {
      if (now.source(key) != "default") out.push_back(fmt::format("{}: (unset) -> {}", key, value));
    } else if (it->second != value) {
      out.push_back(fmt::format("{}: {} -> {}", key, it->second, value));
    }
  }
  for (const auto& [key, value] : saved)
    if (!current.contains(key) && !may_change_on_resume(key))
      out.push_back(fmt::format("{}: {} -> (no such key)", key, value));
  return out;
}

namespace {

struct Saved {
  std::string dir, hash;
  std::optional<std::map<std::string, std::string>> spec;
};

// The newest committed recovery or milestone checkpoint whose manifest reads; damaged ones are the
// resume logic's business.
std::optional<Saved> newest_checkpoint(const std::string& run_dir) {
  auto all = ckpt::list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->tier == ckpt::Tier::kRelease) continue;
    try {
      const auto c = ckpt::Checkpoint::open(it->path);
      Saved s{c.dir(), c.manifest().meta.spec_hash, std::nullopt};
      const Json& extra = c.manifest().meta.extra;
      if (extra.contains("spec") && extra["spec"].is_object())
        s.spec = extra["spec"].get<std::map<std::string, std::string>>();
      return s;
    } catch (const Error&) {
      continue;
    }
  }
  return std::nullopt;
}

void move_aside(const std::string& run_dir) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const fs::path root(run_dir);
  fs::path dest = root / "superseded" / stamp;
  for (int n = 1; fs::exists(dest); ++n) dest = root / "superseded" / fmt::format("{}-{}", stamp, n);
  std::vector<std::string> moved;
  for (const char* name : {"checkpoints", "metrics", "tb", "summary.json", "report.html"}) {
    if (!fs::exists(root / name)) continue;
    std::error_code ec;
    fs::create_directories(dest, ec);
    if (!ec) fs::rename(root / name, dest / name, ec);
    if (ec)
      fail(ExitCode::kIo, "--force-new: cannot move {} to {}: {}; move the old run's files away by hand",
           (root / name).string(), dest.string(), ec.message());
    moved.push_back(name);
  }
  if (!moved.empty())
    spdlog::warn("--force-new: moved the previous run's {} to {}; starting afresh", fmt::join(moved, ", "),
                 dest.string());
}

}  // namespace

void check_resume_spec(const Config& config, const std::string& run_dir, bool force_new) {
  if (force_new) {
    move_aside(run_dir);
    return;
  }
  const auto saved = newest_checkpoint(run_dir);
  if (!saved || saved->hash == config.hash()) return;
  if (!saved->spec)
    fail(
        ExitCode::kUsage,
        "{} was written by spec {} and this spec is {}, and that checkpoint does not record its keys; resume "
        "with the spec that wrote it, or pass --force-new to start afresh (the old files are moved to "
        "{}/superseded/)",
        saved->dir, saved->hash, config.hash(), run_dir);
  const auto diffs = spec_differences(*saved->spec, config);
  if (diffs.empty()) return;
  fail(ExitCode::kUsage,
       "run directory {} holds checkpoints of another spec ({} in {} vs {} now): {}; resume with the same "
       "values, or pass --force-new to start afresh (the old files are moved to {}/superseded/)",
       run_dir, saved->hash, fs::path(saved->dir).filename().string(), config.hash(), fmt::join(diffs, ", "),
       run_dir);
}

}  // namespace forge::launcher
