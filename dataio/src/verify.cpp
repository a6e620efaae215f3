#include "forge/dataio/verify.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/image_text.h"

#include <filesystem>

namespace fs = std::filesystem;

namespace forge::data {

ShardLayout check_shard(const std::string& dataset_dir, const Manifest& m, const ShardEntry& e,
                        bool checksum) {
  const std::string path = (fs::path(dataset_dir) / e.file).string();
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) fail(ExitCode::kData, "shard {}: missing or unreadable ({})", path, ec.message());
  if (size != e.bytes)
    fail(ExitCode::kData, "shard {}: {} bytes, manifest says {} (truncated or replaced)", path, size,
         e.bytes);
  if (checksum) {
    const std::string got = xxh3_file_hex(path);
    if (got != e.xxh3)
      fail(ExitCode::kData, "shard {}: xxh3 {} does not match the manifest's {} (corrupted)", path, got,
           e.xxh3);
  }
  const ShardLayout layout = read_shard_layout(path);
  const auto differs = [&](const char* what, const std::string& got, const std::string& want) {
    if (got != want) fail(ExitCode::kData, "shard {}: {} is '{}', manifest says '{}'", path, what, got, want);
  };
  differs("split", layout.attrs.split, e.split);
  differs("domain", layout.attrs.domain, e.domain);
  differs("tokenizer_sha256", layout.attrs.tokenizer_sha256, m.tokenizer_sha256);
  differs("token count", std::to_string(layout.tokens), std::to_string(e.tokens));
  differs("document count", std::to_string(layout.documents), std::to_string(e.documents));
  differs("token width (bytes)", std::to_string(layout.token_bytes), std::to_string(m.token_bytes));
  differs("vocab_size", std::to_string(layout.attrs.vocab_size), std::to_string(m.vocab_size));
  return layout;
}

VerifyResult verify_dataset(const std::string& dataset_dir) {
  const Manifest m = load_manifest(dataset_dir);
  const std::string tok = (fs::path(dataset_dir) / m.tokenizer_file).string();
  if (!fs::exists(tok)) fail(ExitCode::kData, "tokenizer {}: missing", tok);
  const std::string tok_hash = sha256_file_hex(tok);
  if (tok_hash != m.tokenizer_sha256)
    fail(ExitCode::kData, "tokenizer {}: sha256 {} does not match the manifest's {}", tok, tok_hash,
         m.tokenizer_sha256);
  if (m.shards.empty()) fail(ExitCode::kData, "{}: the manifest lists no shards", dataset_dir);
  VerifyResult result;
  for (const auto& e : m.shards) {
    check_shard(dataset_dir, m, e, true);
    const std::string path = (fs::path(dataset_dir) / e.file).string();
    const ShardData data = read_shard(path);
    for (size_t i = 0; i + 1 < data.doc_offsets.size(); ++i)
      if (data.doc_offsets[i] > data.doc_offsets[i + 1])
        fail(ExitCode::kData, "shard {}: doc_offsets decrease at document {}", path, i);
    if (data.doc_offsets.front() != 0 || data.doc_offsets.back() != data.tokens.size())
      fail(ExitCode::kData, "shard {}: doc_offsets do not span the token dataset", path);
    for (size_t i = 0; i < data.tokens.size(); ++i)
      if (data.tokens[i] >= m.vocab_size)
        fail(ExitCode::kData, "shard {}: token {} at position {} is outside the vocabulary ({})", path,
             data.tokens[i], i, m.vocab_size);
    for (size_t i = 0; i < data.doc_domains.size(); ++i) {
      if (data.doc_domains[i] >= m.domains.size())
        fail(ExitCode::kData, "shard {}: document {} has domain id {} (manifest has {} domains)", path, i,
             data.doc_domains[i], m.domains.size());
      if (data.doc_licenses[i] >= std::max<size_t>(1, m.licenses.size()))
        fail(ExitCode::kData, "shard {}: document {} has license id {} out of range", path, i,
             data.doc_licenses[i]);
      if (!data.doc_languages.empty() && data.doc_languages[i] >= m.languages.size())
        fail(ExitCode::kData, "shard {}: document {} has language id {} (manifest has {} languages)", path, i,
             data.doc_languages[i], m.languages.size());
    }
    if (data.documents() > 0 && data.doc_languages.empty() != m.languages.empty())
      fail(ExitCode::kData, "shard {}: {} /doc_languages but the manifest {} a language list", path,
           data.doc_languages.empty() ? "no" : "has", m.languages.empty() ? "has no" : "has");
    if (!data.image_positions.empty() && m.format != kImageTextFormat)
      fail(ExitCode::kData, "shard {}: holds pictures but the manifest's format is {}", path, m.format);
    ++result.shards;
    result.tokens += data.tokens.size();
    result.documents += data.documents();
  }
  return result;
}

}  // namespace forge::data
