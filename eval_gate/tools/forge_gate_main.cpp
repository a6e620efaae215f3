// forge-gate: evaluates a checkpoint on the dataset's validation split per domain, compares it with a
// baseline under a policy, writes verdict.json and summary.txt, and on pass promotes the checkpoint to
// the release tier. Exit 0 pass, 1 fail, 64/65/74 errors. Data parallel under srun/mpirun.
#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/maintenance.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/common/log.h"
#include "forge/dataio/manifest.h"
#include "forge/eval_gate/evaluate.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/verdict.h"
#include "forge/trainer/bootstrap.h"

#include <boost/program_options.hpp>

#include <filesystem>
#include <iostream>
#include <optional>

namespace po = boost::program_options;
using forge::ExitCode;
using forge::Json;

namespace {

struct Args {
  std::string checkpoint, dataset, baseline = "release", policy, out;
  forge::gate::EvalOptions eval;
  bool promote = true;
};

constexpr const char* kUsage =
    "usage: forge-gate evaluate --checkpoint DIR --dataset DATASET_DIR --baseline DIR|release|none\n"
    "                           --policy gate.ini --out RUN/gate/ [--max-sequences N] [--threads N]\n"
    "                           [--no-promote]\n";

Args parse(int argc, char** argv) {
  po::options_description desc("forge-gate evaluate");
  Args a;
  bool no_promote = false;
  desc.add_options()("help,h", "this help")("checkpoint", po::value(&a.checkpoint)->required(),
                                            "checkpoint directory to judge")(
      "dataset", po::value(&a.dataset)->required(), "dataset directory (its validation split is used)")(
      "baseline", po::value(&a.baseline), "a checkpoint directory, 'release' (the run's newest) or 'none'")(
      "policy", po::value(&a.policy)->required(), "gate policy INI")(
      "out", po::value(&a.out)->required(), "directory for verdict.json and summary.txt")(
      "max-sequences", po::value(&a.eval.max_sequences), "sequences per domain (0 = all)")(
      "threads", po::value(&a.eval.threads), "threads per rank (0 = SLURM_CPUS_PER_TASK or all cores)")(
      "no-promote", po::bool_switch(&no_promote), "judge only; never promote");
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage << desc;
    std::exit(argc < 2 ? 64 : 0);
  }
  if (std::string(argv[1]) != "evaluate")
    forge::fail(ExitCode::kUsage, "unknown command '{}'\n{}", argv[1], kUsage);
  po::variables_map vm;
  po::store(po::command_line_parser(argc - 1, argv + 1).options(desc).run(), vm);
  po::notify(vm);
  a.promote = !no_promote;
  return a;
}

// The baseline checkpoint directory, or nothing (none, or no release yet).
std::optional<std::string> resolve_baseline(const Args& a) {
  if (a.baseline == "none") return std::nullopt;
  if (a.baseline == "release") {
    const auto releases =
        forge::ckpt::list_checkpoints(forge::ckpt::run_dir_of(a.checkpoint), forge::ckpt::Tier::kRelease);
    if (releases.empty()) return std::nullopt;
    return releases.back().path;
  }
  if (!std::filesystem::is_directory(a.baseline))
    forge::fail(ExitCode::kUsage, "--baseline {}: not a directory (give a checkpoint, 'release' or 'none')",
                a.baseline);
  return a.baseline;
}

Json describe(const std::string& dir) {
  const auto c = forge::ckpt::Checkpoint::open(dir);
  return {{"path", std::filesystem::absolute(dir).lexically_normal().string()},
          {"step", c.manifest().meta.step},
          {"tier", c.manifest().tier},
          {"spec_hash", c.manifest().meta.spec_hash},
          {"checksum", forge::xxh3_file_hex(dir + "/" + forge::ckpt::kManifestFile)}};
}

// What the objective's figures were measured against (the DPO reference and beta, the distillation
// teacher): the verdict records it, and a baseline's recorded results count only under the same.
Json scoring(const forge::gate::EvalOptions& eval) {
  Json s = {{"objective", eval.objective}};
  if (!eval.dpo_reference.empty())
    s["dpo"] = {{"beta", eval.dpo_beta}, {"reference", describe(eval.dpo_reference)}};
  if (!eval.distill_teacher.empty()) s["distill"] = {{"teacher", describe(eval.distill_teacher)}};
  return s;
}

// A baseline promoted by an earlier gate carries its own results; reuse them when they were measured on
// this dataset version the same way, otherwise evaluate the baseline now.
forge::gate::DomainResults baseline_results(const std::string& dir, const std::string& dataset_version,
                                            const Args& a, const forge::gate::EvalOptions& eval,
                                            forge::trainer::Comm& comm, bool& reused) {
  const auto c = forge::ckpt::Checkpoint::open(dir);
  const Json& verdict =
      c.manifest().promotion.is_object() ? c.manifest().promotion.value("verdict", Json()) : Json();
  reused = verdict.is_object() && verdict.value("dataset_version", "") == dataset_version &&
           verdict.contains("domains") && verdict.value("max_sequences", int64_t{-1}) == eval.max_sequences &&
           verdict.value("replies_only", false) == eval.replies_only &&
           verdict.value("document_mask", eval.document_mask) == eval.document_mask &&
           // Verdicts from before the objectives' figures: lm and sft, scored by the loss alone.
           verdict.value("scoring", Json{{"objective", eval.objective}}) == scoring(eval);
  if (!reused) return forge::gate::evaluate_checkpoint(dir, a.dataset, eval, comm, /*own_dataset=*/false);
  forge::gate::DomainResults out;
  for (const auto& [domain, s] : verdict.at("domains").items())
    out[domain] = forge::gate::DomainStats::from_json(s);
  return out;
}

int run(int argc, char** argv, forge::trainer::Comm& comm) {
  const Args a = parse(argc, argv);
  const forge::gate::GatePolicy policy = forge::gate::load_policy(a.policy);
  const forge::data::Manifest dataset = forge::data::load_manifest(a.dataset);
  for (const auto& d : policy.required_domains)
    if (dataset.tokens("valid", d) == 0)
      forge::fail(ExitCode::kData, "required domain '{}' has no validation data in {} (domains: {})", d,
                  a.dataset, fmt::format("{}", fmt::join(dataset.domains, ", ")));

  const forge::gate::EvalOptions eval = forge::gate::as_trained(a.checkpoint, dataset.format, a.eval);
  const auto candidate = forge::gate::evaluate_checkpoint(a.checkpoint, a.dataset, eval, comm);
  const auto baseline_dir = resolve_baseline(a);
  std::optional<forge::gate::DomainResults> baseline;
  bool reused = false;
  if (baseline_dir) baseline = baseline_results(*baseline_dir, dataset.version, a, eval, comm, reused);
  const auto judgement = forge::gate::judge(policy, candidate, baseline ? &*baseline : nullptr);
  if (comm.rank() != 0) return judgement.pass ? 0 : 1;

  Json verdict = {{"pass", judgement.pass},
                  {"candidate", describe(a.checkpoint)},
                  {"baseline", baseline_dir ? describe(*baseline_dir) : Json()},
                  {"baseline_results_reused", reused},
                  {"dataset", std::filesystem::absolute(a.dataset).lexically_normal().string()},
                  {"dataset_version", dataset.version},
                  {"policy", a.policy},
                  {"max_sequences", a.eval.max_sequences},
                  {"document_mask", eval.document_mask},
                  {"replies_only", eval.replies_only},
                  {"scoring", scoring(eval)},
                  {"domains", Json::object()},
                  {"checks", Json::array()},
                  {"promoted_to", nullptr}};
  for (const auto& [domain, s] : candidate) verdict["domains"][domain] = s.to_json();
  if (baseline) {
    verdict["baseline_domains"] = Json::object();
    for (const auto& [domain, s] : *baseline) verdict["baseline_domains"][domain] = s.to_json();
  }
  for (const auto& c : judgement.checks) verdict["checks"].push_back(c.to_json());
  if (judgement.pass && a.promote) verdict["promoted_to"] = forge::ckpt::promote(a.checkpoint, verdict);

  std::filesystem::create_directories(a.out);
  forge::write_json_atomic(a.out + "/verdict.json", verdict);
  const std::string summary =
      forge::gate::summary_text(verdict) +
      (verdict["promoted_to"].is_string()
           ? "promoted to " + verdict["promoted_to"].get<std::string>() + "\n"
           : std::string(judgement.pass ? "not promoted (--no-promote)\n" : "not promoted\n"));
  forge::write_file_atomic(a.out + "/summary.txt", summary);
  std::cout << summary;
  return judgement.pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The same start-up and communicator as forge-train (forge/trainer/bootstrap.h).
  forge::trainer::Bootstrap boot = forge::trainer::bootstrap();
  forge::init_logging(boot.rank, boot.size, "warn");
  const int rc = forge::run_cli("forge-gate", [&] { return run(argc, argv, *boot.world); });
  // An error on one rank would leave the others waiting in a collective: end them all.
  if (rc != 0 && rc != 1 && boot.size > 1) boot.world->abort(rc);
  return rc;
}
