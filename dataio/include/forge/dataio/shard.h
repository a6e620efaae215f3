// HDF5 token shards. One shard holds the documents of one (split, domain), concatenated, each followed by
// the tokenizer's end-of-sequence id:
//   /tokens       1-D uint16 (vocab <= 65535) or uint32, contiguous layout (so readers can read its bytes
//                 directly at H5Dget_offset, without taking HDF5's global lock)
//   /doc_offsets  uint64 [documents + 1]: start of each document in /tokens, then the token count
//   /doc_domains  uint16 [documents]: index into the manifest's domain list
//   /doc_licenses uint16 [documents]: index into the manifest's license list (0 = unknown)
//   /doc_languages uint16 [documents], datasets prepared with the language stage: index into the
//                 manifest's language list
//   /loss_mask    uint8 [tokens], chat datasets only, contiguous like /tokens: 1 where the token is scored
//                 as a target (an assistant's reply and its end of turn), 0 elsewhere
//   /images       uint8 [images, size, size, 3], image-text datasets only, contiguous: each picture fitted to
//                 the encoder's input (image_text.h), in the order of their runs
//   /image_positions uint64 [images]: where each picture's run of image_tokens placeholder ids starts in
//                 /tokens (increasing, runs inside one document, never overlapping)
//   attributes on "/": schema_version, split, domain, tokenizer_sha256, vocab_size; image-text shards also
//                 image_size and image_tokens
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

inline constexpr int kShardSchemaVersion = 1;

struct ShardData {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> doc_offsets{0};
  std::vector<uint16_t> doc_domains;
  std::vector<uint16_t> doc_licenses;
  std::vector<uint16_t> doc_languages;  // empty, or one per document
  std::vector<uint8_t> loss_mask;       // empty, or one per token (chat datasets)
  std::vector<uint8_t> images;          // image-text: image_positions.size() pictures of size^2 * 3 bytes
  std::vector<uint64_t> image_positions;

  uint64_t documents() const { return doc_domains.size(); }
};

struct ShardAttrs {
  int schema_version = kShardSchemaVersion;
  std::string split, domain, tokenizer_sha256;
  uint32_t vocab_size = 0;
  uint32_t image_size = 0, image_tokens = 0;  // image-text shards only (0: none)
};

// Token element size for a vocabulary: 2 bytes when every id fits in uint16 with room to spare.
int token_bytes_for_vocab(uint32_t vocab);

// Writes `<path>.tmp`, fsyncs it and renames it to `path`. Throws forge::Error(kIo) on failure.
void write_shard(const std::string& path, const ShardData& data, const ShardAttrs& attrs, int token_bytes);

struct ShardLayout {
  ShardAttrs attrs;
  uint64_t tokens = 0, documents = 0;
  int token_bytes = 0;
  uint64_t token_offset = 0;  // byte offset of /tokens in the file
  bool has_loss_mask = false, has_languages = false;
  uint64_t loss_mask_offset = 0;  // byte offset of /loss_mask in the file, when it has one
  bool has_images = false;
  uint64_t images = 0, images_offset = 0;  // pictures, and the byte offset of /images when there are any
  uint64_t file_bytes = 0;
};

// Opens the shard through HDF5 and checks its structure (datasets, types, sizes, attributes, that the
// token bytes lie inside the file). Anything wrong: forge::Error(kData) naming the shard and the problem.
ShardLayout read_shard_layout(const std::string& path);

// Reads /doc_offsets only (the reader's document boundaries) and checks them: documents + 1 values from 0
// to the token count, never decreasing. Anything wrong: forge::Error(kData) naming the shard.
std::vector<uint64_t> read_doc_offsets(const std::string& path, const ShardLayout& layout);

// Reads /image_positions of an image-text shard (layout.has_images) and checks that they increase by at
// least image_tokens and that every run lies inside /tokens. Anything wrong: forge::Error(kData).
std::vector<uint64_t> read_image_positions(const std::string& path, const ShardLayout& layout);

// Reads everything through HDF5 (verify, inspect, tests).
ShardData read_shard(const std::string& path, ShardLayout* layout = nullptr);

}  // namespace forge::data
