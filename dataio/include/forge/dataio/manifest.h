// manifest.json: the dataset's table of contents, written last by `prepare`. Its `version` is the
// SHA-256 of the rest of the manifest (shard checksums, tokenizer hash, pipeline settings), so the same
// input and settings give the same version, and a hand edit shows up as a version mismatch.
// A prompt set (format "prompts", forge/dataio/prompts.h) has the same manifest without tokenizer, shards and
// licenses: its data files and their checksums are `files`.
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

inline constexpr int kManifestSchemaVersion = 1;

struct ShardEntry {
  std::string file;  // relative to the dataset directory
  std::string split, domain;
  std::string xxh3;  // xxh3-64 of the file's bytes
  uint64_t bytes = 0, tokens = 0, documents = 0;
};

// A data file that is not a shard (a prompt set's prompts.jsonl).
struct DataFileEntry {
  std::string file;  // relative to the dataset directory
  std::string xxh3;  // xxh3-64 of the file's bytes
  uint64_t bytes = 0, records = 0;
};

struct Manifest {
  int schema_version = kManifestSchemaVersion;
  std::string version;
  std::string tokenizer_file, tokenizer_sha256;
  uint32_t vocab_size = 0;
  int token_bytes = 2;
  int eos_id = -1;
  // What the documents are: "text" (pretraining: every token is a target), "chat" (conversations in the
  // chat template, forge/dataio/chat.h; the shards carry a loss mask) or "preference" (pairs: documents
  // 2k and 2k + 1 of each domain's stream are the chosen and the rejected conversation of pair k, always
  // in the same shard; loss masks as chat). Absent in the JSON = "text", so the versions of text datasets
  // did not change when the field came. "image-text" (image_text.h): chat documents with pictures, the
  // shards carrying them. "prompts": a prompt set for reinforcement learning (prompts.h): no
  // tokenizer, shards or licenses (absent in its JSON), its data in `files`.
  std::string format = "text";
  std::vector<std::string> domains;   // per-document domain ids index this
  std::vector<std::string> licenses;  // per-document license ids index this; [0] = "unknown"
  // Per-document language ids (/doc_languages) index this, sorted; empty for datasets prepared without the
  // language stage (absent in their JSON, so their versions did not change when it came).
  std::vector<std::string> languages;
  Json settings = Json::object();  // resolved pipeline settings
  std::vector<ShardEntry> shards;  // by split, then domain, then sequence number
  // Format "prompts" only (absent in the JSON of the other formats, so their versions did not change).
  std::vector<DataFileEntry> files;

  Json to_json() const;
  static Manifest from_json(const Json& j, const std::string& where);
  std::string compute_version() const;

  // Shards of one split (and one domain, unless `domain` is empty), in manifest order.
  std::vector<const ShardEntry*> shards_of(const std::string& split, const std::string& domain = "") const;
  uint64_t tokens(const std::string& split, const std::string& domain = "") const;
};

// Reads DIR/manifest.json and checks that its version matches its content. forge::Error(kData) names
// the problem (no manifest, bad JSON, missing field, version mismatch). A token dataset's: a prompt set
// (format "prompts") has no shards or tokenizer, and is forge::Error(kUsage) saying so.
Manifest load_manifest(const std::string& dataset_dir);

// load_manifest for any format, prompt sets included (load_prompt_set, verify, inspect).
Manifest load_any_manifest(const std::string& dataset_dir);

// Sets `m.version` and writes DIR/manifest.json atomically.
void write_manifest(const std::string& dataset_dir, Manifest& m);

}  // namespace forge::data
