// Stage 6: the SentencePiece tokenizer (BPE with byte fallback). Trained on a deterministic sample of the
// cleaned corpus, or loaded from an existing model; the model file's SHA-256 identifies it everywhere.
// A trained model reserves "\n" and the chat markers (forge/dataio/chat.h) as user-defined symbols, for
// text datasets too: a model pretrained on text can then be fine-tuned on chat with the same tokenizer.
#pragma once

#include "forge/dataio/document.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace forge::data {

struct TokenizerTrainOptions {
  uint32_t vocab = 8192;
  uint64_t sample_bytes = 8 << 20;  // training text taken evenly across the corpus
  int threads = 2;
};

// Memoized encodings of text chunks, one per encoding thread. Text is cut between two bytes that no
// vocabulary piece holds next to each other: no BPE merge can cross such a cut, so the chunks encode
// independently to the same ids. Natural text repeats its chunks (words), so most are lookups.
// It is an open-addressing table: one probe compares a stored 64-bit hash before any key bytes, and keys and
// ids live in two arenas, so a lookup costs about one cache miss and no allocation.
class EncodeCache {
 public:
  // The cached ids of `chunk` (whose xxh3_64 is `hash`), or false.
  bool find(std::string_view chunk, uint64_t hash, std::span<const int>* ids) const;
  void insert(std::string_view chunk, uint64_t hash, std::span<const int> ids);
  size_t size() const { return used_; }
  void clear();
  uint64_t hits = 0, misses = 0;

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_at = 0, ids_at = 0;
    uint16_t key_len = 0, ids_len = 0;  // key_len 0: empty (chunks are never empty)
  };
  void grow();
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int> ids_;
  size_t used_ = 0;
};

class Tokenizer {
 public:
  // Throws forge::Error(kData) naming the file if it is not a SentencePiece model.
  static Tokenizer load(const std::string& model_path);
  // Trains on a sample of `corpus` and writes the model to `model_path` (atomically): whole documents, every
  // `stride`-th from the first, until options.sample_bytes are taken. stride 0: sample_stride of the
  // corpus's bytes (a distributed prepare gathers the sampled documents on one rank and passes 1).
  static Tokenizer train(const Corpus& corpus, const TokenizerTrainOptions& options,
                         const std::string& model_path, uint64_t stride = 0);
  // The stride that spreads a sample of `budget` bytes evenly over a corpus of `total` bytes.
  static uint64_t sample_stride(uint64_t total, uint64_t budget);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends nothing: `ids` is replaced by the encoding of `text`.
  void encode(std::string_view text, std::vector<int>& ids) const;
  // The same ids, through `cache` (see EncodeCache).
  void encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const;
  std::string decode(std::span<const int> ids) const;
  std::string piece(int id) const;
  // The id of the vocabulary piece spelled exactly `piece` (SentencePiece's spelling: U+2581 for a space),
  // if the model has one.
  std::optional<uint32_t> piece_id(std::string_view piece) const;
  uint32_t vocab_size() const;
  int eos_id() const;
  const std::string& sha256() const { return sha256_; }
  // False when the model normalizes across chunks (e.g. a dummy prefix): encode(text, ids, cache) then
  // encodes whole texts.
  bool chunk_cache_usable() const { return chunkable_; }

 private:
  Tokenizer();
  void prepare_chunking();
  bool can_cut(unsigned char left, unsigned char right) const {
    return (right & 0xC0) != 0x80 &&
           !(pair_bits_[(left << 8 | right) >> 6] >> ((left << 8 | right) & 63) & 1);
  }
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string sha256_;
  std::vector<uint64_t> pair_bits_;  // 256x256: byte pairs adjacent inside some piece
  bool chunkable_ = false;
};

}  // namespace forge::data
