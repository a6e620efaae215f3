#include "forge/dataio/prompts.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/decontam.h"
#include "forge/dataio/document.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/prepare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>
#include <utility>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

constexpr const char* kHowToPrepare =
    "prepare one with `forge-data prepare --format prompts --input FILE.jsonl --out DIR` (lines "
    "{\"prompt\": \"...\", \"answer\": \"...\" | \"answers\": [...] | \"tests\": \"...\"})";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

bool valid_domain(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

bool python_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// A field that is absent or JSON null.
bool absent(const Json& rec, const char* key) {
  const auto it = rec.find(key);
  return it == rec.end() || it->is_null();
}

// One input line as a Prompt, or why it is not one ("" when it is). The prompt is taken as written; the
// caller normalizes it. `has_id`: the line names its id.
std::string parse_prompt_line(const std::string& line, const std::string& input_domain, Prompt& p,
                              bool& has_id) {
  p = Prompt{};
  has_id = false;
  size_t invalid = 0;
  repair_utf8(line, &invalid);
  if (invalid > 0) return fmt::format("{} bytes of invalid UTF-8 (the file must be UTF-8)", invalid);
  Json rec;
  try {
    rec = Json::parse(line);
  } catch (const Json::parse_error& e) {
    return fmt::format("not JSON (syntax error at byte {})", e.byte);
  }
  if (!rec.is_object()) return fmt::format("not a JSON object (a JSON {})", rec.type_name());
  const auto string_field = [&](const char* key, std::string& out) -> std::string {
    const Json& v = rec.at(key);
    if (!v.is_string()) return fmt::format("\"{}\" is a JSON {}, not a string", key, v.type_name());
    out = v.get<std::string>();
    return "";
  };
  if (absent(rec, "prompt")) return "no \"prompt\" (the user turn the rollout asks)";
  if (auto why = string_field("prompt", p.prompt); !why.empty()) return why;
  if (blank(p.prompt)) return "empty \"prompt\"";
  if (!absent(rec, "id")) {
    if (auto why = string_field("id", p.id); !why.empty()) return why;
    if (blank(p.id) || p.id.find_first_of("\r\n") != std::string::npos)
      return "\"id\" must be a non-empty string on one line";
    has_id = true;
  }
  const bool one = !absent(rec, "answer"), many = !absent(rec, "answers");
  if (one && many) return "both \"answer\" and \"answers\"; give one";
  if (one) {
    const Json& a = rec["answer"];
    if (!a.is_string())
      return fmt::format("\"answer\" is a JSON {}, not a string (quote it: \"answer\": \"{}\")",
                         a.type_name(), a.is_primitive() ? a.dump() : std::string("..."));
    if (blank(a.get_ref<const std::string&>())) return "empty \"answer\"";
    p.answers.push_back(a.get<std::string>());
  }
  if (many) {
    const Json& list = rec["answers"];
    if (!list.is_array())
      return fmt::format("\"answers\" is a JSON {}, not a list of strings", list.type_name());
    for (size_t k = 0; k < list.size(); ++k) {
      if (!list[k].is_string())
        return fmt::format("\"answers\"[{}] is a JSON {}, not a string", k, list[k].type_name());
      if (blank(list[k].get_ref<const std::string&>())) return fmt::format("\"answers\"[{}] is empty", k);
      p.answers.push_back(list[k].get<std::string>());
    }
  }
  if (!absent(rec, "tests")) {
    if (auto why = string_field("tests", p.tests); !why.empty()) return why;
    if (blank(p.tests)) return "empty \"tests\" (Python code asserting on the function)";
  }
  if (!absent(rec, "entry_point")) {
    if (auto why = string_field("entry_point", p.entry_point); !why.empty()) return why;
    if (!python_identifier(p.entry_point))
      return fmt::format("\"entry_point\" '{}' is not a Python function name", p.entry_point);
    if (p.tests.empty()) return "\"entry_point\" without \"tests\" (the tests call it)";
  }
  if (p.answers.empty() && p.tests.empty())
    return "no \"answer\", \"answers\" or \"tests\": the reward would have nothing to check the reply "
           "against";
  if (!input_domain.empty()) {
    p.domain = input_domain;  // --input PATH=DOMAIN wins, as for every format
  } else if (!absent(rec, "domain")) {
    if (auto why = string_field("domain", p.domain); !why.empty()) return why;
    if (!valid_domain(p.domain))
      return fmt::format("domain '{}' must be 1-64 characters of [A-Za-z0-9_-]", p.domain);
  } else {
    p.domain = kDefaultPromptDomain;
  }
  return "";
}

// The JSONL files of the inputs, in input order; a directory's *.jsonl files recursively, sorted.
std::vector<std::pair<std::string, const InputSpec*>> prompt_files(const std::vector<InputSpec>& inputs) {
  std::vector<std::pair<std::string, const InputSpec*>> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    const auto status = fs::status(in.path, ec);
    if (ec || !fs::exists(status)) fail(ExitCode::kUsage, "--input {}: no such file or directory", in.path);
    if (!fs::is_directory(status)) {
      files.emplace_back(in.path, &in);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(in.path, ec)) {
      std::string ext = e.path().extension().string();
      for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (e.is_regular_file(ec) && ext == ".jsonl") found.push_back(e.path().string());
    }
    if (ec) fail(ExitCode::kIo, "--input {}: cannot list directory: {}", in.path, ec.message());
    std::sort(found.begin(), found.end());
    for (auto& f : found) files.emplace_back(std::move(f), &in);
  }
  return files;
}

// A prompt read, with where it came from.
struct Read {
  Prompt p;
  std::string where;  // FILE:LINE
};

Json prompt_json(const Prompt& p) {
  return {{"id", p.id},           {"prompt", p.prompt}, {"domain", p.domain},
          {"answers", p.answers}, {"tests", p.tests},   {"entry_point", p.entry_point}};
}

// Per domain: what was read, dropped and kept.
struct DomainCounts {
  uint64_t read = 0, duplicates = 0, contaminated = 0, kept = 0, with_answers = 0, with_tests = 0;
};

std::string summary_text(const Json& q) {
  const Json& s = q.at("summary");
  std::string out =
      fmt::format("prompt set {}  version {}\n", q.value("dataset", ""), s.value("version", ""));
  out += fmt::format(
      "prompts: {} read from {} lines -> {} kept; removed: exact duplicates {} ({} with other answers or "
      "tests), contaminated {}\n",
      s.at("prompts_read").get<uint64_t>(), q["stages"]["ingest"].at("lines").get<uint64_t>(),
      s.at("prompts_kept").get<uint64_t>(), s.at("duplicates").get<uint64_t>(),
      q["stages"]["exact_dedup"].at("duplicates_with_other_references").get<uint64_t>(),
      s.at("contaminated").get<uint64_t>());
  for (const auto& e : q["stages"]["decontam"].at("examples"))
    out += fmt::format("  contaminated: {} (id {}) {} \"{}\"\n", e.at("removed").get<std::string>(),
                       e.at("id").get<std::string>(),
                       e.at("rule") == "ngram" ? "shares the n-gram" : "is the eval text",
                       e.at("ngram").get<std::string>());
  out += fmt::format(
      "kept: {} with answers, {} with tests; {} markers neutralized; not tokenized (rendered "
      "in the policy's chat format at rollout)\n",
      s.at("with_answers").get<uint64_t>(), s.at("with_tests").get<uint64_t>(),
      q["stages"]["ingest"].at("markers_neutralized").get<uint64_t>());
  out += "domains:\n";
  for (const auto& [name, d] : s.at("domains").items())
    out += fmt::format(
        "  {:<12} {:>8} kept of {:>8} read  ({} with answers, {} with tests; {} duplicates, "
        "{} contaminated)\n",
        name, d.at("kept").get<uint64_t>(), d.at("read").get<uint64_t>(),
        d.at("with_answers").get<uint64_t>(), d.at("with_tests").get<uint64_t>(),
        d.at("duplicates").get<uint64_t>(), d.at("contaminated").get<uint64_t>());
  return out;
}

}  // namespace

size_t PromptSet::with_answers() const {
  return static_cast<size_t>(
      std::count_if(prompts.begin(), prompts.end(), [](const Prompt& p) { return !p.answers.empty(); }));
}

size_t PromptSet::with_tests() const {
  return static_cast<size_t>(
      std::count_if(prompts.begin(), prompts.end(), [](const Prompt& p) { return !p.tests.empty(); }));
}

std::string prompt_json_line(const Prompt& p) {
  return prompt_json(p).dump();
}

PrepareResult prepare_prompt_set(const PrepareOptions& o) {
  const double t_start = now_s();
  if (!o.tokenizer_model.empty() || !o.chat_template.empty())
    fail(
        ExitCode::kUsage,
        "--format prompts: {} {}: a prompt set is not tokenized at prepare (a rollout renders each prompt in "
        "the policy's own chat format, so one set serves any model); leave it out",
        o.tokenizer_model.empty() ? "--chat-template" : "--tokenizer",
        o.tokenizer_model.empty() ? o.chat_template : o.tokenizer_model);

  // Ingest: every non-blank line is a prompt, or the run stops naming it (nothing is written yet).
  double t = now_s();
  std::vector<Read> read;
  uint64_t files = 0, lines = 0, blank_lines = 0, neutralized = 0;
  for (const auto& [path, in] : prompt_files(o.inputs)) {
    const std::string data = read_file(path);
    ++files;
    size_t start = 0;
    for (int line_no = 1; start < data.size(); ++line_no) {
      size_t nl = data.find('\n', start);
      if (nl == std::string::npos) nl = data.size();
      const std::string line = data.substr(start, nl - start);
      start = nl + 1;
      ++lines;
      if (blank(line)) {
        ++blank_lines;
        continue;
      }
      const std::string where = fmt::format("{}:{}", path, line_no);
      Read r;
      bool has_id = false;
      if (const std::string why = parse_prompt_line(line, in->domain, r.p, has_id); !why.empty())
        fail(ExitCode::kData, "{}: {}; fix the line; nothing written", where, why);
      r.p.prompt = normalize_text(r.p.prompt);
      neutralized += neutralize_markers(r.p.prompt);
      if (blank(r.p.prompt))
        fail(ExitCode::kData, "{}: empty \"prompt\" once normalized; nothing written", where);
      if (!has_id) r.p.id = "p-" + xxh3_64_hex(r.p.prompt);
      r.where = where;
      read.push_back(std::move(r));
    }
  }
  if (read.empty())
    fail(ExitCode::kData, "the inputs hold no prompts ({} files, {} lines, {} blank); nothing written", files,
         lines, blank_lines);
  std::map<std::string, DomainCounts> by_domain;
  for (const auto& r : read) ++by_domain[r.p.domain].read;
  const Json ingest_report = {{"files", files},
                              {"lines", lines},
                              {"blank_lines", blank_lines},
                              {"prompts_read", read.size()},
                              {"markers_neutralized", neutralized},
                              {"seconds", now_s() - t}};

  // Exact dedup on the normalized prompt, first copy kept; then ids must be unique among what is left.
  t = now_s();
  std::vector<Read> distinct;
  std::map<std::pair<uint64_t, uint64_t>, size_t> first;  // xxh3-128 -> index in distinct
  uint64_t duplicates = 0, other_references = 0;
  Json dedup_examples = Json::array();
  for (auto& r : read) {
    const Hash128 h = xxh3_128(r.p.prompt);
    const auto [it, fresh] = first.emplace(std::make_pair(h.high, h.low), distinct.size());
    if (fresh) {
      distinct.push_back(std::move(r));
      continue;
    }
    const Read& kept = distinct[it->second];
    const bool differs =
        kept.p.answers != r.p.answers || kept.p.tests != r.p.tests || kept.p.entry_point != r.p.entry_point;
    ++duplicates;
    other_references += differs;
    ++by_domain[r.p.domain].duplicates;
    if (dedup_examples.size() < 5)
      dedup_examples.push_back({{"removed", r.where}, {"kept", kept.where}, {"other_references", differs}});
  }
  {
    std::map<std::string, const Read*> ids;
    for (const auto& r : distinct) {
      const auto [it, fresh] = ids.emplace(r.p.id, &r);
      if (!fresh)
        fail(ExitCode::kData,
             "{}: id \"{}\" is already the id of the prompt at {} (ids must be unique; a line without \"id\" "
             "gets "
             "p-<xxh3-64 of its prompt>); nothing written",
             r.where, r.p.id, it->second->where);
    }
  }
  const Json dedup_report = {{"hash", "xxh3-128 of the normalized prompt"},
                             {"documents_in", read.size()},
                             {"removed", {{"exact_duplicate", duplicates}}},
                             {"duplicates_with_other_references", other_references},
                             {"examples", dedup_examples},
                             {"documents_out", distinct.size()},
                             {"seconds", now_s() - t}};

  // Decontamination: a word n-gram shared with an eval text, or the whole prompt equal to one (an eval
  // prompt shorter than n words has no n-gram).
  t = now_s();
  const NgramIndex index = load_eval_sets(o.eval_sets, o.decontam_ngram);
  std::vector<std::string> eval_hashes;
  for (const auto& e : o.eval_sets) eval_hashes.push_back(sha256_file_hex(e));
  std::sort(eval_hashes.begin(), eval_hashes.end());
  std::vector<Prompt> kept;
  Json decontam_examples = Json::array();
  uint64_t contaminated = 0;
  std::string match;
  for (auto& r : distinct) {
    const char* rule = index.equals_any(r.p.prompt, &match)     ? "whole_text"
                       : index.contains_any(r.p.prompt, &match) ? "ngram"
                                                                : nullptr;
    if (!rule) {
      kept.push_back(std::move(r.p));
      continue;
    }
    ++contaminated;
    ++by_domain[r.p.domain].contaminated;
    if (decontam_examples.size() < 5)
      decontam_examples.push_back({{"removed", r.where}, {"id", r.p.id}, {"rule", rule}, {"ngram", match}});
  }
  Json removed_per_domain = Json::object();
  for (const auto& [name, d] : by_domain) removed_per_domain[name] = d.contaminated;
  const Json decontam_report = {{"ngram", index.n()},
                                {"eval_sets", o.eval_sets},
                                {"eval_ngrams", index.size()},
                                {"eval_texts", index.texts()},
                                {"documents_in", distinct.size()},
                                {"removed", {{"contaminated", contaminated}}},
                                {"removed_per_domain", removed_per_domain},
                                {"examples", decontam_examples},
                                {"documents_out", kept.size()},
                                {"seconds", now_s() - t}};
  if (kept.empty())
    fail(ExitCode::kData,
         "no prompts left after decontamination ({} of {} distinct prompts contaminated by the eval sets, "
         "first: {}); nothing written",
         contaminated, distinct.size(), decontam_examples.empty() ? "-" : decontam_examples[0].dump());

  // The output: prompts.jsonl, the report, and the manifest last.
  std::string jsonl;
  std::set<std::string> domains;
  uint64_t with_answers = 0, with_tests = 0;
  for (const auto& p : kept) {
    jsonl += prompt_json_line(p);
    jsonl += '\n';
    domains.insert(p.domain);
    DomainCounts& d = by_domain[p.domain];
    ++d.kept;
    d.with_answers += !p.answers.empty();
    d.with_tests += !p.tests.empty();
    with_answers += !p.answers.empty();
    with_tests += !p.tests.empty();
  }
  Manifest m;
  m.format = kPromptsFormat;
  m.domains.assign(domains.begin(), domains.end());
  m.files.push_back({kPromptsFile, xxh3_64_hex(jsonl), jsonl.size(), kept.size()});
  // Everything that decides the content besides the input bytes (not the input paths: the same prompts
  // elsewhere are the same set).
  m.settings = {
      {"prompt_rules", kPromptRules},
      {"normalize_rules", kNormalizeRules},
      {"chat_markers",
       fmt::format("forge's chat markers ({}) in a prompt respelled as in chat content", kChatTemplateName)},
      {"ids", "given, else p-<xxh3-64 of the normalized prompt>"},
      {"default_domain", kDefaultPromptDomain},
      {"exact_dedup", {{"hash", "xxh3-128"}, {"of", "normalized prompt"}}},
      {"decontam",
       {{"ngram", o.decontam_ngram}, {"whole_text", "exact_text_form"}, {"eval_set_sha256", eval_hashes}}},
      {"tokenized", false}};
  m.version = m.compute_version();

  Json summary_domains = Json::object();
  for (const auto& [name, d] : by_domain)
    summary_domains[name] = {
        {"read", d.read}, {"duplicates", d.duplicates},     {"contaminated", d.contaminated},
        {"kept", d.kept}, {"with_answers", d.with_answers}, {"with_tests", d.with_tests}};
  Json quality = {
      {"dataset", o.out},
      {"format", kPromptsFormat},
      {"stages", {{"ingest", ingest_report}, {"exact_dedup", dedup_report}, {"decontam", decontam_report}}}};
  quality["summary"] = {
      {"version", m.version},     {"prompts_read", read.size()},  {"prompts_kept", kept.size()},
      {"duplicates", duplicates}, {"contaminated", contaminated}, {"with_answers", with_answers},
      {"with_tests", with_tests}, {"domains", summary_domains},   {"seconds", now_s() - t_start}};
  quality["inputs"] = Json::array();
  for (const auto& in : o.inputs) quality["inputs"].push_back({{"path", in.path}, {"domain", in.domain}});
  const std::string summary = summary_text(quality);

  // Built in a sibling directory and renamed when complete, as every dataset is.
  fs::path out = fs::path(o.out).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "DIR/" names DIR
  const fs::path partial =
      out.parent_path() / (out.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(partial);
  fs::create_directories(partial);
  try {
    write_file_atomic((partial / kPromptsFile).string(), jsonl);
    write_json_atomic((partial / "quality.json").string(), quality);
    write_file_atomic((partial / "quality.txt").string(), summary);
    write_manifest(partial.string(), m);
    std::error_code ec;
    if (fs::exists(out, ec)) fs::remove(out);  // an empty directory (checked above)
    fs::rename(partial, out);
    fsync_dir(fs::absolute(out).parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  return {o.out, m.version, summary, quality};
}

PromptSet load_prompt_set(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(ExitCode::kUsage, "{}: no such directory, so no prompt set; {}", dir, kHowToPrepare);
  if (!fs::exists(fs::path(dir) / "manifest.json", ec))
    fail(ExitCode::kUsage,
         "{}: not a prepared dataset (no manifest.json, or `forge-data prepare` did not finish); {}", dir,
         kHowToPrepare);
  const Manifest m = load_any_manifest(dir);
  if (m.format != kPromptsFormat)
    fail(ExitCode::kUsage, "{}: a {} dataset (token shards for {}), not a prompt set; {}", dir, m.format,
         m.format == "text"   ? "pretraining"
         : m.format == "chat" ? "SFT"
                              : "DPO",
         kHowToPrepare);
  const std::string manifest_path = (fs::path(dir) / "manifest.json").string();
  const auto entry = std::find_if(m.files.begin(), m.files.end(),
                                  [](const DataFileEntry& e) { return e.file == kPromptsFile; });
  if (entry == m.files.end())
    fail(ExitCode::kData, "{}: lists no {} (edited or damaged); prepare the prompt set again", manifest_path,
         kPromptsFile);
  const std::string path = (fs::path(dir) / kPromptsFile).string();
  if (!fs::is_regular_file(path, ec))
    fail(ExitCode::kData, "{}: missing (the manifest lists it); prepare the prompt set again", path);
  const std::string data = read_file(path);
  if (data.size() != entry->bytes)
    fail(ExitCode::kData,
         "{}: {} bytes, the manifest says {} (truncated or edited); prepare the prompt set again", path,
         data.size(), entry->bytes);
  if (const std::string h = xxh3_64_hex(data); h != entry->xxh3)
    fail(ExitCode::kData,
         "{}: xxh3 {} does not match the manifest's {} (edited or damaged); prepare the prompt set again",
         path, h, entry->xxh3);

  PromptSet set;
  set.dir = dir;
  set.version = m.version;
  std::set<std::string> ids, domains;
  size_t start = 0;
  for (int line_no = 1; start < data.size(); ++line_no) {
    size_t nl = data.find('\n', start);
    if (nl == std::string::npos) nl = data.size();
    const std::string_view line(data.data() + start, nl - start);
    start = nl + 1;
    const auto bad = [&](const std::string& why) {
      fail(ExitCode::kData, "{}:{}: {}; prepare the prompt set again", path, line_no, why);
    };
    const Json rec = Json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object()) bad("not a JSON object");
    Prompt p;
    try {
      p.id = rec.at("id").get<std::string>();
      p.prompt = rec.at("prompt").get<std::string>();
      p.domain = rec.at("domain").get<std::string>();
      p.answers = rec.at("answers").get<std::vector<std::string>>();
      p.tests = rec.at("tests").get<std::string>();
      p.entry_point = rec.at("entry_point").get<std::string>();
    } catch (const Json::exception& e) {
      bad(fmt::format("malformed prompt: {}", e.what()));
    }
    if (p.id.empty() || !ids.insert(p.id).second) bad(fmt::format("id \"{}\" empty or repeated", p.id));
    if (blank(p.prompt)) bad("empty prompt");
    if (p.answers.empty() && p.tests.empty()) bad("neither answers nor tests");
    domains.insert(p.domain);
    set.prompts.push_back(std::move(p));
  }
  set.domains.assign(domains.begin(), domains.end());
  if (set.prompts.size() != entry->records || set.domains != m.domains)
    fail(
        ExitCode::kData,
        "{}: {} prompts in domains [{}], the manifest says {} in [{}] (edited); prepare the prompt set again",
        path, set.prompts.size(), fmt::join(set.domains, ", "), entry->records, fmt::join(m.domains, ", "));
  return set;
}

}  // namespace forge::data
