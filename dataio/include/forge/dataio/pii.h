// Stage 2b of `prepare` (after normalize, before dedup): PII redaction and the harmful-content (safety)
// filter. Both scan with Hyperscan: one compiled database holds every PII pattern, another the safety list,
// so each document is read once per stage whatever the number of patterns. Regular expressions only find
// candidates; what a regex cannot check (Luhn, octet ranges, dates, the entropy of a key) is checked in C++
// on each candidate. docs/DATA.md ("PII and safety") lists the rules.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct hs_scratch;  // Hyperscan's scratch space (hs_runtime.h), kept out of this header

namespace forge::data {

// Recorded in the manifest: a change to the patterns or the checks changes every dataset version.
inline constexpr const char* kPiiRules = "forge-pii-v1";

// In order of precedence when two candidates cover the same bytes.
enum class PiiType : uint8_t { kSecret, kCard, kEmail, kIp, kPhone };
inline constexpr size_t kPiiTypes = 5;

const char* pii_type_name(PiiType type);    // "secret", "card", "email", "ip", "phone"
const char* pii_placeholder(PiiType type);  // "<SECRET>", "<CARD>", "<EMAIL>", "<IP>", "<PHONE>"
// The type named `name`, or throws forge::Error(kUsage) naming `where`.
PiiType pii_type_from_name(std::string_view name, const std::string& where);

struct PiiOptions {
  bool enabled = true;
  bool drop = false;  // action "drop": a document holding PII is removed; "redact" (default) replaces it
  std::array<bool, kPiiTypes> types = {true, true, true, true, true};  // by PiiType
};

struct PiiMatch {
  size_t begin = 0, end = 0;  // byte offsets in the scanned text
  PiiType type = PiiType::kEmail;
};

// Finds validated PII in text. The compiled database is shared between copies; each copy has its own
// Hyperscan scratch space, so give each thread its own copy.
class PiiScanner {
 public:
  PiiScanner();
  PiiScanner(const PiiScanner& other);
  PiiScanner& operator=(const PiiScanner&) = delete;
  ~PiiScanner();

  // Non-overlapping matches of the enabled types in text order; of overlapping candidates the leftmost
  // wins, then the longest, then the type listed first in PiiType.
  void find(std::string_view text, const std::array<bool, kPiiTypes>& types, std::vector<PiiMatch>& out);

  struct Candidate;
  struct Database;

 private:
  std::shared_ptr<const Database> db_;
  ::hs_scratch* scratch_ = nullptr;
  std::vector<Candidate> candidates_;
};

// The candidate patterns of PiiScanner (Hyperscan syntax), for comparisons with other engines.
std::vector<std::string> pii_pattern_regexes();

// `text` with each match replaced by its type's placeholder (matches as PiiScanner::find returns them).
std::string redact_pii(std::string_view text, const std::vector<PiiMatch>& matches);

// Lines that are not valid UTF-8 and lines holding U+FFFD (ingest's replacement for bytes in an unknown
// encoding). Stages count them instead of failing: their patterns are ASCII and match bytes.
struct EncodingCounts {
  uint64_t invalid_utf8_lines = 0, replacement_char_lines = 0;
  void add(std::string_view text);
  Json to_json() const;
};

// Redacts (or, with action "drop", removes documents holding) PII. Returns the stage's counters: matches
// per type, and per domain the matches per type and the documents changed or removed.
Json redact_pii(Corpus& corpus, PiiScanner& scanner, const PiiOptions& options);

// The safety list: one entry a line, `#` starts a comment line; an entry is a word or phrase (matched
// case-insensitively at word boundaries, any whitespace between the words of a phrase) or `re:REGEX`
// (Hyperscan syntax, case-insensitive), optionally followed by a TAB and a positive weight (default 1).
struct SafetyEntry {
  std::string text;  // as written, without the weight
  bool regex = false;
  double weight = 1;
  int line = 0;  // in the list file
};

struct SafetyOptions {
  std::string list;        // path of the list; "" = the stage does not run
  double threshold = 5.0;  // documents scoring above it are removed
};

// Words as forge::data::for_each_word counts them; a shorter document counts as this many, so one mention
// in a short text does not dominate its score.
inline constexpr uint64_t kSafetyMinWords = 100;

class SafetyFilter {
 public:
  // Reads and compiles the list; a bad line or pattern throws forge::Error(kUsage) naming the file and
  // line.
  static SafetyFilter load(const std::string& path);
  // From entries already parsed; `origin` names them in errors.
  SafetyFilter(std::vector<SafetyEntry> entries, const std::string& origin);
  SafetyFilter(const SafetyFilter& other);
  SafetyFilter(SafetyFilter&& other) noexcept;
  SafetyFilter& operator=(const SafetyFilter&) = delete;
  ~SafetyFilter();

  // score = 1000 * sum(weight * non-overlapping matches of each entry) / max(words, kSafetyMinWords).
  // `hits` (when given, one slot per entry) gets each entry's match count added.
  double score(std::string_view text, std::vector<uint64_t>* hits = nullptr);
  const std::vector<SafetyEntry>& entries() const { return entries_; }

  struct Database;

 private:
  std::vector<SafetyEntry> entries_;
  std::shared_ptr<const Database> db_;
  ::hs_scratch* scratch_ = nullptr;
  std::vector<uint64_t> counts_, last_end_;
};

// Parses a safety list (the format above); errors name `origin` and the line.
std::vector<SafetyEntry> parse_safety_list(std::string_view text, const std::string& origin);

// Removes documents scoring above options.threshold. Returns the stage's counters (per domain: removed,
// documents with a match; the entries matched most often).
Json safety_filter(Corpus& corpus, SafetyFilter& filter, const SafetyOptions& options);

}  // namespace forge::data
