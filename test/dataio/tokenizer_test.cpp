#include "forge/dataio/tokenizer.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "support/temp_dir.h"

#include <sentencepiece_trainer.h>

#include <catch2/catch.hpp>

using namespace forge::data;

namespace {

Corpus training_corpus() {
  Corpus c;
  c.domains = {"code", "prose"};
  const char* prose[] = {
      "The quick brown fox jumps over the lazy dog. ", "Data quality decides model quality; ",
      "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xE2\x82\xAC 42 ", "Tokens, tokens and more tokens.\n"};
  const char* code[] = {"def f(x):\n    return x + 1\n", "class A:\n\tpass\n",
                        "    if a  ==  b:  # spaced\n        y()\n"};
  for (int i = 0; i < 200; ++i) {
    Document p, k;
    for (int j = 0; j < 6; ++j) p.text += prose[(i + j) % 4];
    p.domain = 1;
    for (int j = 0; j < 4; ++j) k.text += code[(i + j) % 3];
    c.docs.push_back(p);
    c.docs.push_back(k);
  }
  return c;
}

}  // namespace

TEST_CASE("tokenizer trains deterministically, round-trips text and the chunk cache matches plain encoding") {
  forge::test::TempDir tmp;
  const Corpus corpus = training_corpus();
  TokenizerTrainOptions o;
  o.vocab = 320;
  const Tokenizer a = Tokenizer::train(corpus, o, tmp / "a.model");
  const Tokenizer b = Tokenizer::train(corpus, o, tmp / "b.model");
  CHECK(a.sha256() == b.sha256());
  CHECK(a.vocab_size() == 320);
  CHECK(a.eos_id() >= 0);
  const Tokenizer loaded = Tokenizer::load(tmp / "a.model");
  CHECK(loaded.sha256() == a.sha256());

  EncodeCache cache;
  std::vector<int> plain, cached;
  const std::string unseen = "Unseen \xE4\xB8\xAD\xE6\x96\x87 bytes\n\n   indented  twice\ttab  \n";
  for (const std::string& text : {corpus.docs[0].text, corpus.docs[1].text, corpus.docs[5].text, unseen}) {
    a.encode(text, plain);
    a.encode(text, cached, cache);
    CHECK(plain == cached);
    CHECK(a.decode(plain) == text);  // byte fallback and identity normalization: exact round trip
    for (int id : plain) REQUIRE(static_cast<uint32_t>(id) < a.vocab_size());
  }
  CHECK(a.chunk_cache_usable());
  CHECK(cache.hits > 0);
}

TEST_CASE("the chunk cache table keeps every chunk's own ids as it grows and after a clear") {
  // Far more entries than the first table's 1024 slots (it grows at half load); keys that share
  // prefixes and a deliberately colliding hash check that lookups compare the key bytes, not the hash.
  EncodeCache cache;
  const auto key = [](int i) { return "chunk-" + std::to_string(i); };
  const auto ids_of = [](int i) { return std::vector<int>{i, i + 1, i % 7}; };
  const auto hash_of = [&](int i) {
    const std::string k = key(i);
    return i % 100 == 0 ? uint64_t{42} : forge::xxh3_64(k.data(), k.size());
  };
  for (int i = 0; i < 5000; ++i) cache.insert(key(i), hash_of(i), ids_of(i));
  CHECK(cache.size() == 5000);
  for (int i = 0; i < 5000; ++i) {
    std::span<const int> got;
    REQUIRE(cache.find(key(i), hash_of(i), &got));
    CHECK(std::vector<int>(got.begin(), got.end()) == ids_of(i));
  }
  std::span<const int> got;
  CHECK_FALSE(cache.find("chunk-5000", 42, &got));
  CHECK_FALSE(cache.find("chunk-1", 42, &got));  // right key, wrong hash: not found
  cache.clear();
  CHECK(cache.size() == 0);
  CHECK_FALSE(cache.find(key(3), hash_of(3), &got));
  cache.insert(key(3), hash_of(3), ids_of(3));
  REQUIRE(cache.find(key(3), hash_of(3), &got));
  CHECK(std::vector<int>(got.begin(), got.end()) == ids_of(3));
}

TEST_CASE("tokenizer rejects a bad model file and a vocabulary too small for byte fallback") {
  forge::test::TempDir tmp;
  try {
    Tokenizer::load(tmp.write("bad.model", "not a model"));
    FAIL("garbage accepted as a model");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kData);
  }
  TokenizerTrainOptions o;
  o.vocab = 100;
  CHECK_THROWS_AS(Tokenizer::train(training_corpus(), o, tmp / "x.model"), forge::Error);
}

TEST_CASE("a model with SentencePiece's default normalization is encoded whole, with the same ids") {
  forge::test::TempDir tmp;
  std::string text;
  for (const auto& d : training_corpus().docs) text += d.text + "\n";
  tmp.write("train.txt", text);
  const std::string args = "--input=" + (tmp / "train.txt") + " --model_prefix=" + (tmp / "nfkc") +
                           " --vocab_size=200 --model_type=bpe --minloglevel=2";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  INFO(status.ToString());
  REQUIRE(status.ok());
  const Tokenizer t = Tokenizer::load(tmp / "nfkc.model");
  CHECK_FALSE(t.chunk_cache_usable());  // the dummy prefix would be added to every chunk
  EncodeCache cache;
  std::vector<int> plain, cached;
  t.encode("Tokens, tokens  and more tokens.", plain);
  t.encode("Tokens, tokens  and more tokens.", cached, cache);
  CHECK(plain == cached);
}
