// Builds small datasets directly (shards + manifest, no tokenizer training) for reader and shard tests.
#pragma once

#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace forge::test {

// Token i of domain d's stream is a pure function of (d, i), so a test can predict any window.
inline uint32_t fixture_token(size_t domain, uint64_t i, uint32_t vocab) {
  return static_cast<uint32_t>((i * 7919 + domain * 104729 + (i >> 3)) % vocab);
}

// With `chat`, whether token i of domain d's stream is scored (its /loss_mask byte): runs of scored and
// unscored tokens of varying lengths, as replies and prompts make them.
inline bool fixture_scored(size_t domain, uint64_t i) {
  return ((i + domain) / 3 + (i >> 4)) % 3 != 0;
}

struct FixtureDomain {
  std::string name;
  std::vector<uint64_t> doc_lengths;  // per split "train"
  uint64_t docs_per_shard = 2;
};

// Two domains whose shard boundaries fall inside windows: documents of odd lengths, two per prose shard.
inline std::vector<FixtureDomain> two_domains() {
  return {{"prose", {301, 157, 999, 64, 513, 250, 77}, 2}, {"code", {120, 333, 210}, 1}};
}

// Writes a dataset with the given train domains (valid split: one 40-token document per domain); `chat`
// makes it a chat dataset whose shards carry loss masks (fixture_scored).
inline data::Manifest make_fixture_dataset(const std::string& dir, const std::vector<FixtureDomain>& domains,
                                           uint32_t vocab = 1000, bool chat = false) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(dir) / "shards");
  const std::string tok_bytes = "fixture tokenizer " + std::to_string(vocab);
  write_file_atomic((fs::path(dir) / "tokenizer.model").string(), tok_bytes);
  data::Manifest m;
  m.tokenizer_file = "tokenizer.model";
  m.tokenizer_sha256 = sha256_hex(tok_bytes);
  m.vocab_size = vocab;
  m.eos_id = 2;
  m.token_bytes = data::token_bytes_for_vocab(vocab);
  m.licenses = {"unknown"};
  if (chat) m.format = "chat";
  for (const auto& d : domains) m.domains.push_back(d.name);
  for (const std::string split : {"train", "valid"}) {
    for (size_t d = 0; d < domains.size(); ++d) {
      const std::vector<uint64_t> lengths =
          split == "train" ? domains[d].doc_lengths : std::vector<uint64_t>{40};
      uint64_t pos = split == "train" ? 0 : 1000000;
      int seq = 0;
      for (size_t first = 0; first < lengths.size(); first += domains[d].docs_per_shard) {
        data::ShardData sd;
        for (size_t k = first; k < std::min(lengths.size(), first + domains[d].docs_per_shard); ++k) {
          for (uint64_t t = 0; t < lengths[k]; ++t, ++pos) {
            sd.tokens.push_back(fixture_token(d, pos, vocab));
            if (chat) sd.loss_mask.push_back(fixture_scored(d, pos) ? 1 : 0);
          }
          sd.doc_offsets.push_back(sd.tokens.size());
          sd.doc_domains.push_back(static_cast<uint16_t>(d));
          sd.doc_licenses.push_back(0);
        }
        const std::string rel =
            "shards/" + split + "-" + domains[d].name + "-" + std::to_string(seq++) + ".h5";
        const std::string path = (fs::path(dir) / rel).string();
        data::write_shard(path, sd,
                          {data::kShardSchemaVersion, split, domains[d].name, m.tokenizer_sha256, vocab},
                          m.token_bytes);
        m.shards.push_back({rel, split, domains[d].name, xxh3_file_hex(path), fs::file_size(path),
                            sd.tokens.size(), sd.documents()});
      }
    }
  }
  data::write_manifest(dir, m);
  return m;
}

}  // namespace forge::test
