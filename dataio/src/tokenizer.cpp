#include "forge/dataio/tokenizer.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/image_text.h"
#include "hf_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <unordered_map>

namespace forge::data {
namespace {

// Feeds the trainer pieces of at most kMaxPiece bytes cut at line ends, taken from documents spread
// evenly over the corpus (every k-th), so the sample is deterministic and covers every domain.
class SampleIterator : public sentencepiece::SentenceIterator {
 public:
  static constexpr size_t kMaxPiece = 2048;

  SampleIterator(const Corpus& corpus, uint64_t budget, uint64_t stride) : corpus_(corpus) {
    stride_ = static_cast<size_t>(stride);
    budget_ = budget;
    advance();
  }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  void advance() {
    while (doc_ < corpus_.docs.size()) {
      const std::string& text = corpus_.docs[doc_].text;
      if (pos_ >= text.size() || used_ >= budget_) {
        doc_ += stride_;
        pos_ = 0;
        if (used_ >= budget_) break;
        continue;
      }
      size_t end = std::min(text.size(), pos_ + kMaxPiece);
      if (end < text.size()) {
        const size_t nl = text.rfind('\n', end);
        if (nl != std::string::npos && nl > pos_) end = nl + 1;
      }
      // Never cut inside a UTF-8 sequence.
      while (end < text.size() && end > pos_ && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      if (end == pos_) end = std::min(text.size(), pos_ + kMaxPiece);
      value_.assign(text, pos_, end - pos_);
      pos_ = end;
      used_ += value_.size();
      return;
    }
    done_ = true;
  }

  const Corpus& corpus_;
  size_t stride_ = 1, doc_ = 0, pos_ = 0;
  uint64_t budget_ = 0, used_ = 0;
  std::string value_;
  bool done_ = false;
};

// A SentencePiece model. Its chunk cache cuts text between bytes that no piece holds next to each other.
class SentencePieceModel final : public detail::TokenizerModel {
 public:
  explicit SentencePieceModel(const std::string& model_path, const std::string& bytes) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      fail(ExitCode::kData, "{}: not a SentencePiece model ({})", model_path, status.ToString());
    prepare_chunking();
  }
  void encode(std::string_view text, std::vector<int>& ids) const override;
  void encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const override;
  std::string decode(std::span<const int> ids) const override;
  std::string piece(int id) const override { return sp_.IdToPiece(id); }
  std::optional<uint32_t> piece_id(std::string_view piece) const override {
    const int id = sp_.PieceToId(piece);  // the unknown id when there is no such piece
    if (id < 0 || sp_.IdToPiece(id) != piece) return std::nullopt;
    return static_cast<uint32_t>(id);
  }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(sp_.GetPieceSize()); }
  int eos_id() const override { return sp_.eos_id(); }
  bool chunk_cache_usable() const override { return chunkable_; }
  std::string_view file_name() const override { return "tokenizer.model"; }

 private:
  void prepare_chunking();
  bool can_cut(unsigned char left, unsigned char right) const {
    return (right & 0xC0) != 0x80 &&
           !(pair_bits_[(left << 8 | right) >> 6] >> ((left << 8 | right) & 63) & 1);
  }
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<uint64_t> pair_bits_;  // 256x256: byte pairs adjacent inside some piece
  bool chunkable_ = false;
};

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<detail::TokenizerModel> model, std::string sha256)
    : model_(std::move(model)), sha256_(std::move(sha256)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& model_path) {
  const std::string bytes = read_file(model_path);
  std::unique_ptr<detail::TokenizerModel> model;
  if (detail::looks_like_json(bytes))
    model = detail::load_hf_tokenizer(model_path, bytes);
  else
    model = std::make_unique<SentencePieceModel>(model_path, bytes);
  return Tokenizer(std::move(model), sha256_hex(bytes));
}

uint64_t Tokenizer::sample_stride(uint64_t total, uint64_t budget) {
  return total > budget && budget > 0 ? (total + budget - 1) / budget : 1;
}

Tokenizer Tokenizer::train(const Corpus& corpus, const TokenizerTrainOptions& options,
                           const std::string& model_path, uint64_t stride) {
  // User-defined symbols are whole pieces wherever they occur in text and are never merged with their
  // neighbours: "\n" (so line structure survives BPE) and the chat markers. SentencePiece splits the list
  // at commas; no symbol contains one.
  std::string symbols = "\n";
  for (const std::string_view marker : kChatMarkers) (symbols += ',') += marker;
  if (options.image_placeholder) (symbols += ',') += kImagePlaceholder;
  if (options.vocab < 260 || options.vocab > (1u << 24))
    fail(ExitCode::kUsage, "--vocab {}: must be between 260 (256 byte pieces + specials) and 16777216",
         options.vocab);
  // identity normalization and no whitespace rewriting: our own normalizer already ran, and decoding
  // must give back the exact text (code indentation included).
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"user_defined_symbols", symbols},
      {"max_sentence_length", std::to_string(SampleIterator::kMaxPiece * 4)},
      {"num_threads", std::to_string(std::max(1, options.threads))},
      {"minloglevel", "2"},
      {"hard_vocab_limit", "true"},
  };
  if (stride == 0) {
    uint64_t total = 0;
    for (const auto& d : corpus.docs) total += d.text.size();
    stride = sample_stride(total, options.sample_bytes);
  }
  SampleIterator it(corpus, options.sample_bytes, stride);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!status.ok())
    fail(ExitCode::kData,
         "tokenizer training failed: {} (--vocab must cover 256 byte pieces plus the corpus's characters and "
         "be small enough for the corpus to fill)",
         status.ToString());
  write_file_atomic(model_path, proto);
  return load(model_path);
}

void SentencePieceModel::encode(std::string_view text, std::vector<int>& ids) const {
  ids.clear();
  const auto status = sp_.Encode(text, &ids);
  if (!status.ok()) fail(ExitCode::kData, "tokenizer: encode failed: {}", status.ToString());
}

void SentencePieceModel::prepare_chunking() {
  pair_bits_.assign(65536 / 64, 0);
  for (int id = 0; id < sp_.GetPieceSize(); ++id) {
    if (sp_.IsByte(id) || sp_.IsControl(id) || sp_.IsUnknown(id)) continue;
    // The model spells a space as U+2581; the text being cut has plain spaces.
    const std::string raw = sp_.IdToPiece(id);
    std::string piece;
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw.compare(k, 3, "\xE2\x96\x81") == 0) {
        piece.push_back(' ');
        k += 2;
      } else {
        piece.push_back(raw[k]);
      }
    }
    for (size_t k = 1; k < piece.size(); ++k) {
      const unsigned pair =
          static_cast<unsigned char>(piece[k - 1]) << 8 | static_cast<unsigned char>(piece[k]);
      pair_bits_[pair >> 6] |= uint64_t{1} << (pair & 63);
    }
  }
  // The cut rule assumes the identity normalization `prepare` trains with. A model that rewrites text
  // across chunks (dummy prefix, whitespace folding, NFKC) fails this probe and is encoded whole.
  chunkable_ = true;
  EncodeCache probe;
  std::vector<int> whole, chunked;
  for (const char* text :
       {"  Hello, world!\n\n\tdef f(x):  return x+1  # \xC3\xA9t\xC3\xA9 \xEF\xBC\xA1", " a  b\n c"}) {
    encode(text, whole);
    encode(text, chunked, probe);
    if (whole != chunked) chunkable_ = false;
  }
}

bool EncodeCache::find(std::string_view chunk, uint64_t hash, std::span<const int>* ids) const {
  if (slots_.empty()) return false;
  const size_t mask = slots_.size() - 1;
  for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key_len == 0) return false;
    if (s.hash == hash && s.key_len == chunk.size() &&
        std::memcmp(keys_.data() + s.key_at, chunk.data(), chunk.size()) == 0) {
      *ids = {ids_.data() + s.ids_at, s.ids_len};
      return true;
    }
  }
}

void EncodeCache::insert(std::string_view chunk, uint64_t hash, std::span<const int> ids) {
  if ((used_ + 1) * 2 > slots_.size()) grow();
  Slot slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
            static_cast<uint16_t>(chunk.size()), static_cast<uint16_t>(ids.size())};
  keys_.append(chunk);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  const size_t mask = slots_.size() - 1;
  size_t i = static_cast<size_t>(hash) & mask;
  while (slots_[i].key_len != 0) i = (i + 1) & mask;
  slots_[i] = slot;
  ++used_;
}

void EncodeCache::grow() {
  std::vector<Slot> old(std::max<size_t>(1024, slots_.size() * 2));
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.key_len == 0) continue;
    size_t i = static_cast<size_t>(s.hash) & mask;
    while (slots_[i].key_len != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void EncodeCache::clear() {
  slots_.clear();
  keys_.clear();
  ids_.clear();
  used_ = 0;
}

void SentencePieceModel::encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const {
  constexpr size_t kMaxCachedChunk = 64;
  constexpr size_t kMaxCacheEntries = 1 << 20;  // bounds memory on corpora with huge vocabularies of words
  if (!chunkable_) return encode(text, ids);
  ids.clear();
  std::vector<int> piece_ids;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    size_t j = i + 1;
    while (j < n && !can_cut(static_cast<unsigned char>(text[j - 1]), static_cast<unsigned char>(text[j])))
      ++j;
    const std::string_view chunk = text.substr(i, j - i);
    i = j;
    if (chunk.size() > kMaxCachedChunk) {
      encode(chunk, piece_ids);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
      continue;
    }
    const uint64_t hash = xxh3_64(chunk.data(), chunk.size());
    std::span<const int> cached;
    if (cache.find(chunk, hash, &cached)) {
      ++cache.hits;
    } else {
      ++cache.misses;
      if (cache.size() >= kMaxCacheEntries) cache.clear();
      encode(chunk, piece_ids);
      cache.insert(chunk, hash, piece_ids);
      cached = piece_ids;
    }
    ids.insert(ids.end(), cached.begin(), cached.end());
  }
}

std::string SentencePieceModel::decode(std::span<const int> ids) const {
  std::string out;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto status = sp_.Decode(v, &out);
  if (!status.ok()) fail(ExitCode::kData, "tokenizer: decode failed: {}", status.ToString());
  return out;
}

void Tokenizer::encode(std::string_view text, std::vector<int>& ids) const {
  model_->encode(text, ids);
}
void Tokenizer::encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const {
  model_->encode(text, ids, cache);
}
std::string Tokenizer::decode(std::span<const int> ids) const {
  return model_->decode(ids);
}
std::string Tokenizer::piece(int id) const {
  return model_->piece(id);
}
std::optional<uint32_t> Tokenizer::piece_id(std::string_view piece) const {
  return model_->piece_id(piece);
}
uint32_t Tokenizer::vocab_size() const {
  return model_->vocab_size();
}
int Tokenizer::eos_id() const {
  return model_->eos_id();
}
bool Tokenizer::chunk_cache_usable() const {
  return model_->chunk_cache_usable();
}
std::string_view Tokenizer::file_name() const {
  return model_->file_name();
}

}  // namespace forge::data
