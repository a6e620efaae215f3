// forge-ckpt import, and export --format hf: open weights in and out in the Hugging Face layout
// (docs/CHECKPOINTS.md, "Hugging Face layout").
#include "commands.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/image_text.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prompts.h"
#include "forge/dataio/tokenizer.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/hf.h"

#include <fmt/format.h>
#include <boost/program_options.hpp>

#include <filesystem>

namespace forge::ckpt::cli {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// The [model] (and a vision-language model's [vision]) section of a job spec that starts from `spec`
// (seq_len left to the job).
std::string model_section(const trainer::ModelSpec& spec) {
  std::string out = fmt::format("[model]\nfamily = {}\n", trainer::family_name(spec.family)), vision;
  const Json record = trainer::model_spec_json(spec);
  for (const auto& [key, value] : record.items()) {
    if (key == "seq_len" || key == "family") continue;
    // norm_eps is a float: its shortest decimal (1e-05), not the double it widens to.
    const std::string text = key == "norm_eps"          ? fmt::format("{}", spec.norm_eps)
                             : key == "vision.norm_eps" ? fmt::format("{}", spec.vision.norm_eps)
                             : value.is_string()        ? value.get<std::string>()
                                                        : value.dump();
    if (key.starts_with("vision."))
      vision += fmt::format("{} = {}\n", key.substr(7), text);
    else
      out += fmt::format("{} = {}\n", key, text);
  }
  return vision.empty() ? out : out + "[vision]\n" + vision;
}

// The tokenizer files a model trained here hands on: its SentencePiece model, and a tokenizer_config.json
// with forge's chat template and its special tokens. `given` (--tokenizer), else the training dataset's
// tokenizer (for a run on a prompt set, which has none, that of the chat dataset its policy speaks:
// rl.format_dataset), which must be the one the checkpoint records.
void add_tokenizer(const Checkpoint& c, const std::string& given, trainer::HfExportOptions& o) {
  const Json& extra = c.manifest().meta.extra;
  std::string path = given;
  if (path.empty()) {
    const Json spec = extra.value("spec", Json::object());
    std::string dataset = spec.value("data.dataset", "");
    std::error_code ec;
    if (fs::exists(fs::path(dataset) / "manifest.json", ec) &&
        data::load_any_manifest(dataset).format == data::kPromptsFormat)
      dataset = spec.value("rl.format_dataset", "");
    if (dataset.empty() || dataset == "synthetic" || !fs::exists(fs::path(dataset) / "manifest.json")) {
      fmt::print(stderr,
                 "forge-ckpt: warning: no tokenizer exported: the training dataset '{}' is not here (or, for "
                 "a prompt set, rl.format_dataset is empty); give --tokenizer FILE\n",
                 dataset);
      return;
    }
    path = (fs::path(dataset) / data::load_manifest(dataset).tokenizer_file).string();
  }
  const data::Tokenizer tok = data::Tokenizer::load(path);
  const std::string want = extra.value("tokenizer_sha256", "");
  if (!want.empty() && tok.sha256() != want)
    fail(ExitCode::kUsage, "{}: this tokenizer (sha256 {}) is not the one {} was trained with ({})", path,
         tok.sha256().substr(0, 12), c.dir(), want.substr(0, 12));
  const auto model = trainer::model_spec_from_json(c.manifest().meta.model_config, c.dir());
  const bool bpe = fs::path(path).extension() == ".json";
  o.files[bpe ? "tokenizer.json" : "tokenizer.model"] = read_file(path);
  const int eos = tok.eos_id();
  Json config = {{"model_max_length", model.max_positions},
                 {"add_bos_token", false},
                 {"add_eos_token", false},
                 {"chat_template", data::chat_template_jinja()}};
  if (!bpe) config["tokenizer_class"] = "LlamaTokenizer";  // transformers' SentencePiece tokenizer
  // A vision-language model's pictures sit at runs of the <image> token (LLaVA's image_token_index).
  if (model.vision.enabled()) {
    const auto image = tok.piece_id(data::kImagePlaceholder);
    if (!image)
      fail(ExitCode::kUsage, "{}: this tokenizer has no {} token for the model's pictures", path,
           data::kImagePlaceholder);
    o.config_keys["image_token_index"] = *image;
  }
  if (eos >= 0) {
    config["eos_token"] = tok.piece(eos);
    o.config_keys["eos_token_id"] = eos;
    o.files["generation_config.json"] = Json{{"eos_token_id", eos}}.dump(2) + "\n";
  }
  o.files["tokenizer_config.json"] = config.dump(2) + "\n";
}

}  // namespace

int import_(const Args& args) {
  po::options_description desc("import options");
  std::string dir, out;
  desc.add_options()("dir", po::value(&dir)->required(), "Hugging Face model directory")(
      "out", po::value(&out)->required(), "checkpoint directory to write")(
      "force", "replace --out if it exists")("json", "JSON output");
  po::variables_map vm;
  if (!parse(args, desc, "dir", "import DIR --out CKPT [--force] [--json]", vm)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const trainer::HfImport r = trainer::import_hf(dir, out, vm.count("force") > 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (vm.count("json")) {
    fmt::print("{}\n", Json{{"checkpoint", fs::absolute(out).lexically_normal().string()},
                            {"model", trainer::model_spec_json(r.spec)},
                            {"origin", r.origin},
                            {"tensors", r.tensors},
                            {"bytes", r.bytes},
                            {"seconds", seconds}}
                           .dump(2));
    return 0;
  }
  fmt::print("imported {} ({}, {}, {} tensors, {:.1f} MB in {:.1f} s) into {}\nmodel {}\n", dir,
             r.architecture, r.dtype, r.tensors, r.bytes / 1e6, seconds, out,
             trainer::model_description(r.spec));
  for (const auto& [name, sha] : r.origin["files"].items())
    fmt::print("  {:<40} sha256 {}\n", name, sha.get<std::string>());
  fmt::print("a job spec that starts from it (ckpt.init_from = {}) needs:\n{}", out, model_section(r.spec));
  return 0;
}

int export_hf(const Checkpoint& c, const std::string& out, const po::variables_map& vm) {
  trainer::HfExportOptions o;
  o.dtype = vm["dtype"].as<std::string>();
  o.replace = vm.count("force") > 0;
  const double shard = vm["shard-size"].as<double>();
  if (!(shard >= 1)) fail(ExitCode::kUsage, "--shard-size {}: give a number of bytes >= 1", shard);
  o.shard_bytes = static_cast<uint64_t>(shard);
  const bool imported = c.manifest().meta.extra.contains("origin");
  if (!imported || vm.count("tokenizer"))
    add_tokenizer(c, vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : "", o);
  const trainer::HfExport r = trainer::export_hf(c, out, o);
  fmt::print("exported {} (step {}) to {} in the Hugging Face layout\n", c.dir(), c.manifest().meta.step,
             out);
  for (const auto& [name, sha] : r.files) fmt::print("  {:<40} sha256 {}\n", name, sha);
  return 0;
}

}  // namespace forge::ckpt::cli
