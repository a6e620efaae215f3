#include "commands.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/export.h"
#include "forge/ckpt/maintenance.h"
#include "forge/ckpt/policy.h"
#include "forge/ckpt/registry.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/privilege.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>

namespace forge::ckpt::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

bool parse(const Args& args, po::options_description& desc, const char* positional, const char* usage,
           po::variables_map& vm) {
  desc.add_options()("help,h", "this help");
  po::positional_options_description pos;
  if (positional) pos.add(positional, 1);
  po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: forge-ckpt " << usage << "\n" << desc << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string human_age(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f}s", seconds);
  if (seconds < 7200) return fmt::format("{:.0f}m", seconds / 60);
  if (seconds < 172800) return fmt::format("{:.1f}h", seconds / 3600);
  return fmt::format("{:.1f}d", seconds / 86400);
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json loss_json(double loss) {
  return std::isfinite(loss) ? Json(loss) : Json(nullptr);
}

void require_run_dir(const std::string& run) {
  if (!fs::is_directory(run)) fail(ExitCode::kUsage, "no run directory '{}'", run);
}

}  // namespace

int list(const Args& args) {
  po::options_description desc("list options");
  std::string run, tier;
  desc.add_options()("run", po::value(&run)->required(), "run directory")(
      "tier", po::value(&tier), "only this tier (recovery, milestone, release)")("json", "JSON lines output");
  po::variables_map vm;
  if (!parse(args, desc, "run", "list RUN_DIR [--tier T] [--json]", vm)) return 0;
  require_run_dir(run);
  const auto entries = tier.empty() ? list_checkpoints(run) : list_checkpoints(run, parse_tier(tier));
  const bool json = vm.count("json") > 0;
  if (!json)
    fmt::print("{:<10} {:>10} {:>10} {:>10} {:>7}  {}\n", "TIER", "STEP", "SIZE", "LOSS", "AGE", "PATH");
  for (const auto& e : entries) {
    Json row{{"tier", tier_name(e.tier)}, {"step", e.step}, {"path", e.path}};
    try {
      const Checkpoint c = Checkpoint::open(e.path);
      row["bytes"] = c.bytes();
      row["loss"] = loss_json(c.manifest().meta.loss);
      row["age_s"] = now_unix() - c.manifest().created_unix;
      row["state"] = "committed";
    } catch (const Error& err) {
      row["state"] = "damaged";
      row["error"] = err.what();
    }
    if (json) {
      fmt::print("{}\n", row.dump());
    } else if (row["state"] == "damaged") {
      fmt::print("{:<10} {:>10} {:>10} {:>10} {:>7}  {}  (damaged: run forge-ckpt verify)\n",
                 row["tier"].get<std::string>(), e.step, "?", "?", "?", e.path);
    } else {
      fmt::print("{:<10} {:>10} {:>10} {:>10} {:>7}  {}\n", row["tier"].get<std::string>(), e.step,
                 human_bytes(row["bytes"].get<uint64_t>()),
                 row["loss"].is_null() ? std::string("-") : fmt::format("{:.4f}", row["loss"].get<double>()),
                 human_age(row["age_s"].get<double>()), e.path);
    }
  }
  return 0;
}

int verify(const Args& args) {
  po::options_description desc("verify options");
  std::string target, model_config, dataset;
  desc.add_options()("ckpt", po::value(&target)->required(),
                     "checkpoint directory, or a run directory (all of them)")(
      "model-config", po::value(&model_config), "JSON file: the model config the checkpoint must have")(
      "dataset-version", po::value(&dataset), "the dataset version the checkpoint must have")("json",
                                                                                              "JSON output");
  po::variables_map vm;
  if (!parse(args, desc, "ckpt", "verify CKPT|RUN_DIR [--model-config FILE] [--dataset-version V] [--json]",
             vm))
    return 0;
  Expectations expect;
  if (!model_config.empty()) expect.model_config = read_json(model_config);
  if (!dataset.empty()) expect.dataset_version = dataset;
  std::vector<std::string> dirs;
  if (fs::is_directory(fs::path(target) / "checkpoints")) {
    for (const auto& e : list_checkpoints(target)) dirs.push_back(e.path);
  } else {
    dirs.push_back(target);
  }
  int damaged = 0;
  std::string first_error;
  for (const auto& dir : dirs) {
    try {
      const Checkpoint c = Checkpoint::open(dir);
      c.verify();
      check_expectations(c.manifest(), expect, dir);
      if (vm.count("json"))
        fmt::print(
            "{}\n",
            Json{{"path", dir}, {"ok", true}, {"step", c.manifest().meta.step}, {"bytes", c.bytes()}}.dump());
      else
        fmt::print("ok  {} (step {}, {} files, {})\n", dir, c.manifest().meta.step, c.manifest().files.size(),
                   human_bytes(c.bytes()));
    } catch (const Error& e) {
      if (dirs.size() == 1) throw;  // one line with the file named and the matching exit code
      ++damaged;
      if (first_error.empty()) first_error = e.what();
      if (vm.count("json"))
        fmt::print("{}\n", Json{{"path", dir}, {"ok", false}, {"error", e.what()}}.dump());
      else
        fmt::print("BAD {}: {}\n", dir, e.what());
    }
  }
  if (damaged > 0)
    fail(ExitCode::kData, "{} of {} checkpoints failed verification; first: {}", damaged, dirs.size(),
         first_error);
  return 0;
}

int inspect(const Args& args) {
  po::options_description desc("inspect options");
  std::string dir;
  desc.add_options()("ckpt", po::value(&dir)->required(), "checkpoint directory")("json", "JSON output");
  po::variables_map vm;
  if (!parse(args, desc, "ckpt", "inspect CKPT [--json]", vm)) return 0;
  const Checkpoint c = Checkpoint::open(dir);
  const Manifest& m = c.manifest();
  if (vm.count("json")) {
    Json tensors = Json::array();
    for (const auto& [name, t] : c.tensors())
      tensors.push_back(
          {{"name", name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"pieces", t.pieces.size()}});
    Json out = m.to_json();
    out["tensors"] = tensors;
    out["path"] = dir;
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("checkpoint   {}\n", dir);
  fmt::print("tier         {}\nstep         {}\ntokens       {}\nloss         {}\n", m.tier, m.meta.step,
             m.meta.tokens, m.meta.loss);
  fmt::print("layout       {} (written by {} ranks)\n", m.meta.layout.str(), m.world_size);
  fmt::print("spec hash    {}\ndataset      {}\nmodel        {}\n", m.meta.spec_hash, m.meta.dataset_version,
             m.meta.model_config.dump());
  fmt::print("data cursor  {}\nrng          {}\nverification {}\n", m.meta.data_cursor.dump(),
             m.meta.rng.dump(), m.meta.verification.dump());
  fmt::print("save stall   {:.3f} s, background write {:.3f} s, {} in {} files\n", m.stall_s, m.write_s,
             human_bytes(c.bytes()), m.files.size());
  if (!m.promotion.is_null()) fmt::print("promotion    {}\n", m.promotion.dump());
  fmt::print("\n{:<48} {:<5} {:<20} {}\n", "TENSOR", "DTYPE", "SHAPE", "PIECES");
  for (const auto& [name, t] : c.tensors())
    fmt::print("{:<48} {:<5} {:<20} {}\n", name, dtype_name(t.dtype), fmt::format("{}", t.shape),
               t.pieces.size());
  return 0;
}

int promote(const Args& args) {
  po::options_description desc("promote options");
  std::string dir, verdict, registry, name, team;
  desc.add_options()("ckpt", po::value(&dir)->required(), "checkpoint directory (recovery or milestone)")(
      "verdict", po::value(&verdict)->required(),
      "the gate's verdict.json, recorded in the release manifest")(
      "name", po::value(&name), "model name in the registry (default: run.name)")(
      "team", po::value(&team), "team in the registry (default: $SLURM_JOB_ACCOUNT)")(
      "no-register", "leave the release out of the registry")("json", "JSON output");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, "ckpt",
             "promote CKPT --verdict FILE [--registry DB] [--name N] [--team T] [--no-register] [--json]",
             vm))
    return 0;
  // A registry a setgid forge-ckpt may not use is refused before anything is promoted.
  const std::string registry_file = vm.count("no-register") ? "" : registry_for(registry);
  std::string target;
  {
    // The release is the run's: copied with the caller's rights and umask, not the registry's group.
    const privilege::AsCaller as_caller;
    target = ckpt::promote(dir, read_json(verdict));
  }
  Json out{{"release", target}, {"source", dir}};
  if (!vm.count("no-register")) {
    // The release is committed whatever happens here: a registry that cannot be written (or a run
    // directory the caller may not register from) costs a warning and a later `registry add`, not the
    // promotion.
    try {
      Registry reg = open_registry(registry_file, Registry::Mode::kCreate);
      out["registered"] = reg.add(target, {.name = name, .team = team, .promote_job = ""}).ref();
      out["registry"] = reg.path();
    } catch (const Error& e) {
      out["registered"] = nullptr;
      out["registry_error"] = e.what();
      fmt::print(
          stderr,
          "forge-ckpt: warning: {} is not registered: {}; register it later: forge-ckpt registry add {}\n",
          target, e.what(), target);
    }
  }
  if (vm.count("json"))
    fmt::print("{}\n", out.dump());
  else if (out.value("registered", Json()).is_string())
    fmt::print("promoted {} -> {}, registered as {} in {}\n", dir, target,
               out["registered"].get<std::string>(), out["registry"].get<std::string>());
  else
    fmt::print("promoted {} -> {}\n", dir, target);
  return 0;
}

int gc(const Args& args) {
  po::options_description desc("gc options");
  std::string run;
  int keep = 3;
  desc.add_options()("run", po::value(&run)->required(), "run directory")(
      "keep", po::value(&keep)->default_value(3), "recovery checkpoints to keep (ckpt.recovery_keep)")(
      "dry-run", "only print what would be removed")("json", "JSON output");
  po::variables_map vm;
  if (!parse(args, desc, "run", "gc RUN_DIR [--keep K] [--dry-run] [--json]", vm)) return 0;
  require_run_dir(run);
  if (keep < 1) fail(ExitCode::kUsage, "--keep {}: keep at least 1 recovery checkpoint", keep);
  const GcReport r = collect_garbage(run, keep, vm.count("dry-run") > 0);
  if (vm.count("json")) {
    fmt::print("{}\n",
               Json{{"removed", r.removed}, {"in_use", r.in_use}, {"newest_valid", r.newest_valid}}.dump());
    return 0;
  }
  const char* verb = vm.count("dry-run") ? "would remove" : "removed";
  for (const auto& p : r.removed) fmt::print("{} {}\n", verb, p);
  for (const auto& p : r.in_use) fmt::print("in use, kept {}\n", p);
  fmt::print("newest valid checkpoint: {}\n", r.newest_valid.empty() ? "(none)" : r.newest_valid);
  return 0;
}

int export_(const Args& args) {
  po::options_description desc("export options");
  std::string dir, out, format;
  desc.add_options()("ckpt", po::value(&dir)->required(), "checkpoint directory")(
      "out", po::value(&out)->required(), "HDF5 file, or (--format hf) directory to write")(
      "format", po::value(&format)->default_value("hdf5"), "hdf5 (one self-describing file) or hf")(
      "params-only", "hdf5: leave out the optimizer states")(
      "dtype", po::value<std::string>()->default_value(""),
      "hf: f32, bf16 or f16 (default: an imported model's own, else f32)")(
      "shard-size", po::value<double>()->default_value(5e9), "hf: tensor bytes per safetensors file")(
      "tokenizer", po::value<std::string>(),
      "hf: the tokenizer to hand on (default: an imported model's, else the training dataset's)")(
      "force", "hf: replace --out if it exists");
  po::variables_map vm;
  if (!parse(args, desc, "ckpt",
             "export CKPT --out FILE [--params-only] | export CKPT --format hf --out DIR [--dtype D] "
             "[--shard-size BYTES] [--tokenizer FILE] [--force]",
             vm))
    return 0;
  if (format != "hdf5" && format != "hf") fail(ExitCode::kUsage, "--format {}: give hdf5 or hf", format);
  const Checkpoint c = Checkpoint::open(dir);
  if (format == "hf") return export_hf(c, out, vm);  // verifies as it goes
  c.verify();
  export_hdf5(c, out, vm.count("params-only") == 0);
  fmt::print("exported {} (step {}) to {}\n", dir, c.manifest().meta.step, out);
  return 0;
}

int advise(const Args& args) {
  po::options_description desc("advise options");
  std::string run;
  double mtbf_h = 0, stall = 0, step_s = 0, every_s = 0, restart_s = 0;
  int64_t every = 0;
  desc.add_options()("run", po::value(&run), "run directory: stall and step time from its checkpoints")(
      "mtbf-hours", po::value(&mtbf_h)->required(), "mean time between failures of the job, hours")(
      "stall-s", po::value(&stall), "save stall per checkpoint, seconds (default: median of the run's)")(
      "step-s", po::value(&step_s), "seconds per training step (default: from the run's checkpoints)")(
      "every", po::value(&every), "current ckpt.recovery_every, steps")(
      "every-s", po::value(&every_s), "current recovery interval, seconds (instead of --every)")(
      "restart-s", po::value(&restart_s), "time to restart and load after a failure, seconds")("json",
                                                                                               "JSON output");
  po::variables_map vm;
  if (!parse(args, desc, "run", "advise [RUN_DIR] --mtbf-hours H [--stall-s C] [--step-s S] [--every N]", vm))
    return 0;
  if (!(mtbf_h > 0)) fail(ExitCode::kUsage, "--mtbf-hours {}: give a positive number of hours", mtbf_h);
  std::vector<double> stalls, step_times;
  std::string stall_source = "--stall-s";
  if (!run.empty()) {
    require_run_dir(run);
    std::vector<std::pair<int64_t, double>> points;  // recovery/milestone (step, created)
    for (const auto& e : list_checkpoints(run)) {
      if (e.tier == Tier::kRelease) continue;
      try {
        const Checkpoint c = Checkpoint::open(e.path);
        stalls.push_back(c.manifest().stall_s);
        points.emplace_back(e.step, c.manifest().created_unix);
      } catch (const Error&) {
        // A damaged checkpoint contributes no measurement.
      }
    }
    std::sort(points.begin(), points.end());
    for (size_t i = 1; i < points.size(); ++i)
      if (points[i].first > points[i - 1].first && points[i].second > points[i - 1].second)
        step_times.push_back((points[i].second - points[i - 1].second) /
                             double(points[i].first - points[i - 1].first));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  if (!vm.count("stall-s")) {
    if (stalls.empty())
      fail(ExitCode::kUsage, "no save stall measured: give --stall-s or a run directory with checkpoints");
    stall = median(stalls);
    stall_source = fmt::format("median of {} checkpoints", stalls.size());
  }
  if (!vm.count("step-s") && !step_times.empty()) step_s = median(step_times);
  const double mtbf = mtbf_h * 3600;
  const double best = young_daly_interval_s(stall, mtbf);
  Json out{{"stall_s", stall},
           {"mtbf_s", mtbf},
           {"optimal_interval_s", best},
           {"optimal_waste", expected_waste(best, stall, mtbf, restart_s)}};
  fmt::memory_buffer text;
  fmt::format_to(std::back_inserter(text), "save stall C = {:.3f} s ({}), MTBF = {:.1f} h\n", stall,
                 stall_source, mtbf_h);
  fmt::format_to(std::back_inserter(text), "Young/Daly optimal recovery interval sqrt(2*C*MTBF) = {:.4g} s",
                 best);
  if (step_s > 0) {
    out["step_s"] = step_s;
    out["optimal_every_steps"] = std::max<int64_t>(1, std::llround(best / step_s));
    fmt::format_to(std::back_inserter(text), " = ckpt.recovery_every {} at {:.3f} s/step",
                   out["optimal_every_steps"].get<int64_t>(), step_s);
  }
  fmt::format_to(std::back_inserter(text), "; expected loss {:.2f}% of run time\n",
                 100 * out["optimal_waste"].get<double>());
  if (every > 0 && step_s <= 0)
    fail(ExitCode::kUsage, "--every needs a step time: give --step-s or a run directory");
  const double current = every > 0 ? every * step_s : every_s;
  if (current > 0) {
    out["current_interval_s"] = current;
    out["current_waste"] = expected_waste(current, stall, mtbf, restart_s);
    fmt::format_to(std::back_inserter(text),
                   "current setting: every {:.4g} s: expected loss {:.2f}% of run time ({:+.2f} points)\n",
                   current, 100 * out["current_waste"].get<double>(),
                   100 * (out["current_waste"].get<double>() - out["optimal_waste"].get<double>()));
  }
  if (vm.count("json"))
    fmt::print("{}\n", out.dump());
  else
    fmt::print("{}", fmt::to_string(text));
  return 0;
}

}  // namespace forge::ckpt::cli
