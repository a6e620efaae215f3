// Helpers shared by the chat and preference tests: random words, decoding a dataset's documents with their
// masks, error expectations and a tokenizer without the chat markers.
#pragma once

#include "forge/common/error.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "support/temp_dir.h"

#include <sentencepiece_trainer.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::test::chat {

using namespace forge::data;
namespace fs = std::filesystem;

inline ChatMessage msg(ChatRole role, std::string content) {
  return {role, std::move(content)};
}

inline size_t count_of(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

inline size_t markers_in(std::string_view text) {
  size_t n = 0;
  for (const auto m : kChatMarkers) n += count_of(text, m);
  return n;
}

inline std::string words(std::mt19937& rng, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string w;
    for (uint32_t x = rng() % 3000 + 1; x > 0; x /= 26) w.push_back(static_cast<char>('a' + x % 26));
    if (i > 0) out += (i % 9 == 0) ? ".\n" : " ";
    out += w;
  }
  return out;
}

// Every document of the dataset, in manifest order: ids (end-of-sequence included) and mask.
struct Doc {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
};
inline std::vector<Doc> read_docs(const std::string& dir) {
  const Manifest m = load_manifest(dir);
  std::vector<Doc> docs;
  for (const auto& e : m.shards) {
    const ShardData data = read_shard((fs::path(dir) / e.file).string());
    REQUIRE(data.loss_mask.size() == data.tokens.size());
    for (size_t d = 0; d + 1 < data.doc_offsets.size(); ++d) {
      const auto a = static_cast<std::ptrdiff_t>(data.doc_offsets[d]),
                 b = static_cast<std::ptrdiff_t>(data.doc_offsets[d + 1]);
      docs.push_back({{data.tokens.begin() + a, data.tokens.begin() + b},
                      {data.loss_mask.begin() + a, data.loss_mask.begin() + b}});
    }
  }
  return docs;
}

// Two preparations of the same records (the built-in template and a model's, say) gave the same
// documents, ids and masks, and the same shard bytes.
inline void check_same_documents(const std::string& want_dir, const std::string& got_dir) {
  const std::vector<Doc> want = read_docs(want_dir), got = read_docs(got_dir);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("document " << i);
    CHECK(got[i].ids == want[i].ids);
    CHECK(got[i].mask == want[i].mask);
  }
  const Manifest a = load_manifest(want_dir), b = load_manifest(got_dir);
  REQUIRE(a.shards.size() == b.shards.size());
  for (size_t i = 0; i < a.shards.size(); ++i) CHECK(a.shards[i].xxh3 == b.shards[i].xxh3);
}

inline std::string decode(const Tokenizer& tok, std::span<const uint32_t> ids) {
  const std::vector<int> v(ids.begin(), ids.end());
  return tok.decode(v);
}

// Decodes the tokens whose mask equals `value` (runs decoded separately: runs end at markers).
inline std::string decode_masked(const Tokenizer& tok, const Doc& d, uint8_t value, size_t n) {
  std::string out;
  for (size_t a = 0; a < n;) {
    size_t b = a;
    while (b < n && d.mask[b] == d.mask[a]) ++b;
    if (d.mask[a] == value) out += decode(tok, std::span<const uint32_t>(d.ids.data() + a, b - a));
    a = b;
  }
  return out;
}

inline void expect_error(forge::ExitCode code, const std::function<void()>& f,
                         const std::vector<std::string>& needles) {
  try {
    f();
    FAIL("no error");
  } catch (const forge::Error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
    for (const auto& n : needles) CHECK(std::string(e.what()).find(n) != std::string::npos);
  }
}

// A SentencePiece model like prepare's but without the chat markers (e.g. from an older release).
inline std::string model_without_markers(const forge::test::TempDir& tmp) {
  std::string text;
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) text += words(rng, 20) + "\n";
  tmp.write("plain.txt", text);
  const std::string args = "--input=" + (tmp / "plain.txt") + " --model_prefix=" + (tmp / "plain") +
                           " --vocab_size=300 --model_type=bpe --byte_fallback=true "
                           "--normalization_rule_name=identity --add_dummy_prefix=false --minloglevel=2";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return tmp / "plain.model";
}

}  // namespace forge::test::chat
