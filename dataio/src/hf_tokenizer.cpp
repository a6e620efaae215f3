// Hugging Face tokenizer.json: the BPE model with the pieces GPT-2, Llama 3 and Qwen2 (and Llama 2 style
// byte-fallback models) ship. The steps follow the tokenizers library: added tokens are cut out of the raw
// text (then of the normalized text), each remaining segment is normalized and pre-tokenized, and each
// pre-token ("word") is encoded by BPE on its own. Regular expressions run on PCRE2 (JIT, Unicode classes),
// normalization forms on ICU. test/dataio/reference/bpe_reference.py is the independent reference.
#include "hf_tokenizer.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <deque>
#include <unordered_map>

namespace forge::data::detail {
namespace {

// ---------------------------------------------------------------------------------------------- UTF-8

// The length of the valid UTF-8 sequence that starts `s` (n bytes left), or 0 when it is not one.
size_t utf8_len(const unsigned char* s, size_t n) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0)) return 0;  // overlong, surrogate
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90)) return 0;  // overlong, > U+10FFFF
    return 4;
  }
  return 0;
}

// `text` when it is valid UTF-8 (the usual case: prepare's ingest already repaired it), otherwise a copy
// in `buffer` with every invalid byte replaced by U+FFFD. The tokenizers library only takes Unicode strings,
// and PCRE2 matches with its UTF check off.
std::string_view valid_utf8(std::string_view text, std::string& buffer) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const size_t len = utf8_len(s + i, n - i);
    if (len == 0) break;
    i += len;
  }
  if (i == n) return text;
  buffer.assign(text.data(), i);
  while (i < n) {
    const size_t len = utf8_len(s + i, n - i);
    if (len == 0) {
      buffer += "\xEF\xBF\xBD";
      ++i;
    } else {
      buffer.append(text.data() + i, len);
      i += len;
    }
  }
  return buffer;
}

// The code point at s[i] (valid UTF-8), advancing i past it.
char32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t len = utf8_len(p, s.size() - i);
  char32_t c;
  switch (len) {
    case 1:
      c = p[0];
      break;
    case 2:
      c = (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu);
      break;
    case 3:
      c = (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
      break;
    case 4:
      c = (p[0] & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
      break;
    default:
      c = 0xFFFD;
      break;  // not reached on repaired text
  }
  i += std::max<size_t>(len, 1);
  return c;
}

// The code point that ends s[0, end).
char32_t code_point_before(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return next_code_point(s, b);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | c >> 6);
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | c >> 12);
    out += static_cast<char>(0x80 | (c >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | c >> 18);
    out += static_cast<char>(0x80 | (c >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (c >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Rust's char::is_whitespace (Unicode White_Space), which an added token's lstrip/rstrip strip.
bool is_white_space(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

// \w of the Rust regex crate (UTS #18 Annex C): what a single_word added token must not touch.
bool is_word_char(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 for U+0100 onwards, so every
// byte string is spelled in printable characters.
std::array<char32_t, 256> byte_chars() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? char32_t(b) : next++;
  return map;
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------- PCRE2

pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(32, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

// A compiled pattern. The tokenizers library compiles with Oniguruma's Ruby syntax, where ^ and $ match at
// line boundaries: PCRE2_MULTILINE keeps that.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& path, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                          &offset, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail(ExitCode::kData, "{}: {} pattern '{}' is not a regular expression PCRE2 accepts ({} at offset {})",
           path, where, pattern, reinterpret_cast<const char*>(message.data()), offset);
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s (valid UTF-8) at or after `from`, as [*begin, *end).
  bool find(std::string_view s, size_t from, size_t* begin, size_t* end) const {
    pcre2_match_data* md = thread_match_data();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), from, 0, md, nullptr)
                  : pcre2_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc ==
        PCRE2_ERROR_JIT_STACKLIMIT)  // a pathological input: the interpreter keeps its stack on the heap
      rc = pcre2_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      fail(ExitCode::kData, "tokenizer: pattern match failed: {}",
           reinterpret_cast<const char*>(message.data()));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    *begin = ov[0];
    *end = ov[1];
    return true;
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// Every match of `re` in s (empty matches included, as the library's find_iter gives them): appends
// [begin, end, is_match] spans covering s.
struct Span {
  size_t begin, end;
  bool match;
};
void match_spans(const Regex& re, std::string_view s, bool invert, std::vector<Span>& spans) {
  spans.clear();
  size_t at = 0, from = 0, b, e;
  while (from <= s.size() && re.find(s, from, &b, &e)) {
    if (b > at) spans.push_back({at, b, invert});
    spans.push_back({b, e, !invert});
    at = e;
    if (e > b) {
      from = e;
    } else {  // an empty match: the next search starts one character on
      if (e >= s.size()) break;
      from = e;
      next_code_point(s, from);
    }
  }
  if (at < s.size()) spans.push_back({at, s.size(), invert});
}

// ---------------------------------------------------------------------------------------------- steps

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_of(const std::string& name, const std::string& path) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail(ExitCode::kData,
       "{}: pre_tokenizer Split behavior '{}' is not supported (supported: Removed, Isolated, "
       "MergedWithPrevious, "
       "MergedWithNext, Contiguous)",
       path, name);
}

// The library's NormalizedString::split: spans folded by the behavior, empty pieces dropped.
void split_pieces(std::string_view s, const std::vector<Span>& spans, Behavior behavior,
                  std::vector<std::string_view>& out) {
  const auto put = [&](size_t b, size_t e) { out.push_back(s.substr(b, e - b)); };
  const size_t first = out.size();
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& sp : spans) put(sp.begin, sp.end);
      break;
    case Behavior::kRemoved:
      for (const Span& sp : spans)
        if (!sp.match) put(sp.begin, sp.end);
      break;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      bool prev = false;
      for (const Span& sp : spans) {
        const bool join = behavior == Behavior::kContiguous ? sp.match == prev : sp.match && !prev;
        if (join && out.size() > first) {
          std::string_view& last = out.back();
          last = std::string_view(last.data(), s.data() + sp.end - last.data());
        } else {
          put(sp.begin, sp.end);
        }
        prev = sp.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& sp = spans[k];
        if (sp.match && !prev && out.size() > first) {
          std::string_view& last = out.back();
          last = std::string_view(s.data() + sp.begin, last.data() + last.size() - (s.data() + sp.begin));
        } else {
          put(sp.begin, sp.end);
        }
        prev = sp.match;
      }
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      break;
    }
  }
  out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [](std::string_view v) { return v.empty(); }),
            out.end());
}

struct NormalizerStep {
  enum Kind { kUnicode, kPrepend, kReplace } kind = kUnicode;
  const icu::Normalizer2* unicode = nullptr;
  std::string text;              // Prepend: what is prepended; Replace: the replacement
  std::string literal;           // Replace with a String pattern
  std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
};

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::unique_ptr<Regex> regex;  // Split, Digits; ByteLevel with use_regex: GPT-2's pattern
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip } kind = kByteLevel;
  std::string from, to;          // Replace (a String pattern)
  std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
  char32_t strip = 0;            // Strip
  size_t start = 0, stop = 0;
};

// Replaces every match of `literal` (or `regex`) in `in` by `with`, into `out`.
void replace_all(std::string_view in, const std::string& literal, const Regex* regex, const std::string& with,
                 std::string& out) {
  out.clear();
  size_t at = 0;
  if (regex) {
    size_t b, e, from = 0;
    while (from <= in.size() && regex->find(in, from, &b, &e)) {
      out.append(in.substr(at, b - at)).append(with);
      at = e;
      from = e;
      if (e == b) {
        if (e >= in.size()) break;
        next_code_point(in, from);
        out.append(in.substr(e, from - e));
        at = from;
      }
    }
  } else if (!literal.empty()) {
    for (size_t hit; (hit = in.find(literal, at)) != std::string_view::npos; at = hit + literal.size())
      out.append(in.substr(at, hit - at)).append(with);
  }
  out.append(in.substr(at));
}

// Open addressing from a pair of ids to (rank, merged id): one probe per adjacent pair during BPE.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int rank = 0, id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Entry{});
    shift_ = 64 - static_cast<int>(std::countr_zero(cap));
  }
  // False when the pair is already there (the lower rank stays, as the first of duplicated merges).
  bool insert(int a, int b, int rank, int id) {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return false;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, id};
        ++size_;
        return true;
      }
    }
  }
  const Entry* find(int a, int b) const {
    if (size_ == 0) return nullptr;
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t pack(int a, int b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Entry> slots_;
  int shift_ = 60;
  size_t size_ = 0;
};

struct AddedToken {
  int id = 0;
  std::string content;  // for a normalized token: its normalized form, which is what the text is searched for
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// A piece of text between added tokens (id -1), or an added token.
struct Segment {
  int id;
  size_t begin, end;
};

// The added tokens of one kind (normalized or not), found leftmost-longest as the library's Aho-Corasick
// automaton finds them, with its single_word, lstrip and rstrip rules.
class AddedMatcher {
 public:
  void add(const AddedToken* t) {
    if (t->content.empty()) return;
    if (nodes_.empty()) nodes_.emplace_back();
    int node = 0;
    for (const char c : t->content) {
      const unsigned char b = static_cast<unsigned char>(c);
      int child = nodes_[node].child(b);
      if (child < 0) {
        child = static_cast<int>(nodes_.size());
        auto& edges = nodes_[node].edges;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::pair{b, 0}), {b, child});
        nodes_.emplace_back();
      }
      node = child;
    }
    if (!nodes_[node].token) nodes_[node].token = t;  // the first of equal contents, as the library keeps
    starts_[static_cast<unsigned char>(t->content[0])] = true;
  }

  void split(std::string_view s, std::vector<Segment>& out) const {
    out.clear();
    size_t at = 0;  // the end of the last token (and of the whitespace it stripped)
    for (size_t pos = 0; !nodes_.empty() && pos < s.size();) {
      if (!starts_[static_cast<unsigned char>(s[pos])]) {
        ++pos;
        continue;
      }
      // The longest token starting here: a walk down the trie.
      const AddedToken* hit = nullptr;
      for (size_t k = pos, node = 0; k < s.size();) {
        const int child = nodes_[node].child(static_cast<unsigned char>(s[k++]));
        if (child < 0) break;
        node = static_cast<size_t>(child);
        if (nodes_[node].token) hit = nodes_[node].token;
      }
      if (!hit) {
        ++pos;
        continue;
      }
      size_t begin = pos, end = pos + hit->content.size();
      pos = end;
      if (hit->single_word) {  // a rejected match is passed over, as the automaton's iterator does
        size_t k = end;
        if ((begin > 0 && is_word_char(code_point_before(s, begin))) ||
            (end < s.size() && is_word_char(next_code_point(s, k))))
          continue;
      }
      if (hit->lstrip)
        while (begin > at && is_white_space(code_point_before(s, begin))) {
          --begin;
          while (begin > at && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
        }
      if (hit->rstrip)
        for (size_t k = end; k < s.size();) {
          if (!is_white_space(next_code_point(s, k))) break;
          end = k;
        }
      if (begin > at) out.push_back({-1, at, begin});
      out.push_back({hit->id, begin, end});
      at = pos = end;
    }
    if (at < s.size() || out.empty()) out.push_back({-1, at, s.size()});
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> edges;  // sorted by byte
    const AddedToken* token = nullptr;                 // the token that ends here
    int child(unsigned char b) const {
      const auto it = std::lower_bound(edges.begin(), edges.end(), std::pair{b, 0});
      return it != edges.end() && it->first == b ? it->second : -1;
    }
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> starts_{};  // bytes some token starts with
};

// Per-thread buffers: encode is const and runs on many threads at once.
struct Scratch {
  std::string repaired, normalized, tmp, mapped;
  std::vector<Segment> raw, norm;
  std::vector<std::string_view> pieces, next;
  std::vector<Span> spans;
  std::deque<std::string> owned;  // pieces a ByteLevel prefix space made (a deque keeps them in place)
  std::vector<int> symbols;
  struct Symbol {
    int id, prev, next;
  };
  std::vector<Symbol> word;
  struct Candidate {
    int rank, pos, id;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// ---------------------------------------------------------------------------------------------- model

class HfTokenizer final : public TokenizerModel {
 public:
  HfTokenizer(const std::string& path, const Json& j);

  void encode(std::string_view text, std::vector<int>& ids) const override { run(text, ids, nullptr); }
  void encode(std::string_view text, std::vector<int>& ids, EncodeCache& cache) const override {
    run(text, ids, &cache);
  }
  std::string decode(std::span<const int> ids) const override;
  std::string piece(int id) const override {
    return id >= 0 && static_cast<size_t>(id) < pieces_.size() ? pieces_[id] : std::string();
  }
  // An added token's content first, then the vocabulary, as the library's token_to_id.
  std::optional<uint32_t> piece_id(std::string_view piece) const override {
    if (const auto it = added_ids_.find(piece); it != added_ids_.end())
      return static_cast<uint32_t>(it->second);
    if (const int id = lookup(piece); id >= 0) return static_cast<uint32_t>(id);
    return std::nullopt;
  }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(pieces_.size()); }
  int eos_id() const override { return eos_id_; }
  bool chunk_cache_usable() const override { return true; }
  std::string_view file_name() const override { return "tokenizer.json"; }

 private:
  void parse_normalizer(const Json& n);
  void parse_pre_tokenizer(const Json& p);
  void parse_decoder(const Json& d);
  void parse_model(const Json& m);
  void parse_added(const Json& a);
  void find_eos(const Json& post_processor);

  void normalize(std::string_view in, std::string& out) const;
  void pre_tokenize(std::string_view segment, Scratch& s) const;
  void run(std::string_view text, std::vector<int>& ids, EncodeCache* cache) const;
  void encode_word(std::string_view word, std::vector<int>& ids) const;
  void symbols_of(std::string_view word, std::vector<int>& out) const;
  void merge(std::vector<int>& symbols, std::vector<int>& ids) const;
  int lookup(std::string_view piece) const {
    const auto it = vocab_.find(piece);
    return it == vocab_.end() ? -1 : it->second;
  }

  std::string path_;
  std::unordered_map<std::string, int, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> pieces_;  // by id: the vocabulary's spelling, an added token's content
  MergeTable merges_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int, StringHash, std::equal_to<>> added_ids_;  // by content as written
  AddedMatcher raw_added_, normalized_added_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  bool has_decoder_ = false;
  std::vector<std::string> byte_level_decoded_;  // by id, when the decoder is ByteLevel alone

  // The last pre-tokenizer is ByteLevel: words reach the model spelled in GPT-2's byte alphabet.
  bool byte_level_ = false;
  std::array<std::string, 256> byte_spelling_;  // UTF-8 of each byte's character
  std::array<int, 256> byte_ids_{};             // the vocabulary id of each byte's character, or -1
  bool all_bytes_ = false;                      // every byte's character is in the vocabulary
  std::array<int, 256> fallback_ids_{};         // ids of <0x00>..<0xFF>, or -1
  bool byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  int unk_id_ = -1;
  int eos_id_ = -1;
};

std::string type_of(const Json& j, const std::string& path, const char* what) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail(ExitCode::kData, "{}: {} has no \"type\"", path, what);
  return j["type"].get<std::string>();
}

void HfTokenizer::parse_normalizer(const Json& n) {
  if (n.is_null()) return;
  const std::string type = type_of(n, path_, "a normalizer");
  UErrorCode status = U_ZERO_ERROR;
  NormalizerStep step;
  if (type == "Sequence") {
    for (const Json& sub : n.at("normalizers")) parse_normalizer(sub);
    return;
  } else if (type == "NFC") {
    step.unicode = icu::Normalizer2::getNFCInstance(status);
  } else if (type == "NFD") {
    step.unicode = icu::Normalizer2::getNFDInstance(status);
  } else if (type == "NFKC") {
    step.unicode = icu::Normalizer2::getNFKCInstance(status);
  } else if (type == "NFKD") {
    step.unicode = icu::Normalizer2::getNFKDInstance(status);
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::kPrepend;
    step.text = n.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = NormalizerStep::kReplace;
    step.text = n.at("content").get<std::string>();
    const Json& pattern = n.at("pattern");
    if (pattern.contains("String"))
      step.literal = pattern["String"].get<std::string>();
    else
      step.regex =
          std::make_unique<Regex>(pattern.at("Regex").get<std::string>(), false, path_, "normalizer Replace");
  } else {
    fail(ExitCode::kData,
         "{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
         "Sequence)",
         path_, type);
  }
  if (U_FAILURE(status))
    fail(ExitCode::kData, "{}: ICU has no {} normalizer ({})", path_, type, u_errorName(status));
  normalizer_.push_back(std::move(step));
}

void HfTokenizer::parse_pre_tokenizer(const Json& p) {
  if (p.is_null()) return;
  const std::string type = type_of(p, path_, "a pre_tokenizer");
  if (type == "Sequence") {
    for (const Json& sub : p.at("pretokenizers")) parse_pre_tokenizer(sub);
    return;
  }
  // The byte-level spelling is applied when words reach the model, so nothing may split after it.
  if (byte_level_)
    fail(ExitCode::kData, "{}: pre_tokenizer {} after ByteLevel is not supported (ByteLevel must come last)",
         path_, type);
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = p.value("add_prefix_space", true);
    if (p.value("use_regex", true))
      step.regex = std::make_unique<Regex>(kGpt2Pattern, false, path_, "ByteLevel");
    byte_level_ = true;
  } else if (type == "Split") {
    const Json& pattern = p.at("pattern");
    if (pattern.contains("String"))
      step.regex =
          std::make_unique<Regex>(pattern["String"].get<std::string>(), true, path_, "pre_tokenizer Split");
    else
      step.regex = std::make_unique<Regex>(pattern.at("Regex").get<std::string>(), false, path_,
                                           "pre_tokenizer Split");
    step.behavior = behavior_of(p.at("behavior").get<std::string>(), path_);
    step.invert = p.value("invert", false);
  } else if (type == "Digits") {
    // char::is_numeric is the Unicode N category.
    step.regex = std::make_unique<Regex>(R"(\p{N})", false, path_, "Digits");
    step.behavior = p.value("individual_digits", false) ? Behavior::kIsolated : Behavior::kContiguous;
  } else {
    fail(ExitCode::kData,
         "{}: pre_tokenizer type '{}' is not supported (supported: ByteLevel, Split, Sequence, Digits)",
         path_, type);
  }
  pre_tokenizer_.push_back(std::move(step));
}

void HfTokenizer::parse_decoder(const Json& d) {
  if (d.is_null()) return;
  has_decoder_ = true;
  const std::string type = type_of(d, path_, "a decoder");
  DecoderStep step;
  if (type == "Sequence") {
    for (const Json& sub : d.at("decoders")) parse_decoder(sub);
    return;
  } else if (type == "ByteLevel") {
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::kStrip;
    const std::string content = d.at("content").get<std::string>();
    size_t k = 0;
    if (content.empty() || (step.strip = next_code_point(content, k), k != content.size()))
      fail(ExitCode::kData, "{}: decoder Strip content '{}' must be one character", path_, content);
    step.start = d.at("start").get<size_t>();
    step.stop = d.at("stop").get<size_t>();
  } else if (type == "Replace") {
    step.kind = DecoderStep::kReplace;
    step.to = d.at("content").get<std::string>();
    const Json& pattern = d.at("pattern");
    if (pattern.contains("String"))
      step.from = pattern["String"].get<std::string>();
    else
      step.regex =
          std::make_unique<Regex>(pattern.at("Regex").get<std::string>(), false, path_, "decoder Replace");
  } else {
    fail(ExitCode::kData,
         "{}: decoder type '{}' is not supported (supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, "
         "Sequence)",
         path_, type);
  }
  decoder_.push_back(std::move(step));
}

void HfTokenizer::parse_model(const Json& m) {
  if (!m.is_object()) fail(ExitCode::kData, "{}: \"model\" is not an object", path_);
  const std::string type = m.value("type", "BPE");  // files from before tagged models are BPE
  if (type != "BPE")
    fail(ExitCode::kData, "{}: model type '{}' is not supported (supported: BPE)", path_, type);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() && m[key] != "")
      fail(ExitCode::kData, "{}: model.{} '{}' is not supported (only null or empty)", path_, key,
           m[key].get<std::string>());
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    fail(ExitCode::kData, "{}: model.dropout {} is not supported: encoding must be deterministic", path_,
         m["dropout"].dump());
  byte_fallback_ = m.value("byte_fallback", false);
  ignore_merges_ = m.value("ignore_merges", false);
  fuse_unk_ = m.value("fuse_unk", false);

  constexpr int kMaxId = 1 << 24;
  int max_id = -1;
  for (const auto& [piece, id_json] : m.at("vocab").items()) {
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= kMaxId)
      fail(ExitCode::kData, "{}: model.vocab '{}' has id {}, outside [0, {})", path_, piece, id, kMaxId);
    vocab_.emplace(piece, static_cast<int>(id));
    max_id = std::max(max_id, static_cast<int>(id));
  }
  pieces_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [piece, id] : vocab_) pieces_[id] = piece;

  const Json& merges = m.at("merges");
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& merge = merges[rank];
    std::string a, b;
    if (merge.is_string()) {  // "a b": the older format, exactly one space
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail(ExitCode::kData, "{}: model.merges[{}] '{}' is not two pieces separated by one space", path_,
             rank, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      fail(ExitCode::kData, "{}: model.merges[{}] is neither \"a b\" nor [a, b]", path_, rank);
    }
    const int ia = lookup(a), ib = lookup(b), ic = lookup(a + b);
    for (const auto& [piece, id] : {std::pair{a, ia}, std::pair{b, ib}, std::pair{a + b, ic}})
      if (id < 0)
        fail(ExitCode::kData, "{}: model.merges[{}] ('{}' '{}'): '{}' is not in the vocabulary", path_, rank,
             a, b, piece);
    merges_.insert(ia, ib, static_cast<int>(rank), ic);
  }

  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = m["unk_token"].get<std::string>();
    unk_id_ = lookup(unk);
    if (unk_id_ < 0) fail(ExitCode::kData, "{}: model.unk_token '{}' is not in the vocabulary", path_, unk);
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    fallback_ids_[b] = lookup(name);
  }
}

void HfTokenizer::parse_added(const Json& a) {
  if (a.is_null()) return;
  for (const Json& t : a) {
    AddedToken tok;
    const int64_t id = t.at("id").get<int64_t>();
    if (id < 0 || id >= (1 << 24)) fail(ExitCode::kData, "{}: added token id {} is out of range", path_, id);
    tok.id = static_cast<int>(id);
    tok.content = t.at("content").get<std::string>();
    tok.special = t.value("special", false);
    tok.single_word = t.value("single_word", false);
    tok.lstrip = t.value("lstrip", false);
    tok.rstrip = t.value("rstrip", false);
    tok.normalized = t.value("normalized", !tok.special);
    added_.push_back(std::move(tok));
  }
  for (AddedToken& t : added_) {
    if (static_cast<size_t>(t.id) >= pieces_.size()) pieces_.resize(static_cast<size_t>(t.id) + 1);
    pieces_[t.id] = t.content;
    added_ids_.emplace(t.content, t.id);
    // The library searches the normalized text for a normalized token's normalized content.
    if (t.normalized && !normalizer_.empty()) {
      std::string normalized;
      normalize(t.content, normalized);
      t.content = std::move(normalized);
    }
  }
  for (const AddedToken& t : added_) (t.normalized ? normalized_added_ : raw_added_).add(&t);
}

// The end-of-sequence token (see Tokenizer::eos_id in forge/dataio/tokenizer.h).
void HfTokenizer::find_eos(const Json& post) {
  const auto template_eos = [&](const Json& p, const auto& self) -> int {
    if (!p.is_object()) return -1;
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("processors")) {
      for (const Json& sub : p["processors"])
        if (const int id = self(sub, self); id >= 0) return id;
      return -1;
    }
    if (type != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array() ||
        p["single"].empty())
      return -1;
    const Json& last = p["single"].back();
    if (!last.contains("SpecialToken")) return -1;
    const std::string name = last["SpecialToken"].value("id", "");
    const Json& specials = p.value("special_tokens", Json::object());
    if (specials.contains(name) && specials[name].contains("ids") && !specials[name]["ids"].empty())
      return specials[name]["ids"][0].get<int>();
    const auto id = piece_id(name);
    return id ? static_cast<int>(*id) : -1;
  };
  eos_id_ = template_eos(post, template_eos);
  if (eos_id_ >= 0) return;
  static constexpr const char* kNames[] = {"<|endoftext|>", "<|end_of_text|>", "</s>",   "<eos>",
                                           "<|im_end|>",    "<|eot_id|>",      "<|end|>"};
  for (const char* name : kNames)
    if (const auto it = added_ids_.find(std::string_view(name)); it != added_ids_.end()) {
      eos_id_ = it->second;
      return;
    }
  for (const char* name : kNames)  // a file that lists its specials only in the vocabulary
    if ((eos_id_ = lookup(name)) >= 0) return;
}

HfTokenizer::HfTokenizer(const std::string& path, const Json& j) : path_(path) {
  try {
    parse_normalizer(j.value("normalizer", Json()));
    parse_pre_tokenizer(j.value("pre_tokenizer", Json()));
    parse_decoder(j.value("decoder", Json()));
    parse_model(j.at("model"));
    parse_added(j.value("added_tokens", Json()));
    find_eos(j.value("post_processor", Json()));
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: malformed tokenizer.json ({})", path, e.what());
  }
  const auto chars = byte_chars();
  all_bytes_ = true;
  for (int b = 0; b < 256; ++b) {
    append_utf8(byte_spelling_[b], chars[b]);
    byte_ids_[b] = lookup(byte_spelling_[b]);
    all_bytes_ = all_bytes_ && byte_ids_[b] >= 0;
  }
  if (decoder_.size() == 1 && decoder_[0].kind == DecoderStep::kByteLevel) {
    // The decoder maps each token on its own: precompute what every id decodes to.
    std::array<int, 0x144> byte_of;
    byte_of.fill(-1);
    for (int b = 0; b < 256; ++b) byte_of[chars[b]] = b;
    byte_level_decoded_.resize(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); ++id) {
      const std::string& p = pieces_[id];
      std::string& out = byte_level_decoded_[id];
      for (size_t k = 0; k < p.size();) {
        const char32_t c = next_code_point(p, k);
        if (c >= byte_of.size() || byte_of[c] < 0) {
          out = p;  // a character outside the byte alphabet: the token stands for its own UTF-8
          break;
        }
        out += static_cast<char>(byte_of[c]);
      }
    }
  }
}

void HfTokenizer::normalize(std::string_view in, std::string& out) const {
  out.assign(in);
  Scratch& s = scratch();
  for (const NormalizerStep& step : normalizer_) {
    switch (step.kind) {
      case NormalizerStep::kUnicode: {
        // ASCII is invariant under every normalization form.
        if (std::all_of(out.begin(), out.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
          break;
        UErrorCode status = U_ZERO_ERROR;
        if (step.unicode->isNormalizedUTF8(icu::StringPiece(out.data(), static_cast<int32_t>(out.size())),
                                           status))
          break;
        status = U_ZERO_ERROR;
        s.tmp.clear();
        icu::StringByteSink<std::string> sink(&s.tmp);
        step.unicode->normalizeUTF8(0, icu::StringPiece(out.data(), static_cast<int32_t>(out.size())), sink,
                                    nullptr, status);
        if (U_FAILURE(status))
          fail(ExitCode::kData, "tokenizer: normalization failed ({})", u_errorName(status));
        out.swap(s.tmp);
        break;
      }
      case NormalizerStep::kPrepend:
        if (!out.empty()) out.insert(0, step.text);
        break;
      case NormalizerStep::kReplace:
        replace_all(out, step.literal, step.regex.get(), step.text, s.tmp);
        out.swap(s.tmp);
        break;
    }
  }
}

void HfTokenizer::pre_tokenize(std::string_view segment, Scratch& s) const {
  s.pieces.clear();
  s.pieces.push_back(segment);
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    s.next.clear();
    for (std::string_view piece : s.pieces) {
      if (step.kind == PreTokenizerStep::kByteLevel && step.add_prefix_space && piece.front() != ' ')
        piece = s.owned.emplace_back(" ").append(piece);
      if (!step.regex) {
        s.next.push_back(piece);
        continue;
      }
      match_spans(*step.regex, piece, step.invert, s.spans);
      split_pieces(piece, s.spans, step.behavior, s.next);
    }
    s.pieces.swap(s.next);
  }
}

void HfTokenizer::run(std::string_view text, std::vector<int>& ids, EncodeCache* cache) const {
  constexpr size_t kMaxCachedWord = 64;
  constexpr size_t kMaxCacheEntries = 1 << 20;  // bounds memory on corpora with huge vocabularies of words
  ids.clear();
  Scratch& s = scratch();
  s.owned.clear();
  const std::string_view view = valid_utf8(text, s.repaired);
  raw_added_.split(view, s.raw);
  for (const Segment& raw : s.raw) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string_view segment = view.substr(raw.begin, raw.end - raw.begin);
    if (!normalizer_.empty()) {
      normalize(segment, s.normalized);
      segment = s.normalized;
    }
    normalized_added_.split(segment, s.norm);
    for (const Segment& norm : s.norm) {
      if (norm.id >= 0) {
        ids.push_back(norm.id);
        continue;
      }
      if (norm.end == norm.begin) continue;
      pre_tokenize(segment.substr(norm.begin, norm.end - norm.begin), s);
      for (const std::string_view word : s.pieces) {
        if (!cache || word.size() > kMaxCachedWord) {
          encode_word(word, ids);
          continue;
        }
        const uint64_t hash = xxh3_64(word.data(), word.size());
        std::span<const int> cached;
        if (cache->find(word, hash, &cached)) {
          ++cache->hits;
          ids.insert(ids.end(), cached.begin(), cached.end());
          continue;
        }
        ++cache->misses;
        if (cache->size() >= kMaxCacheEntries) cache->clear();
        const size_t at = ids.size();
        encode_word(word, ids);
        cache->insert(word, hash, std::span<const int>(ids.data() + at, ids.size() - at));
      }
    }
  }
}

// The library's BPE::merge_word: the word's characters (or their <0xXX> bytes, or the unknown token), then
// merge_all.
void HfTokenizer::encode_word(std::string_view word, std::vector<int>& ids) const {
  Scratch& s = scratch();
  std::string_view spelled = word;
  if (byte_level_ && (ignore_merges_ || !all_bytes_)) {
    s.mapped.clear();
    for (const char c : word) s.mapped += byte_spelling_[static_cast<unsigned char>(c)];
    spelled = s.mapped;
  }
  if (ignore_merges_)
    if (const int id = lookup(spelled); id >= 0) {
      ids.push_back(id);
      return;
    }
  s.symbols.clear();
  if (byte_level_ && all_bytes_)
    for (const char c : word) s.symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
  else
    symbols_of(spelled, s.symbols);
  merge(s.symbols, ids);
}

void HfTokenizer::symbols_of(std::string_view word, std::vector<int>& out) const {
  bool unk_pending = false;
  for (size_t k = 0; k < word.size();) {
    const size_t at = k;
    next_code_point(word, k);
    const std::string_view ch = word.substr(at, k - at);
    if (const int id = lookup(ch); id >= 0) {
      if (unk_pending) out.push_back(unk_id_);
      unk_pending = false;
      out.push_back(id);
      continue;
    }
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return fallback_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      // As the library does, a pending unknown token stays pending across byte pieces.
      for (const char c : ch) out.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_id_ < 0) continue;  // no unknown token: the library drops the character
    if (unk_pending && !fuse_unk_) out.push_back(unk_id_);
    unk_pending = true;
  }
  if (unk_pending) out.push_back(unk_id_);
}

// The library's Word::merge_all: the lowest-ranked adjacent pair first (the leftmost among equals), over a
// linked list of symbols and a heap of candidate pairs.
void HfTokenizer::merge(std::vector<int>& symbols, std::vector<int>& ids) const {
  const int n = static_cast<int>(symbols.size());
  if (n < 2 || merges_.size() == 0) {
    ids.insert(ids.end(), symbols.begin(), symbols.end());
    return;
  }
  Scratch& s = scratch();
  auto& word = s.word;
  auto& heap = s.heap;
  word.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) word[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1};
  heap.clear();
  const auto consider = [&](int i) {
    const int j = word[i].next;
    if (j < 0) return;
    if (const auto* m = merges_.find(word[i].id, word[j].id)) {
      heap.push_back({m->rank, i, m->id});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    auto& left = word[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    const int j = left.next;
    const auto* m = merges_.find(left.id, word[j].id);
    if (!m || m->id != c.id) continue;  // an entry made stale by an earlier merge
    left.id = c.id;
    word[j].id = -1;
    left.next = word[j].next;
    if (left.next >= 0) word[left.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = word[i].next) ids.push_back(word[i].id);
}

std::string HfTokenizer::decode(std::span<const int> ids) const {
  for (const int id : ids)
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size())
      fail(ExitCode::kData, "tokenizer: id {} is outside the vocabulary (size {})", id, pieces_.size());
  std::string out;
  if (!byte_level_decoded_.empty()) {
    for (const int id : ids) out += byte_level_decoded_[id];
    return out;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int id : ids) tokens.push_back(pieces_[id]);
  if (!has_decoder_) {  // the library joins the pieces with spaces
    for (size_t k = 0; k < tokens.size(); ++k) (out += k ? " " : "") += tokens[k];
    return out;
  }
  const auto chars = byte_chars();
  std::string tmp;
  for (const DecoderStep& step : decoder_) {
    std::vector<std::string> next;
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          const size_t at = bytes.size();
          bool all = true;
          for (size_t k = 0; k < t.size() && all;) {
            const char32_t c = next_code_point(t, k);
            const auto* hit = std::find(chars.begin(), chars.end(), c);
            if (hit == chars.end())
              all = false;
            else
              bytes += static_cast<char>(hit - chars.begin());
          }
          if (!all) {  // a token outside the byte alphabet (an added token) stands for its own UTF-8
            bytes.resize(at);
            bytes += t;
          }
        }
        next.push_back(std::move(bytes));
        break;
      }
      case DecoderStep::kReplace:
        for (const std::string& t : tokens) {
          replace_all(t, step.from, step.regex.get(), step.to, tmp);
          next.push_back(tmp);
        }
        break;
      case DecoderStep::kByteFallback: {
        std::string pending;
        const auto flush = [&] {
          if (pending.empty()) return;
          std::string repaired;
          if (valid_utf8(pending, repaired).data() == pending.data())
            next.push_back(pending);
          else
            for (size_t k = 0; k < pending.size(); ++k) next.push_back("\xEF\xBF\xBD");
          pending.clear();
        };
        for (const std::string& t : tokens) {
          const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
          if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) && hex(t[4])) {
            pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecoderStep::kStrip:
        for (const std::string& t : tokens) {
          size_t b = 0, e = t.size();
          for (size_t n = 0; n < step.start && b < e;) {
            size_t k = b;
            if (next_code_point(t, k) != step.strip) break;
            b = k;
            ++n;
          }
          for (size_t n = 0; n < step.stop && e > b; ++n) {
            if (code_point_before(t, e) != step.strip) break;
            size_t k = e - 1;
            while (k > b && (static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) --k;
            e = k;
          }
          next.push_back(t.substr(b, e - b));
        }
        break;
    }
    tokens.swap(next);
  }
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace

bool looks_like_json(std::string_view bytes) {
  if (bytes.starts_with("\xEF\xBB\xBF")) bytes.remove_prefix(3);  // a UTF-8 byte order mark
  const size_t at = bytes.find_first_not_of(" \t\r\n");
  return at != std::string_view::npos && bytes[at] == '{';
}

std::unique_ptr<TokenizerModel> load_hf_tokenizer(const std::string& path, std::string_view bytes) {
  Json j;
  try {
    j = Json::parse(bytes);
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: not a SentencePiece model, and not valid JSON for a tokenizer.json ({})", path,
         e.what());
  }
  if (!j.is_object() || !j.contains("model"))
    fail(ExitCode::kData, "{}: a JSON file without a \"model\" member is not a Hugging Face tokenizer.json",
         path);
  return std::make_unique<HfTokenizer>(path, j);
}

}  // namespace forge::data::detail
