// A synthetic dataset for the reader and cache benchmarks: TOKENS uint16 tokens of forge's synthetic stream
// in documents of 4096 tokens, cut into shards of `per_shard` tokens, with a valid manifest (its tokenizer a
// placeholder: the benchmarks never decode).
#pragma once

#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace forge::bench {

inline void write_synthetic_dataset(const std::string& dir, uint64_t tokens, uint32_t vocab,
                                    uint64_t per_shard) {
  using namespace forge::data;
  namespace fs = std::filesystem;

  fs::create_directories(fs::path(dir) / "shards");
  forge::write_file_atomic(dir + "/tokenizer.model", "bench");
  Manifest m;
  m.tokenizer_file = "tokenizer.model";
  m.tokenizer_sha256 = forge::sha256_hex("bench");
  m.vocab_size = vocab;
  m.eos_id = 2;
  m.token_bytes = 2;
  m.domains = {"bench"};
  m.licenses = {"unknown"};
  const SyntheticStream stream(vocab, 1);
  const uint64_t doc = 4096;
  std::vector<int32_t> buf(doc);
  for (uint64_t first = 0, seq = 0; first < tokens; first += per_shard, ++seq) {
    ShardData d;
    const uint64_t n = std::min(per_shard, tokens - first);
    for (uint64_t t = 0; t < n; t += doc) {
      stream.sample(first + t, buf);
      d.tokens.insert(d.tokens.end(), buf.begin(), buf.begin() + std::min<uint64_t>(doc, n - t));
      d.doc_offsets.push_back(d.tokens.size());
      d.doc_domains.push_back(0);
      d.doc_licenses.push_back(0);
    }
    const std::string rel = fmt::format("shards/train-bench-{:05d}.h5", seq);
    write_shard(dir + "/" + rel, d, {kShardSchemaVersion, "train", "bench", m.tokenizer_sha256, vocab}, 2);
    m.shards.push_back({rel, "train", "bench", forge::xxh3_file_hex(dir + "/" + rel),
                        fs::file_size(dir + "/" + rel), d.tokens.size(), d.documents()});
  }
  write_manifest(dir, m);
}

}  // namespace forge::bench
