// forge-ckpt registry: the model registry's commands (add, list, show, lineage, export, init).
#include "commands.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/export.h"
#include "forge/ckpt/registry.h"
#include "forge/common/error.h"
#include "forge/common/privilege.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>

namespace forge::ckpt::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

constexpr const char* kRegistryUsage =
    R"(usage: forge-ckpt registry COMMAND [options]   (forge-ckpt registry COMMAND --help for its options)

  add [RELEASE_DIR] [--verdict FILE]   register a release (or the one the gate's verdict.json promoted)
  list                        every release you may see: name:version, team, step, data, gate, parent
  show MODEL                  all fields of one release
  lineage MODEL               the model and its parents back to the run trained from scratch
  export MODEL --out FILE|DIR one HDF5 file (docs/CHECKPOINTS.md), recorded as the release's export
  init                        create the registry (and its -wal and -shm files) if missing

MODEL is NAME (its newest version), NAME:VERSION, or a release directory (a path with a '/').
Every command takes --registry DB (default: $FORGE_REGISTRY, else {}).
Only who may write a release's run directory (its team) registers it or records its export; only who
may read it (its team) sees it: other teams' releases are neither listed nor shown.
exit status: 0 ok, 64 unknown model or bad option, 65 damaged registry or checkpoint, 74 I/O or a run
directory the caller cannot write
)";

// The first 12 hex digits of a hash, enough to tell versions apart in a table.
std::string short_hash(const std::string& h) {
  return h.empty() ? "-" : h.substr(0, 12);
}

std::string or_dash(const std::string& s) {
  return s.empty() ? "-" : s;
}

std::string gate_word(const Json& verdict) {
  if (!verdict.is_object() || !verdict.contains("pass") || !verdict.at("pass").is_boolean()) return "-";
  return verdict.at("pass").get<bool>() ? "pass" : "FAIL";
}

std::string parent_ref(const Registry& reg, const Release& r) {
  if (r.parent.empty()) return "";
  const auto p = reg.find_path(r.parent);
  if (p && !caller_may_see(*p)) return "(another team's release)";
  return p ? p->ref() : r.parent;
}

// The release MODEL names, if the caller may see it; another team's is as unknown as a missing one.
Release find_visible(const Registry& reg, const std::string& model) {
  Release r = reg.find(model);
  if (!caller_may_see(r))
    fail(ExitCode::kUsage, "no model '{}' that you may see in registry '{}': it is another team's", model,
         reg.path());
  return r;
}

int registry_add(const Args& args) {
  po::options_description desc("registry add options");
  std::string release, verdict_file, registry, name, team;
  desc.add_options()("release", po::value(&release), "release directory (<run>/checkpoints/release/step-N)")(
      "verdict", po::value(&verdict_file), "the gate's verdict.json: register the release it promoted to")(
      "name", po::value(&name), "model name (default: run.name)")(
      "team", po::value(&team), "team (default: $SLURM_JOB_ACCOUNT)")("json", "JSON output");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, "release",
             "registry add [RELEASE_DIR] [--verdict FILE] [--name N] [--team T] [--registry DB] [--json]",
             vm))
    return 0;
  if (!verdict_file.empty()) {
    const Json v = [&] {
      const privilege::AsCaller as_caller;  // the caller's file, read with the caller's rights
      return read_json(verdict_file);
    }();
    const Json promoted = v.is_object() ? v.value("promoted_to", Json()) : Json();
    if (!promoted.is_string())
      fail(ExitCode::kUsage, "{} promoted nothing (promoted_to is {}): no release to register", verdict_file,
           promoted.dump());
    if (!release.empty() && fs::absolute(release).lexically_normal() !=
                                fs::absolute(promoted.get<std::string>()).lexically_normal())
      fail(ExitCode::kUsage, "{} promoted {}, not {}: give one of them", verdict_file,
           promoted.get<std::string>(), release);
    release = promoted.get<std::string>();
  }
  if (release.empty()) fail(ExitCode::kUsage, "registry add: give RELEASE_DIR or --verdict FILE");
  Registry reg = open_registry(registry_for(registry), Registry::Mode::kCreate);
  const Release r = reg.add(release, {.name = name, .team = team, .promote_job = ""});
  if (vm.count("json")) {
    Json out = r.to_json();
    out["registry"] = reg.path();
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("registered {} as {} in {}\n", r.path, r.ref(), reg.path());
  }
  return 0;
}

int registry_list(const Args& args) {
  po::options_description desc("registry list options");
  std::string registry;
  desc.add_options()("json", "JSON lines output, one release a line");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, nullptr, "registry list [--registry DB] [--json]", vm)) return 0;
  const Registry reg = open_registry(registry_for(registry), Registry::Mode::kExisting);
  const bool json = vm.count("json") > 0;
  if (!json)
    fmt::print("{:<24} {:<12} {:>8} {:<9} {:<12} {:<4} {:<24} {}\n", "MODEL", "TEAM", "STEP", "OBJECTIVE",
               "DATASET", "GATE", "PARENT", "PATH");
  for (const Release& r : reg.list()) {
    if (!caller_may_see(r)) continue;
    if (json) {
      fmt::print("{}\n", r.to_json().dump());
      continue;
    }
    fmt::print("{:<24} {:<12} {:>8} {:<9} {:<12} {:<4} {:<24} {}\n", r.ref(), or_dash(r.team), r.step,
               or_dash(r.objective), short_hash(r.dataset_version), gate_word(r.verdict),
               or_dash(parent_ref(reg, r)), r.path);
  }
  return 0;
}

int registry_show(const Args& args) {
  po::options_description desc("registry show options");
  std::string model, registry;
  desc.add_options()("model", po::value(&model)->required(), "NAME, NAME:VERSION or a release directory")(
      "json", "JSON output");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, "model", "registry show NAME[:VERSION]|PATH [--registry DB] [--json]", vm)) return 0;
  const Registry reg = open_registry(registry_for(registry), Registry::Mode::kExisting);
  const Release r = find_visible(reg, model);
  const std::string parent = parent_ref(reg, r);
  if (vm.count("json")) {
    Json out = r.to_json();
    out["parent_ref"] = parent;
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("model        {}\nrelease      {}\npromoted     from {}\n", r.ref(), r.path, or_dash(r.source));
  fmt::print("team         {}\nrun          {}\nowner group  {}\nobjective    {}\nstep         {}\n",
             or_dash(r.team), r.run_dir, or_dash(r.owner_group), or_dash(r.objective), r.step);
  fmt::print("train jobs   {}\npromote job  {}\n",
             r.train_jobs.empty() ? "-" : fmt::format("{}", fmt::join(r.train_jobs, ", ")),
             or_dash(r.promote_job));
  fmt::print("dataset      {}\ntokenizer    {}\nspec hash    {}\n", or_dash(r.dataset_version),
             or_dash(r.tokenizer_sha256), or_dash(r.spec_hash));
  fmt::print("image        {}\n", r.image.empty() ? "- (the nodes' software)" : r.image);
  fmt::print("parent       {}\n", parent.empty() ? "- (trained from scratch)" : parent);
  fmt::print("gate         {}\n", gate_word(r.verdict));
  if (r.metrics.is_object())
    for (const auto& [domain, m] : r.metrics.items()) fmt::print("  {:<10} {}\n", domain, m.dump());
  fmt::print("export       {}\n", or_dash(r.export_path));
  fmt::print("registered   {:%Y-%m-%d %H:%M:%S} UTC\n",
             fmt::gmtime(static_cast<std::time_t>(r.registered_unix)));
  return 0;
}

int registry_lineage(const Args& args) {
  po::options_description desc("registry lineage options");
  std::string model, registry;
  desc.add_options()("model", po::value(&model)->required(),
                     "NAME, NAME:VERSION, or a release or checkpoint directory")("json", "JSON output");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, "model", "registry lineage NAME[:VERSION]|PATH [--registry DB] [--json]", vm))
    return 0;
  const Registry reg = open_registry(registry_for(registry), Registry::Mode::kExisting);
  // A path needs no entry of its own: an unregistered checkpoint's lineage comes from its manifest.
  const bool is_path = model.find('/') != std::string::npos;
  const std::string dir = is_path ? model : find_visible(reg, model).path;
  const std::vector<Generation> gens = reg.lineage(dir);
  if (vm.count("json")) {
    Json out{{"model", model}, {"registry", reg.path()}, {"generations", Json::array()}};
    std::vector<std::string> datasets;
    for (const auto& g : gens) {
      out["generations"].push_back(g.to_json());
      if (!g.dataset_version.empty() &&
          std::find(datasets.begin(), datasets.end(), g.dataset_version) == datasets.end())
        datasets.push_back(g.dataset_version);
    }
    out["dataset_versions"] = datasets;
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("{:<24} {:>8} {:<9} {:<12} {:<12} {}\n", "MODEL", "STEP", "OBJECTIVE", "DATASET", "TOKENIZER",
             "RUN");
  for (const auto& g : gens) {
    const bool imported = g.origin.is_object();
    fmt::print("{:<24} {:>8} {:<9} {:<12} {:<12} {}{}\n", g.ref.empty() ? g.path : g.ref, g.step,
               imported    ? "import"
               : g.on_disk ? or_dash(g.objective)
                           : "?",
               short_hash(g.dataset_version), g.on_disk ? short_hash(g.tokenizer_sha256) : "?",
               imported ? g.path : g.run_dir,
               g.on_disk ? "" : "  (checkpoint gone: from its child's record)");
    if (imported)
      fmt::print("  imported from {}{}{} ({} files, sha256 recorded)\n", g.origin.value("source", ""),
                 g.origin.contains("model_id") ? ", model " + g.origin["model_id"].get<std::string>() : "",
                 g.origin.contains("revision") ? " at " + g.origin["revision"].get<std::string>() : "",
                 g.origin.value("files", Json::object()).size());
    if (!g.image.empty()) fmt::print("  trained in image {}\n", g.image);
  }
  return 0;
}

int registry_export(const Args& args) {
  po::options_description desc("registry export options");
  std::string model, out, registry;
  desc.add_options()("model", po::value(&model)->required(), "NAME, NAME:VERSION or a release directory")(
      "out", po::value(&out)->required(), "HDF5 file, or a directory for NAME-vVERSION.h5")(
      "params-only", "leave out the optimizer states");
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, "model", "registry export NAME[:VERSION]|PATH --out FILE|DIR [--params-only]", vm))
    return 0;
  Registry reg = open_registry(registry_for(registry), Registry::Mode::kExisting);
  const Release r = find_visible(reg, model);
  std::string file;
  {
    // The export is the caller's: read and written with the caller's rights and umask.
    const privilege::AsCaller as_caller;
    std::error_code ec;
    file = fs::is_directory(out, ec) ? (fs::path(out) / fmt::format("{}-v{}.h5", r.name, r.version)).string()
                                     : out;
    const Checkpoint c = Checkpoint::open(r.path);
    c.verify();
    export_hdf5(c, file, vm.count("params-only") == 0);
  }
  fmt::print("exported {} ({}, step {}) to {}\n", r.ref(), r.path, r.step, file);
  // Anyone may export a release; only its team records the export in its entry.
  if (caller_can_write(r.run_dir))
    reg.set_export(r.id, file);
  else
    fmt::print(
        stderr,
        "forge-ckpt: note: the export is not recorded in the registry: only the team that owns {} (its "
        "group) records the exports of {}\n",
        r.run_dir, r.ref());
  return 0;
}

int registry_init(const Args& args) {
  po::options_description desc("registry init options");
  std::string registry;
  add_registry_option(desc, registry);
  po::variables_map vm;
  if (!parse(args, desc, nullptr, "registry init [--registry DB]", vm)) return 0;
  const Registry reg = open_registry(registry_for(registry), Registry::Mode::kCreate);
  fmt::print("registry {} is ready\n", reg.path());
  return 0;
}

}  // namespace

std::string registry_for(const std::string& given) {
  if (!privilege::privileged()) return registry_path(given);
  const std::string named = !given.empty() ? given : registry_path("");
  privilege::check_system_path("forge-ckpt", "registry", kDefaultRegistry, named);
  return kDefaultRegistry;
}

Registry open_registry(const std::string& path, Registry::Mode mode) {
  if (privilege::privileged())
    privilege::require_root_owned_db("forge-ckpt", "registry", path, "forge-ckpt registry init");
  return Registry(path, mode);
}

void add_registry_option(po::options_description& desc, std::string& path) {
  const std::string help =
      fmt::format("model registry database (default: $FORGE_REGISTRY, else {})", kDefaultRegistry);
  desc.add_options()("registry", po::value(&path), help.c_str());
}

int registry(const Args& args) {
  const std::map<std::string, std::function<int(const Args&)>> commands = {
      {"add", registry_add},         {"list", registry_list},     {"show", registry_show},
      {"lineage", registry_lineage}, {"export", registry_export}, {"init", registry_init}};
  if (args.empty()) {
    fmt::print(stderr, fmt::runtime(kRegistryUsage), kDefaultRegistry);
    return static_cast<int>(ExitCode::kUsage);
  }
  const std::string& command = args.front();
  if (command == "--help" || command == "-h" || command == "help") {
    fmt::print(fmt::runtime(kRegistryUsage), kDefaultRegistry);
    return 0;
  }
  const auto it = commands.find(command);
  if (it == commands.end())
    fail(ExitCode::kUsage, "unknown registry command '{}': use add, list, show, lineage, export or init",
         command);
  return it->second(Args(args.begin() + 1, args.end()));
}

}  // namespace forge::ckpt::cli
