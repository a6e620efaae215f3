// Stage 2: text normalization. The rules are fixed (docs/DATA.md lists them) because a change to them
// changes every dataset version built after it; `kNormalizeRules` names the rule set in the manifest.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <string>
#include <string_view>

namespace forge::data {

inline constexpr const char* kNormalizeRules = "forge-normalize-v1";

// 1. CR LF and lone CR become LF.
// 2. Control characters are removed: C0 except TAB and LF, DEL, C1 (U+0080-U+009F), U+FEFF, U+200B.
// 3. Unicode space characters (U+00A0, U+1680, U+2000-U+200A, U+202F, U+205F, U+3000) become ' '.
// 4. Spaces and tabs at the end of a line are removed.
// 5. Runs of blank lines collapse to one blank line.
// 6. Leading blank lines and trailing whitespace of the document are removed.
// Leading indentation and inner spacing are kept (code depends on them). Input must be valid UTF-8.
std::string normalize_text(std::string_view in);

// Normalizes every document; documents left empty are removed. Returns the stage's counters.
Json normalize(Corpus& corpus);

}  // namespace forge::data
