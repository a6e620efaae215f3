#include "forge/dataio/normalize.h"

#include "forge/common/progress_line.h"

#include <algorithm>

namespace forge::data {
namespace {

// Decodes the UTF-8 sequence at s[i] (valid input); returns its length and code point.
int decode(std::string_view s, size_t i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t v = c & (0x7F >> len);
  for (int k = 1; k < len && i + k < s.size(); ++k)
    v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *cp = v;
  return len;
}

bool is_removed_control(uint32_t cp) {
  return (cp < 0x20 && cp != '\t' && cp != '\n') || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) ||
         cp == 0xFEFF || cp == 0x200B;
}

bool is_unicode_space(uint32_t cp) {
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace

std::string normalize_text(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  // Whitespace and newlines are held back until the next visible character, so trailing spaces, blank
  // line runs and the document's trailing whitespace never reach `out`.
  std::string pending_space;
  int pending_newlines = 0;
  const auto visible = [&](const char* p, size_t n) {
    if (!out.empty()) out.append(std::min(pending_newlines, 2), '\n');
    out.append(pending_space);
    out.append(p, n);
    pending_newlines = 0;
    pending_space.clear();
  };
  for (size_t i = 0; i < in.size();) {
    const char c = in[i];
    const auto u = static_cast<unsigned char>(c);
    if (u > 0x20 && u < 0x7F) {
      size_t j = i + 1;  // a run of visible ASCII
      while (j < in.size() && static_cast<unsigned char>(in[j]) > 0x20 &&
             static_cast<unsigned char>(in[j]) < 0x7F)
        ++j;
      visible(in.data() + i, j - i);
      i = j;
      continue;
    }
    if (c == ' ' || c == '\t') {
      pending_space.push_back(c);
      ++i;
      continue;
    }
    if (c == '\r' || c == '\n') {
      ++pending_newlines;
      pending_space.clear();
      i += (c == '\r' && i + 1 < in.size() && in[i + 1] == '\n') ? 2 : 1;
      continue;
    }
    uint32_t cp = 0;
    const int len = decode(in, i, &cp);
    if (is_unicode_space(cp)) {
      pending_space.push_back(' ');
    } else if (!is_removed_control(cp)) {
      visible(in.data() + i, len);
    }
    i += len;
  }
  return out;
}

Json normalize(Corpus& corpus) {
  uint64_t changed = 0, emptied = 0, bytes_in = 0, bytes_out = 0;
  ProgressLine progress("prepare normalize", "docs");
  for (auto& doc : corpus.docs) {
    bytes_in += doc.text.size();
    std::string n = normalize_text(doc.text);
    if (n != doc.text) ++changed;
    bytes_out += n.size();
    progress.add(1, doc.text.size());
    doc.text = std::move(n);
  }
  progress.finish();
  const auto end = std::remove_if(corpus.docs.begin(), corpus.docs.end(), [&](const Document& d) {
    return d.text.empty() ? (++emptied, true) : false;
  });
  corpus.docs.erase(end, corpus.docs.end());
  return {{"rules", kNormalizeRules},
          {"documents_changed", changed},
          {"bytes_in", bytes_in},
          {"bytes_out", bytes_out},
          {"removed", {{"empty_after_normalize", emptied}}},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
