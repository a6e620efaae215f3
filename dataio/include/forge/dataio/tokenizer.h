// Stage 6: the tokenizer. Trained as a SentencePiece model (BPE with byte fallback) on a deterministic sample
// of the cleaned corpus, or loaded from an existing file: a SentencePiece model or a Hugging Face
// tokenizer.json (byte-level BPE as GPT-2, Llama 3 and Qwen2 ship it; dataio/src/hf_tokenizer.cpp lists what
// is supported). The file's SHA-256 identifies it everywhere.
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

namespace forge::data {

namespace detail {
class TokenizerModel;
}

struct TokenizerTrainOptions {
  uint32_t vocab = 8192;
  uint64_t sample_bytes = 8 << 20;  // training text taken evenly across the corpus
  int threads = 2;
  bool image_placeholder = false;  // image-text datasets: also reserve kImagePlaceholder (image_text.h)
};

// Memoized encodings of text chunks, one per encoding thread. Text is cut between two bytes that no
// vocabulary piece holds next to each other: no BPE merge can cross such a cut, so the chunks encode
// independently to the same ids (a tokenizer.json's chunks are its pre-tokens). Natural text repeats its
// chunks (words), so most are lookups. A cache serves one tokenizer.
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
  // A SentencePiece model, or a Hugging Face tokenizer.json (told by content: a JSON object with a "model").
  // Throws forge::Error(kData) naming the file if it is neither, or names the construct of a tokenizer.json
  // that cannot run here.
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

  // Appends nothing: `ids` is replaced by the encoding of `text`. No BOS/EOS is added (a tokenizer.json's
  // post_processor is not run); a tokenizer.json's added tokens written in the text become their ids, and
  // invalid UTF-8 is read as U+FFFD.
  void encode(std::string_view text, std::vector<int>& ids) const;
  // The same ids, through `cache` (see EncodeCache).
  void encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const;
  // Special tokens are kept (their content). A tokenizer.json's decode gives the bytes the tokens stand
  // for, invalid UTF-8 included (the library would replace it), so a single token's bytes can be counted.
  std::string decode(std::span<const int> ids) const;
  // The vocabulary's spelling of `id` ("" for an id no piece has).
  std::string piece(int id) const;
  // The id of the vocabulary piece spelled exactly `piece`, if the model has one. SentencePiece spells a
  // space U+2581; a byte-level tokenizer.json spells bytes in GPT-2's alphabet (a space is U+0120 'Ġ') and
  // its added tokens by their content.
  std::optional<uint32_t> piece_id(std::string_view piece) const;
  // One more than the largest id (of a tokenizer.json's vocabulary and added tokens).
  uint32_t vocab_size() const;
  // The end-of-sequence id, -1 if none. A tokenizer.json names none, so: the special token its
  // post_processor's TemplateProcessing appends after a single sequence if any, else the first of
  // <|endoftext|> (GPT-2, Qwen2), <|end_of_text|> (Llama 3), </s> (Llama 2, Mistral), <eos> (Gemma),
  // <|im_end|>, <|eot_id|>, <|end|> that is an added token, else the first that is a vocabulary piece.
  int eos_id() const;
  const std::string& sha256() const { return sha256_; }
  // False when the model normalizes across chunks (e.g. a dummy prefix): encode(text, ids, cache) then
  // encodes whole texts.
  bool chunk_cache_usable() const;
  // The name a dataset keeps the file under: "tokenizer.model" (SentencePiece) or "tokenizer.json".
  std::string_view file_name() const;

 private:
  Tokenizer(std::unique_ptr<detail::TokenizerModel> model, std::string sha256);
  std::unique_ptr<detail::TokenizerModel> model_;
  std::string sha256_;
};

}  // namespace forge::data
