#include "forge/dataio/manifest.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <filesystem>

namespace forge::data {

namespace {

void check_inside(const std::string& file, const std::string& where, const char* what) {
  if (file.find("..") != std::string::npos || file.empty() || file[0] == '/')
    fail(ExitCode::kData, "{}: {} file '{}' must be a path inside the dataset", where, what, file);
}

}  // namespace

Json Manifest::to_json() const {
  if (format == "prompts") {
    // A prompt set: no tokenizer, token dtype, licenses or shards; its data files instead.
    Json files_json = Json::array();
    for (const auto& f : files)
      files_json.push_back({{"file", f.file}, {"xxh3", f.xxh3}, {"bytes", f.bytes}, {"records", f.records}});
    Json j = {{"schema_version", schema_version},
              {"format", format},
              {"domains", domains},
              {"settings", settings},
              {"files", files_json}};
    if (!version.empty()) j["version"] = version;
    return j;
  }
  Json shards_json = Json::array();
  for (const auto& s : shards)
    shards_json.push_back({{"file", s.file},
                           {"split", s.split},
                           {"domain", s.domain},
                           {"xxh3", s.xxh3},
                           {"bytes", s.bytes},
                           {"tokens", s.tokens},
                           {"documents", s.documents}});
  Json j = {{"schema_version", schema_version},
            {"tokenizer",
             {{"file", tokenizer_file},
              {"sha256", tokenizer_sha256},
              {"vocab_size", vocab_size},
              {"eos_id", eos_id}}},
            {"token_dtype", token_bytes == 2 ? "uint16" : "uint32"},
            {"domains", domains},
            {"licenses", licenses},
            {"settings", settings},
            {"shards", shards_json}};
  if (format != "text") j["format"] = format;
  if (!languages.empty()) j["languages"] = languages;
  if (!version.empty()) j["version"] = version;
  return j;
}

Manifest Manifest::from_json(const Json& j, const std::string& where) {
  Manifest m;
  try {
    m.schema_version = j.at("schema_version").get<int>();
    if (m.schema_version != kManifestSchemaVersion)
      fail(ExitCode::kData, "{}: schema_version {} (this build reads {})", where, m.schema_version,
           kManifestSchemaVersion);
    m.version = j.at("version").get<std::string>();
    m.format = j.value("format", std::string("text"));
    if (m.format != "text" && m.format != "chat" && m.format != "preference" && m.format != "image-text" &&
        m.format != "prompts")
      fail(ExitCode::kData,
           "{}: format '{}' unknown (this build reads text, chat, preference, image-text and prompts)", where,
           m.format);
    if (m.format == "prompts") {
      m.domains = j.at("domains").get<std::vector<std::string>>();
      m.settings = j.at("settings");
      for (const auto& f : j.at("files")) {
        DataFileEntry e;
        e.file = f.at("file").get<std::string>();
        e.xxh3 = f.at("xxh3").get<std::string>();
        e.bytes = f.at("bytes").get<uint64_t>();
        e.records = f.at("records").get<uint64_t>();
        check_inside(e.file, where, "data");
        m.files.push_back(std::move(e));
      }
      return m;
    }
    const Json& t = j.at("tokenizer");
    m.tokenizer_file = t.at("file").get<std::string>();
    m.tokenizer_sha256 = t.at("sha256").get<std::string>();
    m.vocab_size = t.at("vocab_size").get<uint32_t>();
    m.eos_id = t.at("eos_id").get<int>();
    const std::string dtype = j.at("token_dtype").get<std::string>();
    if (dtype != "uint16" && dtype != "uint32")
      fail(ExitCode::kData, "{}: token_dtype '{}' unknown", where, dtype);
    m.token_bytes = dtype == "uint16" ? 2 : 4;
    m.domains = j.at("domains").get<std::vector<std::string>>();
    m.licenses = j.at("licenses").get<std::vector<std::string>>();
    m.languages = j.value("languages", std::vector<std::string>());
    m.settings = j.at("settings");
    for (const auto& s : j.at("shards")) {
      ShardEntry e;
      e.file = s.at("file").get<std::string>();
      e.split = s.at("split").get<std::string>();
      e.domain = s.at("domain").get<std::string>();
      e.xxh3 = s.at("xxh3").get<std::string>();
      e.bytes = s.at("bytes").get<uint64_t>();
      e.tokens = s.at("tokens").get<uint64_t>();
      e.documents = s.at("documents").get<uint64_t>();
      check_inside(e.file, where, "shard");
      m.shards.push_back(std::move(e));
    }
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: malformed manifest: {}", where, e.what());
  }
  return m;
}

std::string Manifest::compute_version() const {
  Manifest copy = *this;
  copy.version.clear();
  return sha256_hex(copy.to_json().dump());
}

std::vector<const ShardEntry*> Manifest::shards_of(const std::string& split,
                                                   const std::string& domain) const {
  std::vector<const ShardEntry*> out;
  for (const auto& s : shards)
    if (s.split == split && (domain.empty() || s.domain == domain)) out.push_back(&s);
  return out;
}

uint64_t Manifest::tokens(const std::string& split, const std::string& domain) const {
  uint64_t n = 0;
  for (const auto* s : shards_of(split, domain)) n += s->tokens;
  return n;
}

Manifest load_any_manifest(const std::string& dataset_dir) {
  const std::string path = (std::filesystem::path(dataset_dir) / "manifest.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) fail(ExitCode::kIo, "dataset {}: cannot read it: {}", dataset_dir, ec.message());
    fail(ExitCode::kData, "{}: no manifest.json (not a dataset, or `forge-data prepare` did not finish)",
         dataset_dir);
  }
  Manifest m = Manifest::from_json(read_json(path), path);
  const std::string expected = m.compute_version();
  if (m.version != expected)
    fail(ExitCode::kData,
         "{}: version {} does not match its content ({}): the manifest was edited or damaged; rebuild the "
         "dataset with `forge-data prepare`",
         path, m.version, expected);
  return m;
}

Manifest load_manifest(const std::string& dataset_dir) {
  Manifest m = load_any_manifest(dataset_dir);
  if (m.format == "prompts")
    fail(ExitCode::kUsage,
         "{}: a prompt set (format prompts: prompts for reinforcement learning, no tokenizer or token "
         "shards), not a token dataset; RL training loads it (forge::data::load_prompt_set) and `forge-data "
         "verify` and `inspect` read it; a token dataset is prepared with `--format text|chat|preference`",
         dataset_dir);
  return m;
}

void write_manifest(const std::string& dataset_dir, Manifest& m) {
  m.version = m.compute_version();
  write_json_atomic((std::filesystem::path(dataset_dir) / "manifest.json").string(), m.to_json());
}

}  // namespace forge::data
