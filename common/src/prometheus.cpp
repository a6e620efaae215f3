#include "forge/common/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace forge {

namespace {

// Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
std::string escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

}  // namespace

void PromGauges::set(const std::string& name, std::string_view help, const PromLabels& labels, double value) {
  auto it = std::find_if(families_.begin(), families_.end(), [&](const Family& f) { return f.name == name; });
  if (it == families_.end()) it = families_.insert(families_.end(), Family{name, escape(help, false), ""});
  std::string sample = name;
  if (!labels.empty()) {
    sample += '{';
    for (size_t i = 0; i < labels.size(); ++i)
      sample += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, escape(labels[i].second, true));
    sample += '}';
  }
  it->samples += sample + ' ' + number(value) + '\n';
}

std::string PromGauges::text() const {
  std::string out;
  for (const Family& f : families_)
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{2}", f.name, f.help, f.samples);
  return out;
}

}  // namespace forge
