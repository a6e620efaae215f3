#include "forge/dataio/manifest.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <filesystem>

namespace forge::data {

Json Manifest::to_json() const {
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
    const Json& t = j.at("tokenizer");
    m.tokenizer_file = t.at("file").get<std::string>();
    m.tokenizer_sha256 = t.at("sha256").get<std::string>();
    m.vocab_size = t.at("vocab_size").get<uint32_t>();
    m.eos_id = t.at("eos_id").get<int>();
    const std::string dtype = j.at("token_dtype").get<std::string>();
    if (dtype != "uint16" && dtype != "uint32")
      fail(ExitCode::kData, "{}: token_dtype '{}' unknown", where, dtype);
    m.token_bytes = dtype == "uint16" ? 2 : 4;
    m.format = j.value("format", std::string("text"));
    if (m.format != "text" && m.format != "chat" && m.format != "preference")
      fail(ExitCode::kData, "{}: format '{}' unknown (this build reads text, chat and preference)", where,
           m.format);
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
      if (e.file.find("..") != std::string::npos || e.file.empty() || e.file[0] == '/')
        fail(ExitCode::kData, "{}: shard file '{}' must be a path inside the dataset", where, e.file);
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

Manifest load_manifest(const std::string& dataset_dir) {
  const std::string path = (std::filesystem::path(dataset_dir) / "manifest.json").string();
  if (!std::filesystem::exists(path))
    fail(ExitCode::kData, "{}: no manifest.json (not a dataset, or `forge-data prepare` did not finish)",
         dataset_dir);
  Manifest m = Manifest::from_json(read_json(path), path);
  const std::string expected = m.compute_version();
  if (m.version != expected)
    fail(ExitCode::kData,
         "{}: version {} does not match its content ({}): the manifest was edited or damaged; rebuild the "
         "dataset with `forge-data prepare`",
         path, m.version, expected);
  return m;
}

void write_manifest(const std::string& dataset_dir, Manifest& m) {
  m.version = m.compute_version();
  write_json_atomic((std::filesystem::path(dataset_dir) / "manifest.json").string(), m.to_json());
}

}  // namespace forge::data
