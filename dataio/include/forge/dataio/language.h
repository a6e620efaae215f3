// The language stage: each document's language from CLD2 (Compact Language Detector 2, a naive Bayes
// model over character quadgrams, Debian libcld2), recorded in the shards (/doc_languages) and reported
// as shares; an optional allow-list per domain removes the rest.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

// The code CLD2 gives to text it cannot place (too short, no letters, a script it has no model for).
inline constexpr const char* kUnknownLanguage = "un";

struct LanguageOptions {
  bool enabled = true;
  // Per domain, the languages kept; "*" applies to every domain not named. A domain with no entry keeps
  // every language. Parsed from "DOMAIN:CODE|CODE,...", e.g. "web:en|de,*:en".
  std::map<std::string, std::vector<std::string>> allow;
};

// `spec` as LanguageOptions::allow describes; forge::Error(kUsage) naming `where` and the bad entry.
std::map<std::string, std::vector<std::string>> parse_language_allow(const std::string& spec,
                                                                     const std::string& where);

// "CLD2 <version> - <table date>": recorded in the dataset's settings, as its model decides the results.
std::string language_identifier();

// The ISO 639 code (CLD2's: "en", "de", "zh-Hant", ...) of the language most of `text` is in, or
// kUnknownLanguage when CLD2 is not confident.
std::string identify_language(std::string_view text);

// Sets Document::language of every document, then removes those the allow-list excludes. The report:
// documents per language (overall and per domain), unreliable identifications, removals per domain.
Json identify_languages(Corpus& corpus, const LanguageOptions& options);

}  // namespace forge::data
