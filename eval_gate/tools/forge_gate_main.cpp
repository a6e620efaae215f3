// forge-gate: evaluates a checkpoint on the dataset's validation split per domain, compares it with a
// baseline under a policy, writes verdict.json and summary.txt, and on pass promotes the checkpoint to
// the release tier. Exit 0 pass, 1 fail, 64/65/74 errors. Data parallel under srun/mpirun.
#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/maintenance.h"
#include "forge/ckpt/store.h"
#include "forge/comm/bootstrap.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/common/log.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/manifest.h"
#include "forge/eval_gate/evaluate.h"
#include "forge/eval_gate/generate.h"
#include "forge/eval_gate/policy.h"
#include "forge/eval_gate/prompt_format.h"
#include "forge/eval_gate/suite.h"
#include "forge/eval_gate/tasks.h"
#include "forge/eval_gate/verdict.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/device_runtime.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/spec.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
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
  // Task suites
  std::string suites, tier;
  int batch = 8;
  bool reevaluate_baseline = false;
  std::string device = "auto";
};

constexpr const char* kUsage =
    "usage: forge-gate evaluate --checkpoint DIR --dataset DATASET_DIR --baseline DIR|release|none\n"
    "                           --policy gate.ini --out RUN/gate/ [--max-sequences N] [--threads N]\n"
    "                           [--suites DIR] [--tier TIER] [--batch N] [--reevaluate-baseline]\n"
    "                           [--no-promote] [--device auto|cpu|cuda]\n"
    "       forge-gate generate --checkpoint DIR [--dataset DATASET_DIR]\n"
    "                           (--prompt TEXT ... | --prompts FILE) [--chat] [--template PATH]\n"
    "                           [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                           [--samples N] [--batch N] [--threads N] [--out FILE.jsonl] [--ids]\n"
    "                           [--device auto|cpu|cuda]\n";

[[noreturn]] void help(const po::options_description& desc, int code) {
  std::cout << kUsage << desc;
  std::exit(code);
}

po::variables_map parse_options(const po::options_description& desc, int argc, char** argv) {
  po::variables_map vm;
  po::store(po::command_line_parser(argc - 1, argv + 1).options(desc).run(), vm);
  if (vm.count("help")) help(desc, 0);
  po::notify(vm);
  return vm;
}

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
      "suites", po::value(&a.suites), "directory of the task suites (default: the policy's [suites] dir)")(
      "tier", po::value(&a.tier), "the candidate's quota tier: adds the policy's suites.required.TIER")(
      "batch", po::value(&a.batch), "sequences generated at once per rank (task suites)")(
      "reevaluate-baseline", po::bool_switch(&a.reevaluate_baseline),
      "evaluate the baseline's suites again instead of reusing its recorded results")(
      "no-promote", po::bool_switch(&no_promote), "judge only; never promote")(
      "device", po::value(&a.device), "where the models compute: auto (a GPU where one is), cpu or cuda");
  parse_options(desc, argc, argv);
  a.promote = !no_promote;
  if (a.batch < 1) forge::fail(ExitCode::kUsage, "--batch {}: give at least 1", a.batch);
  return a;
}

// --device, as run.device: the backend this rank's models compute on (a GPU's stays alive for the process).
forge::trainer::Backend& device_backend(const std::string& device, forge::comm::Comm& comm) {
  static std::unique_ptr<forge::trainer::Backend> owned;
  using forge::trainer::Device;
  if (device != "auto" && device != "cpu" && device != "cuda")
    forge::fail(ExitCode::kUsage, "--device {}: give auto, cpu or cuda", device);
  const Device d = device == "cuda" ? Device::kCuda : device == "cpu" ? Device::kCpu : Device::kAuto;
  std::string description;
  forge::trainer::Backend& backend = forge::trainer::open_backend(d, comm.rank(), owned, &description);
  if (comm.rank() == 0 && description != "cpu") spdlog::info("forge-gate: models on {}", description);
  return backend;
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
                                            forge::comm::Comm& comm, bool& reused) {
  const auto c = forge::ckpt::Checkpoint::open(dir);
  const Json& verdict =
      c.manifest().promotion.is_object() ? c.manifest().promotion.value("verdict", Json()) : Json();
  // Verdicts from before seq_len was recorded read the model's own.
  const int own_seq_len = forge::trainer::model_spec_from_json(c.manifest().meta.model_config, dir).seq_len;
  reused = verdict.is_object() && verdict.value("dataset_version", "") == dataset_version &&
           verdict.value("seq_len", own_seq_len) == (eval.seq_len > 0 ? eval.seq_len : own_seq_len) &&
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

// The suites the policy asks of this candidate, loaded (every error before anything is evaluated), with
// the policy's checks matched to their metrics.
std::vector<forge::gate::Suite> load_suites(const forge::gate::GatePolicy& policy, const Args& a,
                                            const std::string& objective) {
  std::vector<forge::gate::Suite> suites;
  const std::string dir = a.suites.empty() ? policy.suites.dir : a.suites;
  for (const auto& name : policy.suites.suites_for(objective, a.tier)) {
    suites.push_back(forge::gate::load_suite(dir + "/" + name));
    forge::gate::check_suite_policy(policy.suites, name, forge::gate::suite_type_name(suites.back().type),
                                    forge::gate::suite_metrics(suites.back()));
  }
  return suites;
}

using SuiteResults = std::map<std::string, forge::gate::SuiteResult>;

SuiteResults run_suites(const std::vector<forge::gate::Suite>& suites, const std::string& checkpoint,
                        const forge::gate::PromptFormat& format, const Args& a, forge::comm::Comm& comm) {
  SuiteResults out;
  if (suites.empty()) return out;  // no model to load
  const auto model = forge::gate::load_for_generation(checkpoint, a.batch, comm, *a.eval.backend);
  forge::gate::SuiteRunOptions options;
  options.batch = a.batch;
  if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') options.scratch_parent = tmp;
  for (const auto& suite : suites)
    out[suite.name] = forge::gate::run_suite(suite, *model, format, options, comm);
  return out;
}

// The baseline's suite results: those its own gate recorded, when of the same suite version (another
// version is refused: its scores answer other questions), else measured now.
SuiteResults baseline_suites(const std::vector<forge::gate::Suite>& suites, const std::string& dir,
                             const forge::gate::PromptFormat& format, const Args& a, forge::comm::Comm& comm,
                             std::vector<std::string>& reused) {
  const auto c = forge::ckpt::Checkpoint::open(dir);
  const Json recorded =
      c.manifest().promotion.is_object()
          ? c.manifest().promotion.value("verdict", Json::object()).value("suites", Json::object())
          : Json::object();
  SuiteResults out;
  std::vector<forge::gate::Suite> missing;
  for (const auto& suite : suites) {
    if (a.reevaluate_baseline || !recorded.contains(suite.name)) {
      missing.push_back(suite);
      continue;
    }
    const auto result = forge::gate::SuiteResult::from_json(recorded.at(suite.name));
    if (result.version != suite.version)
      forge::fail(
          ExitCode::kData,
          "suite {} is version {} here but the baseline {} was gated on version {}: the two cannot be "
          "compared; restore that version of the suite, or measure the baseline on this one with "
          "--reevaluate-baseline",
          suite.name, suite.version, dir, result.version);
    out[suite.name] = result;
    reused.push_back(suite.name);
  }
  for (auto& [name, r] : run_suites(missing, dir, format, a, comm)) out[name] = std::move(r);
  return out;
}

int evaluate(int argc, char** argv, forge::comm::Comm& comm) {
  Args a = parse(argc, argv);
  a.eval.backend = &device_backend(a.device, comm);
  const forge::gate::GatePolicy policy = forge::gate::load_policy(a.policy);
  // A reinforcement-learning candidate is measured on a chat dataset it did not train on (its prompt set
  // given: the one it speaks), and so is its baseline.
  const std::string given = a.dataset;
  const forge::gate::MeasuredDataset measured = forge::gate::measured_dataset(a.checkpoint, a.dataset);
  a.dataset = measured.dir;
  const bool own = measured.trained_on;
  if (a.dataset != given && comm.rank() == 0)
    spdlog::info("{} is a prompt set: the loss is measured on {}, the chat dataset the policy speaks", given,
                 a.dataset);
  const forge::data::Manifest dataset = forge::data::load_manifest(a.dataset);
  for (const auto& d : policy.required_domains)
    if (dataset.tokens("valid", d) == 0)
      forge::fail(ExitCode::kData, "required domain '{}' has no validation data in {} (domains: {})", d,
                  a.dataset, fmt::format("{}", fmt::join(dataset.domains, ", ")));

  const forge::gate::EvalOptions eval = forge::gate::as_trained(a.checkpoint, dataset.format, a.eval);
  const std::vector<forge::gate::Suite> suites = load_suites(policy, a, eval.objective);
  const auto baseline_dir = resolve_baseline(a);
  // What would refuse either model (another tokenizer than the dataset's, an imported model's included),
  // said before anything is evaluated.
  forge::gate::check_evaluation(a.checkpoint, a.dataset, eval, own);
  if (baseline_dir) forge::gate::check_evaluation(*baseline_dir, a.dataset, eval, /*own_dataset=*/false);
  // The suites' prompts: the dataset's tokenizer, and the candidate's chat template (its own or its
  // lineage's, an imported model's) when the dataset's chat data were rendered with it or it has none.
  std::optional<forge::gate::PromptFormat> format;
  if (!suites.empty()) format = forge::gate::PromptFormat::of_model(a.checkpoint, a.dataset);
  // A chat suite's turns and stops, or why they cannot be rendered as the model was trained, now.
  if (format && std::any_of(suites.begin(), suites.end(), [](const auto& s) { return s.chat; }) &&
      format->can_chat())
    format->stops(true);
  const auto candidate = forge::gate::evaluate_checkpoint(a.checkpoint, a.dataset, eval, comm, own);
  SuiteResults candidate_suites;
  if (format) candidate_suites = run_suites(suites, a.checkpoint, *format, a, comm);
  std::optional<forge::gate::DomainResults> baseline;
  SuiteResults baseline_suite_results;
  bool reused = false;
  std::vector<std::string> reused_suites;
  if (baseline_dir) {
    baseline = baseline_results(*baseline_dir, dataset.version, a, eval, comm, reused);
    if (format)
      baseline_suite_results = baseline_suites(suites, *baseline_dir, *format, a, comm, reused_suites);
  }
  auto judgement = forge::gate::judge(policy, candidate, baseline ? &*baseline : nullptr);
  std::vector<std::string> required;
  for (const auto& s : suites) required.push_back(s.name);
  forge::gate::judge_suites(policy.suites, required, candidate_suites,
                            baseline_dir ? &baseline_suite_results : nullptr, judgement);
  if (comm.rank() != 0) return judgement.pass ? 0 : 1;

  Json verdict = {{"pass", judgement.pass},
                  {"candidate", describe(a.checkpoint)},
                  {"baseline", baseline_dir ? describe(*baseline_dir) : Json()},
                  {"baseline_results_reused", reused},
                  {"dataset", std::filesystem::absolute(a.dataset).lexically_normal().string()},
                  {"dataset_version", dataset.version},
                  {"policy", a.policy},
                  {"max_sequences", a.eval.max_sequences},
                  {"seq_len", eval.seq_len},
                  {"document_mask", eval.document_mask},
                  {"replies_only", eval.replies_only},
                  {"scoring", scoring(eval)},
                  {"tier", a.tier},
                  {"domains", Json::object()},
                  {"suites", Json::object()},
                  {"checks", Json::array()},
                  {"promoted_to", nullptr}};
  if (a.dataset != given)
    verdict["prompt_set"] = std::filesystem::absolute(given).lexically_normal().string();
  if (format)
    verdict["prompt_format"] = {{"tokenizer_sha256", format->tokenizer->sha256()},
                                {"chat", format->chat_name()}};
  for (const auto& [domain, s] : candidate) verdict["domains"][domain] = s.to_json();
  if (baseline) {
    verdict["baseline_domains"] = Json::object();
    for (const auto& [domain, s] : *baseline) verdict["baseline_domains"][domain] = s.to_json();
  }
  const double confidence = policy.suites.confidence;
  for (const auto& [name, r] : candidate_suites) verdict["suites"][name] = r.to_json(confidence);
  if (!baseline_suite_results.empty()) {
    verdict["baseline_suites"] = Json::object();
    for (const auto& [name, r] : baseline_suite_results)
      verdict["baseline_suites"][name] = r.to_json(confidence);
    verdict["baseline_suites_reused"] = reused_suites;
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

// One prompt of forge-gate generate: a text, or (--chat) a conversation the assistant answers next.
struct GeneratePrompt {
  std::string text;
  std::vector<forge::data::ChatMessage> messages;  // from a "messages" line; else the text is a user turn
  Json messages_json;                              // as given, for the output
};

// --prompts FILE: JSONL, {"prompt": TEXT} or (with --chat) {"messages": [{"role", "content"}, ...]}.
std::vector<GeneratePrompt> read_prompts(const std::string& file, bool chat) {
  std::ifstream in(file);
  if (!in) forge::fail(ExitCode::kUsage, "--prompts {}: cannot read it", file);
  std::vector<GeneratePrompt> out;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Json j = Json::parse(line, nullptr, false);
    GeneratePrompt p;
    if (j.is_object() && j.contains("messages")) {
      if (!chat)
        forge::fail(ExitCode::kUsage, "{}:{}: a conversation (\"messages\") needs --chat", file, line_no);
      forge::data::ChatRecord record;
      if (const std::string why = forge::data::parse_chat_line(line, record); !why.empty())
        forge::fail(ExitCode::kData, "{}:{}: {}", file, line_no, why);
      if (record.messages.empty()) forge::fail(ExitCode::kData, "{}:{}: no messages", file, line_no);
      p.messages = std::move(record.messages);
      p.messages_json = j["messages"];
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else {
      forge::fail(ExitCode::kData, "{}:{}: not a JSON object with a string \"prompt\"{}", file, line_no,
                  chat ? " or a \"messages\" list" : "");
    }
    out.push_back(std::move(p));
  }
  return out;
}

// forge-gate generate: completions of prompts from a checkpoint, data parallel over the ranks.
int generate(int argc, char** argv, forge::comm::Comm& comm) {
  std::string checkpoint, dataset, prompts_file, out, chat_template;
  std::vector<std::string> prompt_texts;
  bool chat = false, ids = false;
  int samples = 1, batch = 8, threads = 0;
  std::string device = "auto";
  forge::gate::Sampling s;
  po::options_description desc("forge-gate generate");
  desc.add_options()("help,h", "this help")("checkpoint", po::value(&checkpoint)->required(),
                                            "checkpoint directory (any layout)")(
      "dataset", po::value(&dataset),
      "the dataset whose tokenizer to use (default: the checkpoint's own, an imported model's)")(
      "prompt", po::value(&prompt_texts), "a prompt (repeatable)")(
      "prompts", po::value(&prompts_file),
      "JSONL file, one {\"prompt\": ...} (or with --chat {\"messages\": [...]}) per line")(
      "chat", po::bool_switch(&chat),
      "each prompt is a user turn in the model's chat template (its own, else forge's); the reply ends at "
      "the end of its turn")("template", po::value(&chat_template),
                             "chat template to render with instead (a tokenizer_config.json or a model "
                             "directory holding one); implies --chat")(
      "max-new-tokens", po::value(&s.max_new_tokens), "tokens per completion at most (default 64)")(
      "temperature", po::value(&s.temperature), "0 (default): greedy")(
      "top-k", po::value(&s.top_k), "sample among the k most likely tokens (0: all)")(
      "top-p", po::value(&s.top_p), "then among the most likely whose mass reaches p (1: all)")(
      "seed", po::value(&s.seed), "seed of the draws (default 1)")("samples", po::value(&samples),
                                                                   "completions per prompt (default 1)")(
      "batch", po::value(&batch), "sequences in flight per rank (default 8)")(
      "threads", po::value(&threads), "threads per rank (0 = SLURM_CPUS_PER_TASK or all cores)")(
      "out", po::value(&out), "JSONL output (default: standard output)")(
      "ids", po::bool_switch(&ids), "each line also has prompt_ids and completion_ids")(
      "device", po::value(&device), "where the model computes: auto (a GPU where one is), cpu or cuda");
  parse_options(desc, argc, argv);
  if (!chat_template.empty()) chat = true;
  if (s.max_new_tokens < 1 || samples < 1 || batch < 1 || s.temperature < 0 || s.top_k < 0 ||
      !(s.top_p > 0 && s.top_p <= 1))
    forge::fail(
        ExitCode::kUsage,
        "forge-gate generate: --max-new-tokens, --samples and --batch must be >= 1, --temperature and "
        "--top-k >= 0, --top-p in (0, 1]");
  std::vector<GeneratePrompt> prompts;
  for (auto& text : prompt_texts) prompts.push_back({std::move(text), {}, Json()});
  if (!prompts_file.empty())
    for (auto& p : read_prompts(prompts_file, chat)) prompts.push_back(std::move(p));
  if (prompts.empty())
    forge::fail(ExitCode::kUsage, "forge-gate generate: give --prompt TEXT or --prompts FILE");
  forge::trainer::use_threads(forge::trainer::resolve_threads(threads));
  const auto format = forge::gate::PromptFormat::of_model(checkpoint, dataset, chat_template);
  if (chat && !format.can_chat())
    forge::fail(
        ExitCode::kUsage,
        "--chat: the tokenizer {} has no chat markers and {} no chat template (tokenizer_config.json): "
        "give one with --template",
        format.tokenizer_path, checkpoint);
  const auto model = forge::gate::load_for_generation(checkpoint, batch, comm, device_backend(device, comm));
  if (format.tokenizer->vocab_size() > uint32_t(model->config().vocab))
    forge::fail(ExitCode::kUsage, "the tokenizer {} has {} tokens but the model's vocabulary is {}",
                format.tokenizer_path, format.tokenizer->vocab_size(), model->config().vocab);
  const forge::gate::Stops stops = format.stops(chat);
  format.set_stops(stops, s);
  std::vector<std::vector<int32_t>> prompt_ids;
  for (const auto& p : prompts) {
    if (!chat) {
      prompt_ids.push_back(format.text_prompt(p.text));
    } else if (!p.messages.empty()) {
      prompt_ids.push_back(format.chat_prompt(p.messages));
    } else {
      const forge::data::ChatMessage user{forge::data::ChatRole::kUser, p.text};
      prompt_ids.push_back(format.chat_prompt(std::span(&user, 1)));
    }
  }
  // Request i = prompt i / samples, sample i % samples; rank r generates i = r, r + size, ...
  const size_t n = prompts.size() * size_t(samples), width = size_t(s.max_new_tokens) + 3;
  std::vector<forge::gate::Request> requests;
  std::vector<size_t> mine;
  for (size_t i = size_t(comm.rank()); i < n; i += size_t(comm.size())) {
    requests.push_back({prompt_ids[i / size_t(samples)], uint64_t(i)});
    mine.push_back(i);
  }
  forge::gate::Generator generator(*model, batch);
  const auto generated = generator.run(requests, s);
  // Every completion to rank 0: per request its length, whether it stopped, its stop token, its tokens.
  std::vector<double> all(n * width, 0.0);
  for (size_t j = 0; j < mine.size(); ++j) {
    double* row = all.data() + mine[j] * width;
    row[0] = double(generated[j].tokens.size());
    row[1] = generated[j].stopped ? 1 : 0;
    row[2] = generated[j].stop_token;
    for (size_t t = 0; t < generated[j].tokens.size(); ++t) row[3 + t] = generated[j].tokens[t];
  }
  comm.all_reduce(all.data(), all.size(), forge::comm::CommType::kF64, forge::comm::ReduceOp::kSum)->wait();
  std::vector<double> totals = {double(generator.stats().new_tokens), generator.stats().seconds};
  comm.all_reduce(totals.data(), 1, forge::comm::CommType::kF64, forge::comm::ReduceOp::kSum)->wait();
  if (comm.rank() != 0) return 0;
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    const double* row = all.data() + i * width;
    forge::gate::Generation g;
    g.tokens.resize(static_cast<size_t>(row[0]));
    for (size_t t = 0; t < g.tokens.size(); ++t) g.tokens[t] = int32_t(row[3 + t]);
    g.stopped = row[1] > 0;
    g.stop_token = int32_t(row[2]);
    const GeneratePrompt& p = prompts[i / size_t(samples)];
    Json line = Json::object();
    if (p.messages.empty())
      line["prompt"] = p.text;
    else
      line["messages"] = p.messages_json;
    line["sample"] = i % size_t(samples);
    line["completion"] = format.completion(g.tokens, stops);
    line["tokens"] = g.tokens.size();
    line["stopped"] = g.stopped;
    if (g.stopped) line["stop"] = format.stop_text(g, stops);
    if (ids) {
      line["prompt_ids"] = prompt_ids[i / size_t(samples)];
      line["completion_ids"] = g.tokens;
    }
    text += line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  }
  if (out.empty())
    std::cout << text;
  else
    forge::write_file_atomic(out, text);
  // Rank 0's rate stands for every rank's (they generate alike).
  std::cerr << fmt::format(
      "forge-gate generate: {} completions, {} new tokens on {} rank(s); {:.1f} tokens/s per rank (batch {}; "
      "tokenizer {}{})\n",
      n, int64_t(totals[0]), comm.size(), generator.stats().tokens_per_second(), batch, format.tokenizer_path,
      chat ? "; chat " + format.chat_name() : std::string());
  return 0;
}

int run(int argc, char** argv, forge::comm::Comm& comm) {
  const std::string command = argc < 2 ? "" : argv[1];
  if (command == "evaluate") return evaluate(argc, argv, comm);
  if (command == "generate") return generate(argc, argv, comm);
  if (command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  }
  forge::fail(ExitCode::kUsage, "{}\n{}",
              command.empty() ? "no command" : "unknown command '" + command + "'", kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  // The same start-up and communicator as forge-train (forge/comm/bootstrap.h).
  forge::comm::Bootstrap boot = forge::comm::bootstrap();
  forge::init_logging(boot.rank, boot.size, "warn");
  const int rc = forge::run_cli("forge-gate", [&] { return run(argc, argv, *boot.world); });
  // An error on one rank would leave the others waiting in a collective: end them all.
  if (rc != 0 && rc != 1 && boot.size > 1) boot.world->abort(rc);
  return rc;
}
