// Stage 4: quality filters. Prose gets Gopher/C4-style heuristics; documents of the code domains get code
// heuristics. Each filter has a name, and the report counts removals per name. The license of each
// surviving document is detected here (SPDX identifier or a known license header).
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

struct FilterOptions {
  std::vector<std::string> code_domains = {"code"};
  // prose (Gopher "quality" rules, C4 boilerplate)
  int min_words = 50, max_words = 100000;
  double min_mean_word_length = 3, max_mean_word_length = 10;
  double max_symbol_word_ratio = 0.1;  // '#' and "..." per word
  double max_digit_ratio = 0.15;       // digits per non-space character
  double min_alpha_word_fraction = 0.8;
  double max_bullet_line_fraction = 0.9, max_ellipsis_line_fraction = 0.3;
  double max_duplicate_line_fraction = 0.3, max_duplicate_line_char_fraction = 0.2;
  double max_top_2gram_fraction = 0.2, max_top_3gram_fraction = 0.18, max_top_4gram_fraction = 0.16;
  double max_boilerplate_line_fraction = 0.3;
  // code
  int max_code_line_length = 1000;
  double max_code_mean_line_length = 100;
  double min_code_alnum_fraction = 0.25;
  int code_min_lines = 3;
};

// The name of the first filter that rejects `text`, or "" when it passes.
std::string prose_filter(std::string_view text, const FilterOptions& options);
std::string code_filter(std::string_view text, const FilterOptions& options);

// Names detect_license's rules in the manifest: a change to them changes the versions of datasets built
// after.
inline constexpr const char* kLicenseRules = "forge-license-v2";

// An SPDX identifier for the document's license, or "" when none is detected.
std::string detect_license(std::string_view text);

Json apply_filters(Corpus& corpus, const FilterOptions& options);

// The license policy: an allow-list of SPDX identifiers ("unknown" admits documents whose license is not
// known); empty = every license is kept. Runs after the filters, which detect the licenses it judges.
struct LicenseOptions {
  std::vector<std::string> allow;
};
Json apply_license_policy(Corpus& corpus, const LicenseOptions& options);

}  // namespace forge::data
