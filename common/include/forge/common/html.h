// HTML text escaping for the self-contained reports (forge-train report, forge-quota report --html).
#pragma once

#include <string>
#include <string_view>

namespace forge {

// Escapes the five characters that are special in HTML text and attribute values.
inline std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace forge
