// The language stage: CLD2 identifications on a planted mixed-language corpus, the allow-list, its parser.
#include "forge/dataio/language.h"
#include "forge/common/error.h"
#include "support/paths.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace forge::data;

namespace {

// The fixture sentences of one language (test/dataio/fixtures/languages/<code>.txt, written for this test:
// fifteen sentences of a news story, the same story in every language).
std::vector<std::string> sentences(const std::string& code) {
  std::ifstream in(forge::test::source_path("test/dataio/fixtures/languages/" + code + ".txt"));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  REQUIRE(out.size() >= 10);
  return out;
}

// `n` documents of 2-8 random sentences each, language drawn with the planted shares; returns the
// planted language of each document.
std::vector<std::string> plant(Corpus& corpus, const std::map<std::string, double>& shares, int n,
                               uint16_t domain, uint32_t seed) {
  std::map<std::string, std::vector<std::string>> pool;
  for (const auto& [code, _] : shares) pool[code] = sentences(code);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::string> planted;
  for (int i = 0; i < n; ++i) {
    double x = u(rng);
    std::string code = shares.rbegin()->first;
    for (const auto& [c, p] : shares) {
      if (x < p) {
        code = c;
        break;
      }
      x -= p;
    }
    const auto& s = pool[code];
    const int k = 2 + static_cast<int>(rng() % 7);
    Document d;
    for (int j = 0; j < k; ++j) d.text += s[rng() % s.size()] + " ";
    d.domain = domain;
    corpus.docs.push_back(std::move(d));
    planted.push_back(code);
  }
  return planted;
}

}  // namespace

TEST_CASE("CLD2 names the language of each fixture sentence set, and short or letterless text as unknown") {
  for (const char* code : {"en", "de", "fr", "es", "ru"}) {
    std::string text;
    for (const auto& s : sentences(code)) text += s + " ";
    CHECK(identify_language(text) == code);
  }
  CHECK(identify_language("12345 67890 == 42;") == kUnknownLanguage);
  CHECK(identify_language("") == kUnknownLanguage);
  Corpus c;
  c.domains = {"web"};
  c.docs.emplace_back().text = "Der Fluss stieg \xEF\xBF\xBD schnell.\nclean line\nnoch \xEF\xBF\xBD eine\n";
  const forge::Json st = identify_languages(c, LanguageOptions{});
  CHECK(st["unknown_encoding_lines"]["replacement_char"] == 2);
}

TEST_CASE("language shares of a mixed corpus come out within 2 points of the planted ones") {
  const std::map<std::string, double> shares = {
      {"de", 0.2}, {"en", 0.45}, {"es", 0.12}, {"fr", 0.15}, {"ru", 0.08}};
  Corpus c;
  c.domains = {"web"};
  const auto planted = plant(c, shares, 1500, 0, 7);
  std::map<std::string, double> planted_share;
  for (const auto& code : planted) planted_share[code] += 1.0 / double(planted.size());
  const forge::Json st = identify_languages(c, LanguageOptions{});
  REQUIRE(c.docs.size() == planted.size());
  size_t agree = 0;
  for (size_t i = 0; i < planted.size(); ++i) agree += c.docs[i].language == planted[i];
  CHECK(double(agree) / double(planted.size()) > 0.98);
  for (const auto& [code, share] : planted_share) {
    INFO(code);
    const double found = st["languages"].value(code, 0.0) / double(planted.size());
    CHECK(std::abs(found - share) <= 0.02);
    CHECK(std::abs(share - shares.at(code)) <= 0.04);  // the planting itself is close to the targets
  }
  CHECK(st["removed"]["language_not_allowed"] == 0);
}

TEST_CASE("the allow-list keeps the listed languages per domain, * for the others") {
  Corpus c;
  c.domains = {"web", "news", "other"};
  const std::map<std::string, double> mix = {{"de", 0.3}, {"en", 0.4}, {"fr", 0.3}};
  plant(c, mix, 200, 0, 1);
  plant(c, mix, 200, 1, 2);
  plant(c, mix, 200, 2, 3);
  LanguageOptions o;
  o.allow = parse_language_allow("web:en|de, *:fr", "test");
  const forge::Json st = identify_languages(c, o);
  std::map<std::string, std::map<std::string, int>> kept;
  for (const auto& d : c.docs) ++kept[c.domains[d.domain]][d.language];
  CHECK(kept["web"].count("fr") == 0);
  CHECK(kept["web"]["en"] > 0);
  CHECK(kept["web"]["de"] > 0);
  for (const char* d : {"news", "other"}) {
    CHECK(kept[d].size() == 1);
    CHECK(kept[d]["fr"] > 0);
  }
  const uint64_t removed = st["removed"]["language_not_allowed"];
  CHECK(removed == 600 - c.docs.size());
  CHECK(st["removed_per_domain"]["web"]["fr"].get<uint64_t>() +
            st["removed_per_domain"]["news"]["en"].get<uint64_t>() +
            st["removed_per_domain"]["news"]["de"].get<uint64_t>() +
            st["removed_per_domain"]["other"]["en"].get<uint64_t>() +
            st["removed_per_domain"]["other"]["de"].get<uint64_t>() ==
        removed);
}

TEST_CASE("language.allow is parsed strictly, naming the bad entry") {
  const auto a = parse_language_allow("web:en|de,*:un", "x");
  CHECK(a.at("web") == std::vector<std::string>{"en", "de"});
  CHECK(a.at("*") == std::vector<std::string>{"un"});
  CHECK(parse_language_allow("", "x").empty());
  for (const char* bad : {"web", "web:", "web:e n", "web:en,web:de", "bad domain:en", "web:en|3"}) {
    INFO(bad);
    try {
      parse_language_allow(bad, "prepare.ini:3: language.allow");
      FAIL("accepted");
    } catch (const forge::Error& e) {
      CHECK(e.code() == forge::ExitCode::kUsage);
      CHECK(std::string(e.what()).find("prepare.ini:3: language.allow") != std::string::npos);
    }
  }
}
