#include "forge/dataio/language.h"

#include "forge/common/error.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/pii.h"

#include <cstdio>  // compact_lang_det.h uses FILE without including it

#include <cld2/public/compact_lang_det.h>

#include <algorithm>
#include <climits>
#include <sstream>

namespace forge::data {
namespace {

bool valid_code(const std::string& code) {
  return !code.empty() && code.size() <= 16 && std::all_of(code.begin(), code.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
  });
}

}  // namespace

std::map<std::string, std::vector<std::string>> parse_language_allow(const std::string& spec,
                                                                     const std::string& where) {
  std::map<std::string, std::vector<std::string>> allow;
  std::stringstream in(spec);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    if (colon == std::string::npos)
      fail(ExitCode::kUsage, "{}: '{}' is not DOMAIN:CODE|CODE (e.g. web:en|de, or *:en for every domain)",
           where, entry);
    const std::string domain = entry.substr(0, colon);
    if (domain != "*") check_domain_name(domain, where);
    if (allow.count(domain)) fail(ExitCode::kUsage, "{}: domain '{}' is listed twice", where, domain);
    auto& codes = allow[domain];
    std::stringstream list(entry.substr(colon + 1));
    for (std::string code; std::getline(list, code, '|');) {
      code.erase(0, code.find_first_not_of(" \t"));
      code.erase(code.find_last_not_of(" \t") + 1);
      if (!valid_code(code))
        fail(ExitCode::kUsage,
             "{}: '{}' in '{}' is not a language code (ISO 639, as CLD2 writes it: en, de, "
             "zh-Hant; {} = unknown)",
             where, code, entry, kUnknownLanguage);
      codes.push_back(code);
    }
    if (codes.empty()) fail(ExitCode::kUsage, "{}: '{}' lists no language", where, entry);
  }
  return allow;
}

std::string language_identifier() {
  return fmt::format("CLD2 {}", CLD2::DetectLanguageVersion());
}

std::string identify_language(std::string_view text) {
  // CLD2 takes an int length; a document that long is judged on its first 2 GiB.
  const int n = static_cast<int>(std::min<size_t>(text.size(), INT_MAX));
  CLD2::Language top3[3];
  int percent3[3], text_bytes = 0;
  bool reliable = false;
  // The text has been through repair_utf8 and normalize, so it is valid UTF-8 as this call requires.
  const CLD2::Language lang =
      CLD2::ExtDetectLanguageSummary(text.data(), n, true, top3, percent3, &text_bytes, &reliable);
  if (!reliable || lang == CLD2::UNKNOWN_LANGUAGE) return kUnknownLanguage;
  return CLD2::LanguageCode(lang);
}

Json identify_languages(Corpus& corpus, const LanguageOptions& options) {
  ProgressLine progress("prepare language", "docs");
  std::vector<const std::vector<std::string>*> allowed(corpus.domains.size(), nullptr);
  const auto any = options.allow.find("*");
  for (size_t d = 0; d < corpus.domains.size(); ++d) {
    const auto it = options.allow.find(corpus.domains[d]);
    allowed[d] = it != options.allow.end()    ? &it->second
                 : any != options.allow.end() ? &any->second
                                              : nullptr;
  }
  std::map<std::string, uint64_t> documents;
  std::map<std::string, std::map<std::string, uint64_t>> per_domain, removed_per_domain;
  uint64_t removed = 0;
  EncodingCounts encoding;  // text in an unknown encoding is where identification goes wrong
  const uint64_t in = corpus.docs.size();
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  for (auto& doc : corpus.docs) {
    progress.add(1, doc.text.size());
    encoding.add(doc.text);
    doc.language = identify_language(doc.text);
    const std::string& domain = corpus.domains[doc.domain];
    ++documents[doc.language];
    ++per_domain[domain][doc.language];
    const auto* allow = allowed[doc.domain];
    if (allow && std::find(allow->begin(), allow->end(), doc.language) == allow->end()) {
      ++removed;
      ++removed_per_domain[domain][doc.language];
      continue;
    }
    kept.push_back(std::move(doc));
  }
  progress.finish();
  corpus.docs = std::move(kept);
  Json allow_json = Json::object();
  for (const auto& [domain, codes] : options.allow) allow_json[domain] = codes;
  return {{"identifier", language_identifier()},
          {"documents_in", in},
          {"languages", documents},
          {"languages_per_domain", per_domain},
          {"allow", allow_json},
          {"removed", {{"language_not_allowed", removed}}},
          {"removed_per_domain", removed_per_domain},
          {"unknown_encoding_lines", encoding.to_json()},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
