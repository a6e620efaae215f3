// The in-memory corpus that `prepare` passes from stage to stage. Documents keep their input order, so
// every stage's decisions (which duplicate survives, which document goes to validation) are deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

struct Document {
  std::string text;
  std::string source;   // file path, plus ":<line>" for a JSONL record
  std::string license;  // SPDX identifier when known ("" = not detected)
  uint16_t domain = 0;  // index into Corpus::domains
};

struct Corpus {
  std::vector<std::string> domains;  // in order of first appearance
  std::vector<Document> docs;

  // Index of `name`, added if new. Domain names are [A-Za-z0-9_-]+ (they appear in shard file names).
  uint16_t domain_id(const std::string& name);
};

// Throws forge::Error(kUsage) unless `name` is a valid domain name.
void check_domain_name(const std::string& name, const std::string& where);

}  // namespace forge::data
