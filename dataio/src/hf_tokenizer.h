// What forge::data::Tokenizer dispatches to: one implementation per tokenizer file format, SentencePiece
// (tokenizer.cpp) and Hugging Face tokenizer.json byte-level BPE (hf_tokenizer.cpp). Private to forge_data.
#pragma once

#include "forge/dataio/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data::detail {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual void encode(std::string_view text, std::vector<int>& ids) const = 0;
  virtual void encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const = 0;
  virtual std::string decode(std::span<const int> ids) const = 0;
  virtual std::string piece(int id) const = 0;
  virtual std::optional<uint32_t> piece_id(std::string_view piece) const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual int eos_id() const = 0;
  virtual bool chunk_cache_usable() const = 0;
  virtual std::string_view file_name() const = 0;
};

// True when `bytes` start like JSON ('{' after whitespace): SentencePiece's protobuf never does (0x7B would
// be a group field its ModelProto does not have), so the kind is told by content, whatever the file name.
bool looks_like_json(std::string_view bytes);

// A Hugging Face tokenizer.json (the file's `bytes`, read from `path`, which errors name). Throws
// forge::Error(kData) naming the file and the construct it cannot run.
std::unique_ptr<TokenizerModel> load_hf_tokenizer(const std::string& path, std::string_view bytes);

}  // namespace forge::data::detail
