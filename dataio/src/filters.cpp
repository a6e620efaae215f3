#include "forge/dataio/filters.h"

#include "forge/common/progress_line.h"
#include "forge/dataio/text.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace forge::data {
namespace {

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c | 0x20);
  return out;
}

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

// Counts of 64-bit keys in an open-addressing table reused across documents: the filters count n-grams of
// every document, and a node-based map spent most of its time allocating.
class KeyCounter {
 public:
  void reset(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    if (keys_.size() < cap || keys_.size() > 4 * cap) {
      keys_.assign(cap, 0);
      counts_.assign(cap, 0);
    } else {
      std::fill(counts_.begin(), counts_.end(), 0);
    }
    mask_ = keys_.size() - 1;
  }
  // The key's count after adding one.
  uint32_t add(uint64_t key) {
    for (size_t i = static_cast<size_t>(key * 0x9e3779b97f4a7c15ULL >> 20) & mask_;; i = (i + 1) & mask_) {
      if (counts_[i] == 0) {
        keys_[i] = key;
        return counts_[i] = 1;
      }
      if (keys_[i] == key) return ++counts_[i];
    }
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> counts_;  // 0 = empty slot
  size_t mask_ = 0;
};

// Fraction of the word characters covered by the most frequent word n-gram (Gopher's "top n-gram").
double top_ngram_fraction(const std::vector<std::string_view>& words, const std::vector<uint64_t>& hashes,
                          size_t total_chars, int n, KeyCounter& counts) {
  if (words.size() < static_cast<size_t>(n) || total_chars == 0) return 0;
  counts.reset(words.size());
  uint64_t best_key = 0;
  uint32_t best = 0;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    const uint64_t key = ngram_hash(&hashes[i], n);
    const uint32_t c = counts.add(key);
    if (c > best) best = c, best_key = key;
  }
  if (best < 2) return 0;
  // Characters of one occurrence of the top n-gram times its count.
  size_t chars = 0;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    if (ngram_hash(&hashes[i], n) != best_key) continue;
    for (int k = 0; k < n; ++k) chars += words[i + k].size();
    break;
  }
  return double(chars) * best / double(total_chars);
}

bool is_boilerplate_line(std::string_view lower_line) {
  static const char* kPhrases[] = {
      "enable javascript", "javascript is disabled", "cookie policy", "use of cookies",
      "terms of use",      "privacy policy",         "click here",    "subscribe to our newsletter"};
  for (const char* p : kPhrases)
    if (contains(lower_line, p)) return true;
  return false;
}

}  // namespace

std::string prose_filter(std::string_view text, const FilterOptions& o) {
  std::vector<std::string_view> words;
  size_t word_chars = 0, alpha_words = 0;
  for_each_word(text, [&](std::string_view w) {
    words.push_back(w);
    word_chars += w.size();
    if (std::any_of(w.begin(), w.end(),
                    [](char c) { return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c & 0x80); }))
      ++alpha_words;
  });
  const auto nw = static_cast<double>(words.size());
  if (words.size() < static_cast<size_t>(o.min_words)) return "too_few_words";
  if (words.size() > static_cast<size_t>(o.max_words)) return "too_many_words";
  const double mean = double(word_chars) / nw;
  if (mean < o.min_mean_word_length || mean > o.max_mean_word_length) return "mean_word_length";
  size_t symbols = 0, digits = 0, visible = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '#') ++symbols;
    if (c == '.' && i + 2 < text.size() && text[i + 1] == '.' && text[i + 2] == '.') ++symbols, i += 2;
    if (c >= '0' && c <= '9') ++digits;
    if (c != ' ' && c != '\n' && c != '\t') ++visible;
  }
  if (double(symbols) / nw > o.max_symbol_word_ratio) return "symbol_ratio";
  if (visible && double(digits) / double(visible) > o.max_digit_ratio) return "digit_ratio";
  if (double(alpha_words) / nw < o.min_alpha_word_fraction) return "alpha_words";
  const std::string low = lower(text);  // same offsets as `text`
  if (contains(low, "lorem ipsum")) return "lorem_ipsum";

  const auto lines = split_lines(text);
  const auto low_lines = split_lines(low);
  size_t bullets = 0, ellipsis = 0, boiler = 0, nonblank = 0, dup_lines = 0, dup_chars = 0, line_chars = 0;
  std::unordered_map<std::string_view, uint32_t> seen;
  for (size_t li = 0; li < lines.size(); ++li) {
    auto line = lines[li];
    const auto b = line.find_first_not_of(" \t");
    if (b == std::string_view::npos) continue;
    line = line.substr(b);
    ++nonblank;
    line_chars += line.size();
    if (line[0] == '*' || line[0] == '-' || line.substr(0, 3) == "\xE2\x80\xA2") ++bullets;
    if (line.ends_with("...") || line.ends_with("\xE2\x80\xA6")) ++ellipsis;
    if (is_boilerplate_line(low_lines[li])) ++boiler;
    if (++seen[line] > 1) ++dup_lines, dup_chars += line.size();
  }
  if (nonblank) {
    const double nl = double(nonblank);
    if (bullets / nl > o.max_bullet_line_fraction) return "bullet_lines";
    if (ellipsis / nl > o.max_ellipsis_line_fraction) return "ellipsis_lines";
    if (dup_lines / nl > o.max_duplicate_line_fraction) return "duplicate_lines";
    if (line_chars && double(dup_chars) / double(line_chars) > o.max_duplicate_line_char_fraction)
      return "duplicate_line_chars";
    if (boiler / nl > o.max_boilerplate_line_fraction) return "boilerplate";
  }
  std::vector<uint64_t> hashes(words.size());
  for (size_t i = 0; i < words.size(); ++i) hashes[i] = word_hash(words[i]);
  thread_local KeyCounter counts;
  if (top_ngram_fraction(words, hashes, word_chars, 2, counts) > o.max_top_2gram_fraction) return "top_2gram";
  if (top_ngram_fraction(words, hashes, word_chars, 3, counts) > o.max_top_3gram_fraction) return "top_3gram";
  if (top_ngram_fraction(words, hashes, word_chars, 4, counts) > o.max_top_4gram_fraction) return "top_4gram";
  return "";
}

std::string code_filter(std::string_view text, const FilterOptions& o) {
  const auto lines = split_lines(text);
  size_t longest = 0, total = 0, alnum = 0;
  for (auto line : lines) {
    longest = std::max(longest, line.size());
    total += line.size();
  }
  for (char c : text) alnum += std::isalnum(static_cast<unsigned char>(c)) ? 1 : 0;
  if (lines.size() < static_cast<size_t>(o.code_min_lines)) return "code_too_short";
  if (longest > static_cast<size_t>(o.max_code_line_length)) return "code_long_line";
  if (double(total) / double(lines.size()) > o.max_code_mean_line_length) return "code_minified";
  if (double(alnum) / double(std::max<size_t>(1, text.size())) < o.min_code_alnum_fraction)
    return "code_alnum_fraction";
  const std::string head = lower(text.substr(0, std::min<size_t>(text.size(), 1024)));
  for (const char* marker :
       {"auto-generated", "autogenerated", "automatically generated", "generated by", "do not edit"})
    if (contains(head, marker)) return "code_autogenerated";
  return "";
}

std::string detect_license(std::string_view text) {
  const std::string_view head = text.substr(0, std::min<size_t>(text.size(), 8192));
  const auto spdx = head.find("SPDX-License-Identifier:");
  if (spdx != std::string_view::npos) {
    auto rest = head.substr(spdx + 24);
    const auto b = rest.find_first_not_of(" \t");
    if (b != std::string_view::npos) {
      rest = rest.substr(b);
      const auto e = rest.find_first_of(" \t\n*");
      std::string id(rest.substr(0, e));
      if (!id.empty()) return id;
    }
  }
  const std::string l = lower(head);
  if (contains(l, "apache license") && contains(l, "version 2.0")) return "Apache-2.0";
  if (contains(l, "gnu lesser general public license"))
    return contains(l, "version 3") ? "LGPL-3.0" : "LGPL-2.1";
  if (contains(l, "gnu general public license"))
    return contains(l, "version 3") ? "GPL-3.0" : contains(l, "version 2") ? "GPL-2.0" : "GPL-1.0-or-later";
  if (contains(l, "mozilla public license") && contains(l, "2.0")) return "MPL-2.0";
  if (contains(l, "permission is hereby granted, free of charge")) return "MIT";
  if (contains(l, "redistribution and use in source and binary forms"))
    return contains(l, "neither the name") ? "BSD-3-Clause" : "BSD-2-Clause";
  if (contains(l, "python software foundation license")) return "PSF-2.0";
  if (contains(l, "creative commons") && contains(l, "cc0")) return "CC0-1.0";
  return "";
}

Json apply_filters(Corpus& corpus, const FilterOptions& options) {
  ProgressLine progress("prepare filters", "docs");
  std::vector<bool> is_code(corpus.domains.size());
  for (size_t d = 0; d < corpus.domains.size(); ++d)
    is_code[d] = std::find(options.code_domains.begin(), options.code_domains.end(), corpus.domains[d]) !=
                 options.code_domains.end();
  std::map<std::string, uint64_t> removed;
  std::map<std::string, std::map<std::string, uint64_t>> removed_by_domain;
  std::map<std::string, Json> examples;
  std::map<std::string, uint64_t> licenses;
  std::vector<Document> kept;
  kept.reserve(corpus.docs.size());
  const uint64_t in = corpus.docs.size();
  for (auto& doc : corpus.docs) {
    progress.add(1, doc.text.size());
    const std::string why =
        is_code[doc.domain] ? code_filter(doc.text, options) : prose_filter(doc.text, options);
    if (!why.empty()) {
      ++removed[why];
      ++removed_by_domain[corpus.domains[doc.domain]][why];
      if (!examples.count(why)) examples[why] = doc.source;
      continue;
    }
    if (doc.license.empty()) doc.license = detect_license(doc.text);
    ++licenses[doc.license.empty() ? "unknown" : doc.license];
    kept.push_back(std::move(doc));
  }
  progress.finish();
  corpus.docs = std::move(kept);
  Json removed_json = Json::object();
  for (const auto& [k, v] : removed) removed_json[k] = v;
  return {
      {"documents_in", in},           {"removed", removed_json}, {"removed_per_domain", removed_by_domain},
      {"examples", examples},         {"licenses", licenses},    {"documents_out", corpus.docs.size()},
      {"seconds", progress.seconds()}};
}

Json apply_license_policy(Corpus& corpus, const LicenseOptions& options) {
  std::map<std::string, uint64_t> kept, removed;
  std::map<std::string, std::map<std::string, uint64_t>> removed_per_domain;
  const uint64_t in = corpus.docs.size();
  size_t n = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    Document& doc = corpus.docs[i];
    const std::string& license = doc.license.empty() ? std::string("unknown") : doc.license;
    if (!options.allow.empty() &&
        std::find(options.allow.begin(), options.allow.end(), license) == options.allow.end()) {
      ++removed[license];
      ++removed_per_domain[corpus.domains[doc.domain]][license];
      continue;
    }
    ++kept[license];
    if (n != i) corpus.docs[n] = std::move(doc);
    ++n;
  }
  corpus.docs.resize(n);
  uint64_t total = 0;
  for (const auto& [_, c] : removed) total += c;
  return {{"allow", options.allow},
          {"documents_in", in},
          {"licenses_kept", kept},
          {"licenses_removed", removed},
          {"removed", {{"license_not_allowed", total}}},
          {"removed_per_domain", removed_per_domain},
          {"documents_out", corpus.docs.size()}};
}

}  // namespace forge::data
