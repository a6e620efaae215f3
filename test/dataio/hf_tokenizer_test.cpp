// Hugging Face tokenizer.json support (dataio/src/hf_tokenizer.cpp) against the independent Python
// reference's fixtures (test/dataio/reference/bpe_reference.py, test/dataio/fixtures/hf_tokenizers/):
// GPT-2, Llama 3 and Qwen2 style byte-level BPE and a Llama 2 style byte-fallback BPE, on a Unicode corpus.
// Then hand-made files for the pieces the fixtures do not reach, the refusals, and prepare end to end.
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "forge/dataio/verify.h"
#include "support/paths.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <random>
#include <thread>

using namespace forge::data;
using forge::Json;

namespace {

std::string fixture(const std::string& name) {
  return forge::test::source_path("test/dataio/fixtures/hf_tokenizers/" + name);
}

std::vector<std::string> cases() {
  return forge::read_json(fixture("cases.json")).get<std::vector<std::string>>();
}

std::vector<std::string> pieces(const Tokenizer& t, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (const int id : ids) out.push_back(t.piece(id));
  return out;
}

std::vector<int> encode(const Tokenizer& t, const std::string& text) {
  std::vector<int> ids;
  t.encode(text, ids);
  return ids;
}

int id_of(const Tokenizer& t, const std::string& piece) {
  const auto id = t.piece_id(piece);
  REQUIRE(id);
  return static_cast<int>(*id);
}

// GPT-2's byte alphabet spelling of plain ASCII text: a space is U+0120.
std::string bl(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == ' ' ? "\xC4\xA0" : std::string(1, c);
  return out;
}

// A small tokenizer.json around `model` with the given pipeline pieces (null when empty).
std::string tokenizer_json(const Json& model, const Json& pre_tokenizer = nullptr,
                           const Json& normalizer = nullptr, const Json& decoder = nullptr,
                           const Json& added = Json::array()) {
  return Json{{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", normalizer},
              {"pre_tokenizer", pre_tokenizer},
              {"post_processor", nullptr},
              {"decoder", decoder},
              {"model", model}}
      .dump();
}

Json byte_level(bool use_regex) {
  return {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// A byte-level model: the 256 byte characters (ids 0-255 in byte order) plus `extra` pieces and merges.
Json byte_model(const std::vector<std::string>& extra = {}, const Json& merges = Json::array()) {
  Json vocab = Json::object();
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    // GPT-2's bytes_to_unicode, spelled out here independently of the implementation.
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t c = printable ? char32_t(b) : next++;
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | c >> 6);
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    vocab[s] = b;
  }
  for (const auto& p : extra) vocab[p] = static_cast<int>(vocab.size());
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}};
}

void expect_data_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    Tokenizer::load(path);
    FAIL("loaded " << path);
  } catch (const forge::Error& e) {
    INFO(e.what());
    CHECK(e.code() == forge::ExitCode::kData);
    for (const auto& n : needles) CHECK_THAT(e.what(), Catch::Contains(n));
  }
}

}  // namespace

TEST_CASE("every fixture encodes and decodes the Unicode corpus as the reference does") {
  const std::vector<std::string> texts = cases();
  REQUIRE(texts.size() > 50);
  for (const std::string name : {"gpt2", "llama3", "qwen2", "bytefallback"}) {
    INFO(name);
    const Tokenizer t = Tokenizer::load(fixture(name + ".json"));
    const Json expected = forge::read_json(fixture(name + ".expected.json"));
    CHECK(t.sha256() == expected["sha256"].get<std::string>());
    CHECK(t.file_name() == "tokenizer.json");
    CHECK(t.chunk_cache_usable());
    const Json& want = expected["cases"];
    REQUIRE(want.size() == texts.size());
    EncodeCache cache;
    for (int pass = 0; pass < 2; ++pass)  // the second pass is served from the cache
      for (size_t i = 0; i < texts.size(); ++i) {
        INFO("case " << i << ": " << texts[i]);
        const auto ids = want[i]["ids"].get<std::vector<int>>();
        std::vector<int> plain, cached;
        t.encode(texts[i], plain);
        t.encode(texts[i], cached, cache);
        CHECK(plain == ids);
        CHECK(cached == ids);
        CHECK(t.decode(plain) == want[i]["decoded"].get<std::string>());
        for (const int id : plain) REQUIRE(static_cast<uint32_t>(id) < t.vocab_size());
      }
    CHECK(cache.hits > cache.misses);
  }
}

TEST_CASE("byte-level fixtures give the text back, NFC-normalized for Qwen2") {
  const std::vector<std::string> texts = cases();
  const Tokenizer gpt2 = Tokenizer::load(fixture("gpt2.json"));
  const Tokenizer llama3 = Tokenizer::load(fixture("llama3.json"));
  const Tokenizer qwen2 = Tokenizer::load(fixture("qwen2.json"));
  size_t normalized = 0;
  for (const std::string& text : texts) {
    INFO(text);
    // The <mask> token strips the spaces before it (lstrip), as RoBERTa's does.
    if (text.find("<mask>") == std::string::npos) CHECK(gpt2.decode(encode(gpt2, text)) == text);
    CHECK(llama3.decode(encode(llama3, text)) == text);
    const std::string q = qwen2.decode(encode(qwen2, text));
    normalized += q != text;
  }
  // The decomposed forms of the corpus come back composed: "cafe\u0301" is "caf\u00e9".
  CHECK(normalized >= 4);
  CHECK(qwen2.decode(encode(qwen2, "cafe\xCC\x81")) == "caf\xC3\xA9");
  CHECK(encode(qwen2, "cafe\xCC\x81") == encode(qwen2, "caf\xC3\xA9"));
  CHECK(encode(llama3, "cafe\xCC\x81") != encode(llama3, "caf\xC3\xA9"));
}

TEST_CASE("added tokens become their ids wherever they are written, and eos follows the documented rule") {
  const Tokenizer gpt2 = Tokenizer::load(fixture("gpt2.json"));
  const int eot = id_of(gpt2, "<|endoftext|>");
  CHECK(gpt2.eos_id() == eot);
  CHECK(gpt2.vocab_size() == static_cast<uint32_t>(id_of(gpt2, "<mask>") + 1));
  const auto ids = encode(gpt2, "Hello<|endoftext|>world<|endoftext|>");
  REQUIRE(ids.size() >= 4);
  CHECK(ids.back() == eot);
  CHECK(std::count(ids.begin(), ids.end(), eot) == 2);
  CHECK(gpt2.decode(ids) == "Hello<|endoftext|>world<|endoftext|>");  // special tokens are not skipped
  const auto partial = encode(gpt2, "<|endoftext");
  CHECK(std::count(partial.begin(), partial.end(), eot) == 0);
  // lstrip: the token takes the spaces before it.
  CHECK(pieces(gpt2, encode(gpt2, "a   <mask>")) == std::vector<std::string>{"a", "<mask>"});

  const Tokenizer llama3 = Tokenizer::load(fixture("llama3.json"));
  CHECK(llama3.eos_id() == id_of(llama3, "<|end_of_text|>"));
  CHECK(pieces(llama3, encode(llama3, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>")) ==
        std::vector<std::string>{"<|begin_of_text|>", "<|start_header_id|>", "user", "<|end_header_id|>"});
  // ignore_merges: a whole pre-token in the vocabulary is one token, whatever the merges would build.
  CHECK(pieces(llama3, encode(llama3, " supercalifragilisticexpialidocious")) ==
        std::vector<std::string>{bl(" supercalifragilisticexpialidocious")});

  const Tokenizer qwen2 = Tokenizer::load(fixture("qwen2.json"));
  CHECK(qwen2.eos_id() == id_of(qwen2, "<|endoftext|>"));
  const auto chat = encode(qwen2, "<|im_start|>user\n<tool_call>x</tool_call><|im_end|>");
  CHECK(chat.front() == id_of(qwen2, "<|im_start|>"));
  CHECK(chat.back() == id_of(qwen2, "<|im_end|>"));
  CHECK(std::count(chat.begin(), chat.end(), id_of(qwen2, "<tool_call>")) == 1);  // non-special, still whole
  // Qwen2 splits numbers into single digits.
  CHECK(pieces(qwen2, encode(qwen2, "2024")) == std::vector<std::string>{"2", "0", "2", "4"});

  const Tokenizer fallback = Tokenizer::load(fixture("bytefallback.json"));
  CHECK(fallback.eos_id() == id_of(fallback, "</s>"));  // the template appends nothing; </s> by name
  CHECK(fallback.vocab_size() == 1219);
}

TEST_CASE("byte fallback spells a character outside the vocabulary as its <0xXX> bytes") {
  const Tokenizer t = Tokenizer::load(fixture("bytefallback.json"));
  const std::string clef = "\xF0\x9D\x84\x9E";  // U+1D11E, in no fixture's training text
  REQUIRE_FALSE(t.piece_id(clef));
  CHECK(pieces(t, encode(t, clef)) ==
        std::vector<std::string>{"\xE2\x96\x81", "<0xF0>", "<0x9D>", "<0x84>", "<0x9E>"});
  CHECK(t.decode(encode(t, clef)) == clef);
  CHECK(t.decode(encode(t, "a " + clef + " b")) == "a " + clef + " b");
  // Byte pieces that are not UTF-8 decode to U+FFFD each, as the library's ByteFallback decoder does.
  CHECK(t.decode(std::vector<int>{id_of(t, "<0xF0>"), id_of(t, "<0x9D>")}) == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("hand-made tokenizer.json files: merges, Digits, Split behaviors, unknown tokens, odd input") {
  forge::test::TempDir tmp;
  SECTION("merges apply lowest rank first, from either merge format") {
    for (const Json& merges :
         {Json::array({"a b", "ab c"}), Json::array({Json::array({"a", "b"}), Json::array({"ab", "c"})})}) {
      const Tokenizer t =
          Tokenizer::load(tmp.write("m.json", tokenizer_json(byte_model({"ab", "abc"}, merges),
                                                             byte_level(true), nullptr, byte_level(true))));
      CHECK(pieces(t, encode(t, "abcab")) == std::vector<std::string>{"abc", "ab"});
      CHECK(t.decode(encode(t, "abcab a\tb")) == "abcab a\tb");
    }
  }
  SECTION("Digits isolates each digit") {
    const Json pre = {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(false)}}};
    const Tokenizer t =
        Tokenizer::load(tmp.write("d.json", tokenizer_json(byte_model({"12"}, Json::array({"1 2"})), pre)));
    CHECK(pieces(t, encode(t, "x12")) == std::vector<std::string>{"x", "1", "2"});
    const Json contiguous = {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", false}}, byte_level(false)}}};
    const Tokenizer c = Tokenizer::load(
        tmp.write("c.json", tokenizer_json(byte_model({"12"}, Json::array({"1 2"})), contiguous)));
    CHECK(pieces(c, encode(c, "x12")) == std::vector<std::string>{"x", "12"});
  }
  SECTION("Split behaviors cut where the library cuts") {
    // Characters as the alphabet, whole pieces for every way "a-b--c" can be cut, no merges: with
    // ignore_merges each pre-token in the vocabulary is one token, so the pre-tokens are visible.
    Json vocab = Json::object();
    for (const char* p : {"a", "b", "c", "-", "--", "a-", "b-", "-b", "-c", "b--", "--c"})
      vocab[p] = static_cast<int>(vocab.size());
    const Json model = {
        {"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}, {"ignore_merges", true}};
    const auto cut = [&](const std::string& behavior) {
      const Json pre = {
          {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
      const Tokenizer t = Tokenizer::load(tmp.write(behavior + ".json", tokenizer_json(model, pre)));
      return pieces(t, encode(t, "a-b--c"));
    };
    using V = std::vector<std::string>;
    CHECK(cut("Removed") == V{"a", "b", "c"});
    CHECK(cut("Isolated") == V{"a", "-", "b", "-", "-", "c"});
    CHECK(cut("MergedWithPrevious") == V{"a-", "b-", "-", "c"});
    CHECK(cut("MergedWithNext") == V{"a", "-b", "-", "-c"});
    CHECK(cut("Contiguous") == V{"a", "-", "b", "--", "c"});
  }
  SECTION("unknown characters become unk_token, fused when fuse_unk") {
    Json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}};
    for (const bool fuse : {false, true}) {
      const Json model = {{"type", "BPE"},        {"vocab", vocab},   {"merges", Json::array()},
                          {"unk_token", "<unk>"}, {"fuse_unk", fuse}, {"byte_fallback", false}};
      const Tokenizer t = Tokenizer::load(tmp.write("u.json", tokenizer_json(model)));
      CHECK(encode(t, "axyb") == (fuse ? std::vector<int>{1, 0, 2} : std::vector<int>{1, 0, 0, 2}));
      CHECK(t.decode(std::vector<int>{1, 0, 2}) == "a <unk> b");  // no decoder: pieces joined by spaces
    }
  }
  SECTION("invalid UTF-8 is read as U+FFFD; empty text has no tokens") {
    const Tokenizer t = Tokenizer::load(
        tmp.write("b.json", tokenizer_json(byte_model(), byte_level(true), nullptr, byte_level(true))));
    CHECK(t.decode(encode(t, std::string("a\xFF") + "b")) ==
          "a\xEF\xBF\xBD"
          "b");
    CHECK(encode(t, "").empty());
    CHECK(t.vocab_size() == 256);
    CHECK(t.eos_id() == -1);
    CHECK_THROWS_AS(t.decode(std::vector<int>{256}), forge::Error);
  }
}

TEST_CASE("a tokenizer.json that cannot run here is a data error naming the file and the construct") {
  forge::test::TempDir tmp;
  const auto write = [&](const std::string& name, const std::string& text) { return tmp.write(name, text); };
  expect_data_error(
      write("meta.json", tokenizer_json(byte_model(), {{"type", "Metaspace"}, {"replacement", "_"}})),
      {"meta.json", "pre_tokenizer type 'Metaspace' is not supported",
       "supported: ByteLevel, Split, Sequence, Digits"});
  expect_data_error(write("wp.json", tokenizer_json({{"type", "WordPiece"}, {"vocab", Json::object()}})),
                    {"wp.json", "model type 'WordPiece'"});
  expect_data_error(write("lower.json", tokenizer_json(byte_model(), nullptr, {{"type", "Lowercase"}})),
                    {"lower.json", "normalizer type 'Lowercase'"});
  expect_data_error(
      write("dec.json", tokenizer_json(byte_model(), nullptr, nullptr, {{"type", "WordPiece"}})),
      {"dec.json", "decoder type 'WordPiece'"});
  const Json bad_regex = {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}"}}}, {"behavior", "Isolated"}};
  expect_data_error(write("re.json", tokenizer_json(byte_model(), bad_regex)),
                    {"re.json", "(\\p{L}", "PCRE2"});
  const Json after = {
      {"type", "Sequence"},
      {"pretokenizers", {byte_level(false), {{"type", "Digits"}, {"individual_digits", true}}}}};
  expect_data_error(write("order.json", tokenizer_json(byte_model(), after)),
                    {"order.json", "after ByteLevel"});
  Json prefixed = byte_model();
  prefixed["continuing_subword_prefix"] = "##";
  expect_data_error(write("prefix.json", tokenizer_json(prefixed)),
                    {"prefix.json", "continuing_subword_prefix '##'"});
  expect_data_error(write("merge.json", tokenizer_json(byte_model({}, Json::array({"a zz"})))),
                    {"merge.json", "model.merges[0]", "'zz' is not in the vocabulary"});
  expect_data_error(write("nomodel.json", "{\"version\": \"1.0\"}"), {"nomodel.json", "\"model\""});
  expect_data_error(write("trunc.json", "{\"model\": {"), {"trunc.json", "JSON"});
  expect_data_error(write("garbage.model", "not a model"), {"garbage.model", "not a SentencePiece model"});
}

TEST_CASE("encoding from several threads gives the same ids") {
  const Tokenizer t = Tokenizer::load(fixture("qwen2.json"));
  std::string text;
  for (const auto& c : cases()) text += c + "\n";
  const auto want = encode(t, text);
  std::vector<std::vector<int>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got)
    threads.emplace_back([&] {
      EncodeCache cache;
      for (int i = 0; i < 3; ++i) t.encode(text, g, cache);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) CHECK(g == want);
}

TEST_CASE("prepare keeps a tokenizer.json as tokenizer.json and its shards decode back") {
  forge::test::TempDir tmp;
  std::mt19937 rng(3);
  const std::vector<std::string> texts = cases();
  std::vector<std::string> docs;
  for (int d = 0; d < 24; ++d) {
    std::string doc;
    for (int k = 0; k < 40; ++k) {
      const std::string& c = texts[rng() % texts.size()];
      if (c.find("<|") != std::string::npos || c.find('<') != std::string::npos) continue;  // no markup
      doc += c + (k % 5 == 4 ? "\n" : " ");
    }
    docs.push_back(doc + "document " + std::to_string(d) + " ends here.");
    tmp.write("text/d" + std::to_string(d) + ".txt", docs.back());
  }
  PrepareOptions o;
  o.inputs = {{tmp / "text", "prose"}};
  o.ingest.extensions = {"txt"};
  o.out = tmp / "ds";
  o.tokenizer_model = fixture("qwen2.json");
  o.threads = 2;
  o.valid_fraction = 0;
  o.near_dedup = false;
  o.language.enabled = false;
  // The corpus is a test corpus, not prose: no quality filter may drop a document.
  FilterOptions& f = o.filters;
  f.min_words = 1;
  f.min_mean_word_length = 0;
  f.max_mean_word_length = f.max_symbol_word_ratio = f.max_digit_ratio = 1e9;
  f.min_alpha_word_fraction = 0;
  f.max_bullet_line_fraction = f.max_ellipsis_line_fraction = f.max_boilerplate_line_fraction = 1;
  f.max_duplicate_line_fraction = f.max_duplicate_line_char_fraction = 1;
  f.max_top_2gram_fraction = f.max_top_3gram_fraction = f.max_top_4gram_fraction = 1;
  prepare_dataset(o);
  const Manifest m = load_manifest(o.out);
  CHECK(m.tokenizer_file == "tokenizer.json");
  CHECK_FALSE(std::filesystem::exists(o.out + "/tokenizer.model"));
  const Tokenizer t = Tokenizer::load(o.out + "/" + m.tokenizer_file);
  CHECK(m.tokenizer_sha256 == Tokenizer::load(fixture("qwen2.json")).sha256());
  CHECK(m.tokenizer_sha256 == t.sha256());
  CHECK(m.eos_id == t.eos_id());
  CHECK(m.vocab_size == t.vocab_size());
  verify_dataset(o.out);
  // Every document comes back as (the normalized, NFC) text it was: ends with eos, decodes to a text
  // that ends as the document did.
  size_t found = 0;
  for (const auto& e : m.shards) {
    const ShardData data = read_shard(o.out + "/" + e.file);
    for (size_t i = 0; i + 1 < data.doc_offsets.size(); ++i) {
      std::vector<int> ids(data.tokens.begin() + static_cast<std::ptrdiff_t>(data.doc_offsets[i]),
                           data.tokens.begin() + static_cast<std::ptrdiff_t>(data.doc_offsets[i + 1]));
      REQUIRE(ids.back() == m.eos_id);
      ids.pop_back();
      const std::string text = t.decode(ids);
      std::vector<int> again;
      t.encode(text, again);
      CHECK(again == ids);  // decoding and encoding again is the identity on prepared text
      const size_t at = text.rfind("document ");
      REQUIRE(at != std::string::npos);
      CHECK(text.substr(at).ends_with(" ends here."));
      ++found;
    }
  }
  CHECK(found == docs.size());
  // The tokenizer file is part of the version: another tokenizer, another version.
  PrepareOptions o2 = o;
  o2.out = tmp / "ds2";
  o2.tokenizer_model = fixture("llama3.json");
  prepare_dataset(o2);
  CHECK(load_manifest(o2.out).version != m.version);
  CHECK(load_manifest(o2.out).tokenizer_sha256 != m.tokenizer_sha256);
}

TEST_CASE("a tokenizer.json without forge's chat markers is still a usage error for chat data") {
  const std::string path = fixture("qwen2.json");
  try {
    chat_marker_ids(Tokenizer::load(path), path);
    FAIL("markers found");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains(path));
  }
}
