// Small text helpers every module shares, the SPANK plugin included (standard library only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge {

// `s` without leading and trailing spaces, tabs and carriage returns.
std::string trim(std::string_view s);
// "a, b ,c" -> {"a","b","c"}; empty items dropped.
std::vector<std::string> split_list(std::string_view s, char sep = ',');
// The whole of `s` as a decimal integer (an optional '-', no '+', no spaces); nullopt otherwise. Callers
// check the range, so each error names its own bounds.
std::optional<int64_t> parse_int(std::string_view s);
// User-supplied text made safe to print: at most `max` bytes, control and non-ASCII bytes as \xNN
// (newlines kept as they are with `keep_newlines`: a model's code in a report).
std::string printable(std::string_view text, size_t max = 64, bool keep_newlines = false);

}  // namespace forge
