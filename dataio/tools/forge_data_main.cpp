// forge-data: prepare, verify, inspect and compare token datasets (docs/DATA.md).
#include "forge/common/config.h"
#include "forge/common/error.h"
#include "forge/dataio/cache.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/compare.h"
#include "forge/dataio/image_text.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/prompts.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "forge/dataio/verify.h"
#include "mpi_ranks.h"

#include <fmt/format.h>
#include <boost/program_options.hpp>

#include <malloc.h>

#include <filesystem>
#include <iostream>

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace forge;
using namespace forge::data;

namespace {

constexpr const char* kUsage = R"(usage: forge-data <command> [options]
commands:
  prepare --input PATH[=DOMAIN] ... --out DATASET_DIR [--tokenizer MODEL | --vocab N]
          [--eval-set FILE ...] [--valid-fraction F] [--shard-tokens N] [--config prepare.ini]
          [--format text|chat|preference|image-text] [--max-bad-lines F] [--max-tokens N]
          [--truncate drop|truncate] [--chat-template MODEL_DIR|tokenizer_config.json]
          [--section.key=value ...]
  prepare --format prompts --input FILE.jsonl[=DOMAIN] ... --out DIR [--eval-set FILE ...]
                                      a prompt set for RL (not tokenized): JSONL {"prompt", "answer" |
                                      "answers" | "tests", "entry_point"?, "id"?, "domain"?}
  verify  DATASET_DIR                 checksums, schema, loss masks and pairs; exit 65 naming what differs
  inspect DATASET_DIR [--docs N]      manifest summary and decoded sample documents (pairs, prompts)
  compare A B [--threshold T] [--json]  which settings changed, what each stage removed, and drift between
                                      two datasets; exit 1 when over the threshold
Run 'forge-data <command> --help' for a command's options.
)";

// One subcommand's command line: its options (plus -h/--help), positional arguments and, for prepare,
// the `--section.key=value` settings passed through to the config loader. Every command parses, checks
// required options and prints its help the same way.
class Command {
 public:
  explicit Command(const char* title) : desc_(title) { desc_.add_options()("help,h", "this help"); }
  po::options_description_easy_init options() { return desc_.add_options(); }
  Command& positional(const char* name, int count) {
    pos_.add(name, count);
    return *this;
  }
  // Unregistered `--key=value` arguments are collected here instead of being an error.
  Command& pass_through(std::vector<std::string>* rest) {
    rest_ = rest;
    return *this;
  }
  Command& help_tail(std::string text) {
    help_tail_ = std::move(text);
    return *this;
  }
  // False when --help was given: the help is printed and the command returns 0.
  bool parse(const std::vector<std::string>& args) {
    auto parser = po::command_line_parser(args).options(desc_).positional(pos_);
    if (rest_) parser.allow_unregistered();
    const auto parsed = parser.run();
    po::store(parsed, vm_);
    if (vm_.count("help")) {
      std::cout << desc_ << help_tail_;
      return false;
    }
    if (rest_) *rest_ = po::collect_unrecognized(parsed.options, po::exclude_positional);
    po::notify(vm_);
    return true;
  }
  bool given(const char* name) const { return vm_.count(name) > 0 && !vm_[name].defaulted(); }

 private:
  po::options_description desc_;
  po::positional_options_description pos_;
  po::variables_map vm_;
  std::vector<std::string>* rest_ = nullptr;
  std::string help_tail_;
};

int cmd_prepare(const std::vector<std::string>& args) {
  std::vector<std::string> inputs, eval_sets, overrides;
  PrepareOptions o;
  std::string config_path, format, truncate;
  double max_bad_lines = 0;
  int64_t max_tokens = 0;
  int64_t vocab = 8192, shard_tokens = static_cast<int64_t>(o.shard_tokens);
  Command c("forge-data prepare options");
  c.options()("input", po::value(&inputs)->required()->composing(),
              "file or directory to read, optionally with its domain: PATH=DOMAIN (repeatable)")(
      "out", po::value(&o.out)->required(), "dataset directory to create (must not exist or be empty)")(
      "tokenizer", po::value(&o.tokenizer_model),
      "use this tokenizer instead of training one: a SentencePiece model or a Hugging Face tokenizer.json "
      "(chat, preference: it must hold forge's chat markers, unless --chat-template)")(
      "vocab", po::value(&vocab), "vocabulary size of the trained tokenizer (default 8192)")(
      "eval-set", po::value(&eval_sets)->composing(),
      "evaluation text to decontaminate against (repeatable)")(
      "valid-fraction", po::value(&o.valid_fraction)->default_value(0.01),
      "held-out validation share per domain")("shard-tokens", po::value(&shard_tokens),
                                              "tokens per shard before a new one starts (default 64Mi)")(
      "config", po::value(&config_path), "prepare.ini with stage settings (configs/prepare.example.ini)")(
      "format", po::value(&format),
      "text (default); chat: every input is JSONL of {\"messages\": [{\"role\", \"content\"}, ...]}; "
      "preference: every input is JSONL of {\"prompt\", \"chosen\", \"rejected\"}; image-text: every input "
      "is JSONL of {\"image\": path or [paths], \"text\" (a caption) or \"messages\" (with one <image> per "
      "picture)}, paths relative to the JSONL file ([image] keys); prompts: a prompt set "
      "for RL, every input is JSONL of {\"prompt\", \"answer\" | \"answers\" | \"tests\", "
      "\"entry_point\"?, \"id\"?, \"domain\"?}, not tokenized (ingest.format)")(
      "max-bad-lines", po::value(&max_bad_lines),
      "chat, preference: fail (exit 65) above this fraction of malformed lines (default 0.001; "
      "ingest.max_bad_lines)")("max-tokens", po::value(&max_tokens),
                               "chat, preference: most tokens per conversation (per half of a pair), "
                               "end-of-sequence included (default 0 = no limit; chat.max_tokens)")(
      "truncate", po::value(&truncate),
      "chat, preference: a longer conversation is cut (truncate, the default) or left out (drop; the whole "
      "pair) (chat.truncate)")(
      "chat-template", po::value(&o.chat_template),
      "chat, preference: render with this model's own chat template instead of forge's: a "
      "tokenizer_config.json or the model directory holding one (e.g. one 'forge-ckpt import' wrote); needs "
      "--tokenizer (the model's tokenizer.json or tokenizer.model); the loss mask scores each assistant "
      "reply "
      "(preference: the final one) and the end-of-turn text the template writes after it; conversations the "
      "template cannot segment are dropped and counted (exit 65 before any work when it cannot render a "
      "probe conversation)");
  std::string stage_keys = "\nStage settings (INI keys, also as --section.key=value):\n";
  for (const auto& key : prepare_schema().keys()) stage_keys += "  " + key + "\n";
  if (!c.pass_through(&overrides).help_tail(stage_keys).parse(args)) return 0;
  // A prompt set is not tokenized, split or sharded: options about tokens are mistakes, said at once.
  if (format == "prompts")
    for (const char* token_option : {"tokenizer", "vocab", "chat-template", "max-tokens", "truncate",
                                     "shard-tokens", "valid-fraction", "max-bad-lines"})
      if (c.given(token_option))
        fail(ExitCode::kUsage,
             "--{} does not apply to --format prompts: a prompt set is not tokenized, split or sharded at "
             "prepare (a rollout renders each prompt in the policy's own chat format), and every bad line "
             "is an error",
             token_option);
  if (c.given("tokenizer") && c.given("vocab"))
    fail(ExitCode::kUsage, "--tokenizer and --vocab exclude each other (the model fixes the vocabulary)");
  if (vocab <= 0 || vocab > (1 << 24)) fail(ExitCode::kUsage, "--vocab {}: out of range", vocab);
  if (shard_tokens <= 0) fail(ExitCode::kUsage, "--shard-tokens {}: must be positive", shard_tokens);
  // The named options are the INI keys under a short name; put first, they win over the file and over a
  // --section.key given as well (the config loader keeps the first value).
  std::vector<std::string> named;
  if (c.given("format")) named.push_back("--ingest.format=" + format);
  if (c.given("max-bad-lines")) named.push_back(fmt::format("--ingest.max_bad_lines={}", max_bad_lines));
  if (c.given("max-tokens")) named.push_back(fmt::format("--chat.max_tokens={}", max_tokens));
  if (c.given("truncate")) named.push_back("--chat.truncate=" + truncate);
  overrides.insert(overrides.begin(), named.begin(), named.end());
  const Config config = load_config(prepare_schema(), config_path, overrides);
  apply_config(config, o);
  o.tokenizer.vocab = static_cast<uint32_t>(vocab);
  o.shard_tokens = static_cast<uint64_t>(shard_tokens);
  o.eval_sets = eval_sets;
  for (const auto& in : inputs) o.inputs.push_back(parse_input_spec(in));
  const auto ranks = launcher_ranks();
  if (!ranks) {
    const PrepareResult r = prepare_dataset(o);
    std::cout << r.summary << "wrote " << r.dataset_dir << " (version " << r.version << ")\n";
    return 0;
  }
  try {
    const PrepareResult r = prepare_dataset(o, *ranks);
    if (ranks->rank() == 0)
      std::cout << r.summary
                << fmt::format("wrote {} (version {}) on {} ranks\n", r.dataset_dir, r.version,
                               ranks->size());
    return 0;
  } catch (const Error& e) {
    std::cerr << fmt::format("forge-data prepare: rank {} of {}: {}\n", ranks->rank(), ranks->size(),
                             e.what())
              << std::flush;
    ranks->abort(static_cast<int>(e.code()));
  }
  return 0;  // not reached: abort() does not return
}

int cmd_verify(const std::vector<std::string>& args) {
  std::string dir;
  Command c("forge-data verify DATASET_DIR");
  c.options()("dataset", po::value(&dir)->required(), "dataset directory");
  if (!c.positional("dataset", 1).parse(args)) return 0;
  if (load_any_manifest(dir).format == kPromptsFormat) {
    const PromptSet set = load_prompt_set(dir);
    std::cout << fmt::format(
        "ok: {} prompts ({} with answers, {} with tests), {} domains, format prompts, "
        "version {}\n",
        set.prompts.size(), set.with_answers(), set.with_tests(), set.domains.size(), set.version);
    return 0;
  }
  const VerifyResult r = verify_dataset(dir);
  verify_chat_masks(dir);
  const Manifest m = load_manifest(dir);
  if (m.format == kImageTextFormat) verify_image_runs(dir);
  std::cout << fmt::format("ok: {} shards, {} documents, {} tokens, format {}, version {}\n", r.shards,
                           r.documents, r.tokens, m.format, m.version);
  return 0;
}

// inspect on a prompt set: its counts per domain and its first prompts with their references.
int inspect_prompts(const std::string& dir, int docs) {
  const PromptSet set = load_prompt_set(dir);
  std::cout << fmt::format("prompt set {}\nversion {}\nformat prompts (not tokenized)\n", dir, set.version);
  std::cout << fmt::format("{:<12} {:>8} {:>13} {:>11}\n", "domain", "prompts", "with answers", "with tests");
  for (const auto& d : set.domains) {
    uint64_t n = 0, answers = 0, tests = 0;
    for (const auto& p : set.prompts)
      if (p.domain == d) ++n, answers += !p.answers.empty(), tests += !p.tests.empty();
    std::cout << fmt::format("{:<12} {:>8} {:>13} {:>11}\n", d, n, answers, tests);
  }
  for (size_t i = 0; i < set.prompts.size() && i < static_cast<size_t>(std::max(docs, 0)); ++i) {
    const Prompt& p = set.prompts[i];
    std::string text = p.prompt.size() > 600 ? p.prompt.substr(0, 600) + " [...]" : p.prompt;
    std::cout << fmt::format("\n--- prompt {} (id {}, domain {})\n{}\n", i, p.id, p.domain, text);
    if (!p.answers.empty()) std::cout << "answers: " << Json(p.answers).dump() << "\n";
    if (!p.tests.empty())
      std::cout << fmt::format("tests ({} lines){}\n", std::count(p.tests.begin(), p.tests.end(), '\n') + 1,
                               p.entry_point.empty() ? "" : ", entry point " + p.entry_point);
  }
  return 0;
}

int cmd_inspect(const std::vector<std::string>& args) {
  std::string dir;
  int docs = 3;
  Command c("forge-data inspect DATASET_DIR");
  c.options()("dataset", po::value(&dir)->required(), "dataset directory")(
      "docs", po::value(&docs)->default_value(3), "sample documents to decode");
  if (!c.positional("dataset", 1).parse(args)) return 0;
  if (load_any_manifest(dir).format == kPromptsFormat) return inspect_prompts(dir, docs);
  const Manifest m = load_manifest(dir);
  std::cout << fmt::format(
      "dataset {}\nversion {}\nformat {}\ntokenizer {} (sha256 {}), vocab {}, tokens {}\n", dir, m.version,
      m.format, m.tokenizer_file, m.tokenizer_sha256, m.vocab_size, m.token_bytes == 2 ? "uint16" : "uint32");
  if (m.format != "text" && m.settings.contains("chat"))
    std::cout << fmt::format("chat template {} (sha256 {}); decoded documents show scored tokens in [[ ]]\n",
                             uses_model_template(m.settings)
                                 ? std::string("of the model (prepare --chat-template)")
                                 : m.settings["chat"]["template"].value("name", "?"),
                             m.settings["chat"].value("template_sha256", "?"));
  if (m.format == kImageTextFormat) {
    const Json& image = m.settings.at("image");
    std::cout << fmt::format(
        "pictures {}x{} ({}), {} token positions each (placeholder id {}), shown as "
        "<image xN>\n",
        image.at("size").get<int>(), image.at("size").get<int>(), image.at("fit").get<std::string>(),
        image.at("tokens").get<int>(), image.at("token_id").get<int>());
  }
  std::cout << fmt::format("{:<8} {:<12} {:>8} {:>12} {:>12}\n", "split", "domain", "shards", "documents",
                           "tokens");
  for (const std::string split : {"train", "valid"}) {
    for (const auto& d : m.domains) {
      uint64_t n = 0, documents = 0, tokens = 0;
      for (const auto* s : m.shards_of(split, d)) ++n, documents += s->documents, tokens += s->tokens;
      if (n) std::cout << fmt::format("{:<8} {:<12} {:>8} {:>12} {:>12}\n", split, d, n, documents, tokens);
    }
  }
  if (docs <= 0 || m.shards.empty()) return 0;
  const Tokenizer tok = Tokenizer::load((fs::path(dir) / m.tokenizer_file).string());
  const ShardData data = read_shard((fs::path(dir) / m.shards.front().file).string());
  // A preference dataset shows whole pairs: --docs N decodes the halves of the first N pairs.
  const bool pairs = m.format == "preference";
  if (pairs)
    std::cout << "documents 2k and 2k+1 are the chosen and the rejected half of pair k; each scores only its "
                 "final reply\n";
  const uint64_t shown = std::min<uint64_t>(pairs ? 2 * uint64_t(docs) : uint64_t(docs), data.documents());
  for (uint64_t i = 0; i < shown; ++i) {
    const uint64_t begin = data.doc_offsets[i], end = data.doc_offsets[i + 1];
    std::vector<int> ids(data.tokens.begin() + begin, data.tokens.begin() + end);
    if (!ids.empty() && ids.back() == m.eos_id) ids.pop_back();
    std::string text;
    if (data.loss_mask.empty()) {
      text = tok.decode(ids);
    } else {
      // Decode runs of equal mask value, so the scored spans (what the model learns to say) are visible.
      for (size_t a = 0; a < ids.size();) {
        size_t b = a;
        while (b < ids.size() && data.loss_mask[begin + b] == data.loss_mask[begin + a]) ++b;
        const std::string part = tok.decode(std::span<const int>(ids.data() + a, b - a));
        text += data.loss_mask[begin + a] ? "[[" + part + "]]" : part;
        a = b;
      }
    }
    if (m.format == kImageTextFormat) {
      // A picture's run of placeholders, one piece each, as one mark.
      const int n = m.settings["image"]["tokens"].get<int>();
      std::string run;
      for (int k = 0; k < n; ++k) run += kImagePlaceholder;
      const std::string mark = fmt::format("<image x{}>", n);
      for (size_t at = text.find(run); at != std::string::npos; at = text.find(run, at + mark.size()))
        text.replace(at, run.size(), mark);
    }
    if (text.size() > 600 && pairs) {
      // A half's point is its final reply, which is at the end: keep the tail (from a character start).
      size_t from = text.size() - 600;
      while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      text = "[...] " + text.substr(from);
    } else if (text.size() > 600) {
      text = text.substr(0, 600) + " [...]";
    }
    const std::string half =
        pairs ? fmt::format(", pair {} {}", i / 2, i % 2 == 0 ? "chosen" : "rejected") : std::string();
    std::cout << fmt::format("\n--- {} document {}{} ({} tokens, domain {}, license {})\n{}\n",
                             m.shards.front().file, i, half, ids.size(), m.domains.at(data.doc_domains[i]),
                             m.licenses.at(data.doc_licenses[i]), text);
  }
  return 0;
}

int cmd_compare(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  double threshold = 0.05;
  Command c("forge-data compare A B");
  c.options()("datasets", po::value(&dirs)->required(), "two dataset directories")(
      "threshold", po::value(&threshold)->default_value(0.05),
      "drift flag when the token JS divergence or the domain or language mix total variation exceeds this")(
      "json", "print the comparison as JSON");
  if (!c.positional("datasets", 2).parse(args)) return 0;
  if (dirs.size() != 2) fail(ExitCode::kUsage, "compare needs two dataset directories, got {}", dirs.size());
  const Json r = compare_datasets(dirs[0], dirs[1], threshold);
  if (c.given("json")) {
    std::cout << r.dump(2) << "\n";
  } else {
    std::cout << compare_summary(r);
  }
  return r["drift"].get<bool>() ? static_cast<int>(ExitCode::kFailure) : 0;
}

// forge-data cache stage|status|evict: the node-local shard cache (docs/DATA.md, "Node-local cache"), as
// an administrator pre-stages a dataset on a node or inspects and trims what jobs left there.
int cmd_cache(const std::vector<std::string>& args) {
  const std::string action = args.empty() ? "" : args[0];
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  std::string dir, dataset, split = "all", version;
  uint64_t max_bytes = 0, keep_bytes = 0;
  Command c("forge-data cache stage|status|evict options");
  c.options()("cache-dir", po::value(&dir)->required(), "the node-local cache directory (data.cache_dir)")(
      "dataset", po::value(&dataset), "stage: the dataset directory")(
      "split", po::value(&split)->default_value("all"), "stage: train, valid or all")(
      "max-bytes", po::value(&max_bytes)->default_value(0),
      "stage: bytes the cache may hold (data.cache_max_bytes; 0: leave 10% of the filesystem free)")(
      "keep-bytes", po::value(&keep_bytes)->default_value(0), "evict: bytes of entries to keep")(
      "version", po::value(&version), "evict: only entries of this dataset version")("json",
                                                                                     "status: as JSON");
  if (action != "stage" && action != "status" && action != "evict")
    fail(ExitCode::kUsage, "cache needs an action: stage, status or evict (got '{}'; see --help)", action);
  if (!c.positional("dataset", 1).parse(rest)) return 0;
  if (action == "stage") {
    if (dataset.empty()) fail(ExitCode::kUsage, "cache stage needs the dataset directory");
    if (split != "train" && split != "valid" && split != "all")
      fail(ExitCode::kUsage, "--split {}: must be train, valid or all", split);
    const Manifest m = load_manifest(dataset);
    std::vector<const ShardEntry*> entries;
    for (const ShardEntry& e : m.shards)
      if (split == "all" || e.split == split) entries.push_back(&e);
    ShardCache cache({dir, max_bytes}, m, dataset);
    const std::vector<std::string> dirs = cache.open(entries);
    // The reader verifies what it maps; so does the administrator's staging, hits included.
    for (size_t i = 0; i < entries.size(); ++i) {
      if (dirs[i] == dataset) continue;
      try {
        check_shard(dirs[i], m, *entries[i], true);
      } catch (const Error& bad) {
        cache.reject(*entries[i], bad.what());
      }
    }
    const CacheStats& st = cache.stats();
    std::cout << fmt::format(
        "{}: {} shards in {}/{}: {} staged ({} bytes, {:.2f} s), {} already there, {} not cached\n", dataset,
        entries.size(), dir, m.version, st.misses, st.bytes_staged, st.staging_s, st.hits, st.fallbacks);
    if (st.fallbacks > 0)
      fail(ExitCode::kIo, "{} of {} shards could not be cached in {} (the warning above says why)",
           st.fallbacks, entries.size(), dir);
    return 0;
  }
  if (!fs::is_directory(dir)) fail(ExitCode::kUsage, "cache directory {} does not exist", dir);
  if (action == "status") {
    const CacheListing l = list_cache(dir);
    if (c.given("json")) {
      Json j = {{"dir", dir}, {"partial_files", l.partial_files}, {"partial_bytes", l.partial_bytes}};
      j["entries"] = Json::array();
      for (const auto& e : l.entries)
        j["entries"].push_back({{"version", e.version},
                                {"file", e.file},
                                {"bytes", e.bytes},
                                {"idle_s", e.idle_s},
                                {"in_use", e.in_use}});
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    uint64_t bytes = 0, in_use = 0;
    for (const auto& e : l.entries) {
      bytes += e.bytes;
      in_use += e.in_use;
      std::cout << fmt::format("{:.12}  {:<40} {:>12} bytes  idle {:>8.0f} s{}\n", e.version, e.file, e.bytes,
                               e.idle_s, e.in_use ? "  in use" : "");
    }
    std::cout << fmt::format("{}: {} entries, {} bytes, {} in use; {} temporary files ({} bytes)\n", dir,
                             l.entries.size(), bytes, in_use, l.partial_files, l.partial_bytes);
    return 0;
  }
  const EvictResult r = evict_cache(dir, keep_bytes, version);
  std::cout << fmt::format(
      "{}: evicted {} entries ({} bytes); {} in use kept; {} stale temporary files removed\n", dir, r.evicted,
      r.evicted_bytes, r.kept_in_use, r.stale_partials);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // prepare allocates and frees one buffer per document and stage. glibc returns large blocks to the
  // kernel (mmap below its threshold, trimming above), so every stage faulted its memory in again, and a
  // page fault is a hypervisor exit on VMs like the ones we run on: keep freed memory in the heap instead.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 512 << 20);
  ::mallopt(M_TOP_PAD, 16 << 20);
  return run_cli("forge-data", [&]() -> int {
    if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
      std::cout << kUsage;
      return argc < 2 ? static_cast<int>(ExitCode::kUsage) : 0;
    }
    const std::string cmd = argv[1];
    const std::vector<std::string> args(argv + 2, argv + argc);
    using Run = int (*)(const std::vector<std::string>&);
    static constexpr std::pair<std::string_view, Run> kCommands[] = {{"prepare", cmd_prepare},
                                                                     {"verify", cmd_verify},
                                                                     {"inspect", cmd_inspect},
                                                                     {"compare", cmd_compare},
                                                                     {"cache", cmd_cache}};
    for (const auto& [name, run] : kCommands)
      if (cmd == name) return run(args);
    fail(ExitCode::kUsage, "unknown command '{}' (prepare, verify, inspect, compare, cache; see --help)",
         cmd);
  });
}
