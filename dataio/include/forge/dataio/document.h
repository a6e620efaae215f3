// The in-memory corpus that `prepare` passes from stage to stage. Documents keep their input order, so
// every stage's decisions (which duplicate survives, which document goes to validation) are deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

struct Document {
  std::string text;
  std::string source;    // file path, plus ":<line>" for a JSONL record
  std::string license;   // SPDX identifier when known ("" = not detected)
  uint16_t domain = 0;   // index into Corpus::domains
  std::string language;  // ISO 639 code from the language stage ("" = not identified, "un" = unknown)
  // The code repository the document is a file of ("" = none): the record's "repo" field or the directory
  // layout (ingest.repo_depth). Its family (the repository itself, or the one it is a fork of) keeps all of
  // the family's files on one side of the validation split.
  std::string repo, repo_family;
  // Image-text documents: their pictures, indices into Corpus::images, in the order of their placeholders.
  std::vector<uint32_t> images;
};

// A picture of an image-text document, decoded and fitted at ingest (image_text.h).
struct CorpusImage {
  std::vector<uint8_t> rgb;  // size x size x 3, as stored in the shards
  uint64_t pixel_hash = 0, perceptual_hash = 0;
};

struct Corpus {
  std::vector<std::string> domains;  // in order of first appearance
  std::vector<Document> docs;
  std::vector<CorpusImage> images;  // image-text corpora only

  // Index of `name`, added if new. Domain names are [A-Za-z0-9_-]+ (they appear in shard file names).
  uint16_t domain_id(const std::string& name);
};

// Throws forge::Error(kUsage) unless `name` is a valid domain name.
void check_domain_name(const std::string& name, const std::string& where);

}  // namespace forge::data
