#include "forge/dataio/pii.h"

#include "forge/common/error.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/text.h"

#include <arpa/inet.h>
#include <hs.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

namespace forge::data {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alpha(char c) {
  return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}
bool is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}
bool is_token_char(char c) {
  return is_alnum(c) || c == '_';
}

// True when punctuation c next to a candidate joins it to `neighbour` into a larger figure or name:
// '.', '-' or '/' next to a letter or digit (1.2.3.4.5, 2024-01-15, aix-6107-1415-32, a/b), ':' next to a
// digit (10:30:00; "tel:" and "mailto:" do not join).
bool joins(char c, char neighbour) {
  if (c == ':') return is_digit(neighbour);
  return (c == '.' || c == '-' || c == '/') && is_alnum(neighbour);
}

// True when [b, e) is not a piece of a larger token, figure or name.
bool standalone(std::string_view t, size_t b, size_t e, bool port_may_follow = false) {
  if (b > 0) {
    const char c = t[b - 1];
    if (is_token_char(c)) return false;
    if (b > 1 && joins(c, t[b - 2])) return false;
  }
  if (e < t.size()) {
    const char c = t[e];
    if (is_token_char(c)) return false;
    if (!(port_may_follow && c == ':') && e + 1 < t.size() && joins(c, t[e + 1])) return false;
  }
  return true;
}

// strchr finds the terminating NUL too, so NUL is tested apart.
bool in_set(const char* set, char c) {
  return c != '\0' && std::strchr(set, c) != nullptr;
}

// What a pattern's candidate is checked as.
enum class Check { kEmail, kPhone, kIpv4, kIpv6, kCard, kToken, kJwt, kPrivateKey };

struct PiiPattern {
  const char* regex;
  PiiType type;
  Check check;
  size_t prefix = 0;           // kToken: bytes of the known prefix
  const char* body = nullptr;  // kToken: the characters a body may continue with
  size_t max_body = 0;         // kToken: longest body
};

constexpr const char* kBase62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
constexpr const char* kBase64Url = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";
constexpr const char* kBase62Underscore = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_";
constexpr const char* kBase62Dash = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-";
constexpr const char* kUpperDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

// Token patterns match the prefix and the shortest body; the check extends the body over its characters.
const PiiPattern kPiiPatterns[] = {
    // The '@' with its neighbours; the check extends over the local part and the host name.
    {R"([A-Za-z0-9_%+\-]@[A-Za-z0-9\-]+\.[A-Za-z]{2})", PiiType::kEmail, Check::kEmail},
    // Plain: groups joined by '-' or '.' (555-123-4567, 1-800-555-0199, 555.123.4567).
    {R"([0-9]{1,4}(?:[\-.][0-9]{2,4}){2,4})", PiiType::kPhone, Check::kPhone},
    // International (+44 20 7946 0958, +1 (555) 123-4567, +4930123456).
    {R"(\+[0-9][0-9 ().\-]{6,20}[0-9])", PiiType::kPhone, Check::kPhone},
    // Area code in parentheses ((555) 123-4567).
    {R"(\([0-9]{2,4}\) ?[0-9]{2,4}[ .\-]?[0-9]{2,5})", PiiType::kPhone, Check::kPhone},
    {R"([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})", PiiType::kIp, Check::kIpv4},
    {R"([0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,7})", PiiType::kIp, Check::kIpv6},
    {R"([0-9](?:[ \-]?[0-9]){12,18})", PiiType::kCard, Check::kCard},
    {R"(A[KS]IA[0-9A-Z]{16})", PiiType::kSecret, Check::kToken, 4, kUpperDigits, 16},
    {R"(gh[pousr]_[A-Za-z0-9]{36})", PiiType::kSecret, Check::kToken, 4, kBase62, 255},
    {R"(github_pat_[A-Za-z0-9_]{22})", PiiType::kSecret, Check::kToken, 11, kBase62Underscore, 255},
    {R"(sk-[A-Za-z0-9_\-]{20})", PiiType::kSecret, Check::kToken, 3, kBase64Url, 255},
    {R"([sr]k_live_[A-Za-z0-9]{20})", PiiType::kSecret, Check::kToken, 8, kBase62, 255},
    {R"(xox[baprs]-[A-Za-z0-9\-]{10})", PiiType::kSecret, Check::kToken, 5, kBase62Dash, 255},
    {R"(AIza[A-Za-z0-9_\-]{35})", PiiType::kSecret, Check::kToken, 4, kBase64Url, 35},
    // A JSON Web Token: base64url JSON header and payload ("eyJ" = '{"'), then the signature.
    {R"(eyJ[A-Za-z0-9_\-]{8})", PiiType::kSecret, Check::kJwt, 3, kBase64Url, 4096},
    {R"(-----BEGIN [A-Z0-9 ]{0,30}PRIVATE KEY-----)", PiiType::kSecret, Check::kPrivateKey},
};

// A secret's body must look random: a letter and a digit, and a Shannon entropy (bits per character) of at
// least 70% of the most its length and character classes allow. Words after a prefix ("sk-your-key-here")
// and repeated filler fail; 16 random characters of an AWS key id pass.
bool looks_random(std::string_view body) {
  std::array<uint32_t, 256> count{};
  bool digit = false, lower = false, upper = false, other = false;
  for (const char c : body) {
    ++count[static_cast<unsigned char>(c)];
    digit |= is_digit(c);
    lower |= c >= 'a' && c <= 'z';
    upper |= c >= 'A' && c <= 'Z';
    other |= !is_alnum(c);
  }
  if (!digit || !(lower || upper)) return false;
  double h = 0;
  for (const uint32_t n : count) {
    if (n == 0) continue;
    const double p = double(n) / double(body.size());
    h -= p * std::log2(p);
  }
  const double alphabet = 10.0 + 26.0 * lower + 26.0 * upper + 2.0 * other;
  return h >= 0.7 * std::log2(std::min(double(body.size()), alphabet));
}

bool luhn(std::string_view digits) {
  int sum = 0;
  bool twice = false;
  for (size_t i = digits.size(); i-- > 0;) {
    int d = digits[i] - '0';
    if (twice && (d *= 2) > 9) d -= 9;
    sum += d;
    twice = !twice;
  }
  return sum % 10 == 0;
}

// Issuer prefixes and lengths of the card networks (Visa, Mastercard, Amex, Discover, JCB, Diners), so a
// long number that happens to pass Luhn (one in ten do) is not taken for a card unless it looks like one.
bool card_network(std::string_view d) {
  const auto prefix = [&](size_t n) { return std::stoi(std::string(d.substr(0, n))); };
  const size_t len = d.size();
  if (d[0] == '4') return len == 13 || len == 16 || len == 19;
  const int p2 = prefix(2), p4 = prefix(4);
  if ((p2 >= 51 && p2 <= 55) || (p4 >= 2221 && p4 <= 2720)) return len == 16;
  if (p2 == 34 || p2 == 37) return len == 15;
  if (p4 == 6011 || p2 == 65 || (prefix(3) >= 644 && prefix(3) <= 649)) return len >= 16;
  if (p2 == 35) return len >= 16;
  if (p2 == 36 || p2 == 38 || p2 == 30) return len >= 14;
  return false;
}

bool check_card(std::string_view c) {
  std::string digits;
  char sep = 0;
  size_t group = 0, shortest_group = SIZE_MAX;
  for (const char ch : c) {
    if (is_digit(ch)) {
      digits.push_back(ch);
      ++group;
      continue;
    }
    if (sep != 0 && ch != sep) return false;  // "4111 1111-1111 1111" is not how cards are written
    sep = ch;
    shortest_group = std::min(shortest_group, group);
    group = 0;
  }
  if (sep != 0 && std::min(shortest_group, group) < 3) return false;
  return digits.size() >= 13 && digits.size() <= 19 && card_network(digits) && luhn(digits);
}

bool check_ipv4(std::string_view t, size_t b, size_t e) {
  std::array<int, 4> octet{};
  size_t k = 0;
  for (size_t i = b; i < e; ++i) {
    if (t[i] == '.') {
      ++k;
      continue;
    }
    // A leading zero ("01") is how versions and dates are written, not addresses.
    if (t[i] == '0' && (i == b || t[i - 1] == '.') && i + 1 < e && is_digit(t[i + 1])) return false;
    octet[k] = octet[k] * 10 + (t[i] - '0');
  }
  if (std::any_of(octet.begin(), octet.end(), [](int o) { return o > 255; })) return false;
  // 0.x, loopback, multicast, reserved and netmasks (255.x) name no one's host, nor does a network
  // address (x.x.x.0).
  if (octet[0] == 0 || octet[0] == 127 || octet[0] >= 224 || octet[3] == 0) return false;
  // Two single-digit leading octets ("3.1.2.5", "8.2.4.44") are far more often a version or a section
  // number than a host; the hosts given up this way are few (1-9.0-9.x.x) and include the public
  // resolvers 1.1.1.1 and 8.8.8.8, which are no one's.
  if (octet[0] < 10 && octet[1] < 10) return false;
  // "v1.2.3.4", "version 1.2.3.4", "release 1.2.3.4": a version, not an address.
  size_t i = b;
  while (i > 0 && t[i - 1] == ' ') --i;
  size_t w = i;
  while (w > 0 && is_alpha(t[w - 1])) --w;
  std::string word(t.substr(w, i - w));
  for (char& ch : word) ch = static_cast<char>(ch | 0x20);
  return word != "version" && word != "ver" && word != "release" && word != "v" && word != "section" &&
         word != "rfc";
}

bool check_ipv6(std::string_view c) {
  if (c.size() > 39) return false;
  int groups = 0;
  for (size_t i = 0; i < c.size();) {
    const size_t j = std::min(c.find(':', i), c.size());
    groups += j > i;
    i = j + 1;
  }
  // Two groups are C++ scopes ("abc::def") as often as addresses; "::1" and "::" are loopback and none.
  if (groups < 3) return false;
  in6_addr addr{};
  return ::inet_pton(AF_INET6, std::string(c).c_str(), &addr) == 1;
}

bool date_like(int a, int b, int c, size_t la, size_t lc) {
  const auto month = [](int m) { return m >= 1 && m <= 12; };
  const auto day = [](int d) { return d >= 1 && d <= 31; };
  if (la == 4) return month(b) && day(c);                            // 2024-01-15
  return lc == 4 && ((month(b) && day(a)) || (month(a) && day(b)));  // 15-01-2024, 01-15-2024
}

bool check_phone(std::string_view c) {
  std::vector<std::string_view> groups;
  std::string seps;  // the separator characters, in order
  bool plus = false, parens = false;
  for (size_t i = 0; i < c.size();) {
    if (is_digit(c[i])) {
      size_t j = i;
      while (j < c.size() && is_digit(c[j])) ++j;
      groups.push_back(c.substr(i, j - i));
      i = j;
      continue;
    }
    if (c[i] == '+') {
      if (i != 0) return false;
      plus = true;
    } else if (c[i] == '(' || c[i] == ')') {
      parens = true;
    } else {
      seps.push_back(c[i]);
    }
    ++i;
  }
  size_t digits = 0;
  for (auto g : groups) digits += g.size();
  if (digits > 15 || digits < (plus ? 8u : 10u)) return false;
  if (std::count(c.begin(), c.end(), '(') != std::count(c.begin(), c.end(), ')')) return false;
  // Without a country code or an area code in parentheses, a phone number is at least three groups joined
  // by '-' or '.', one of them throughout; "555 123 4567" is as likely a row of figures.
  if (!plus && !parens) {
    if (groups.size() < 3 || seps.find(' ') != std::string::npos) return false;
    if (seps.find_first_not_of(seps[0]) != std::string::npos) return false;
  }
  for (size_t g = 1; g < groups.size(); ++g)
    if (groups[g].size() < 2) return false;  // "1.5 2.5 3.5", "10.0.19041.1"
  // Coordinates and decimals ("+45.25919444444"): a number written with dots has short groups.
  if (seps.find('.') != std::string::npos &&
      std::any_of(groups.begin(), groups.end(), [](auto g) { return g.size() > 4; }))
    return false;
  // Four dotted groups of up to three digits are an IPv4 address (or a version), whether or not the ip
  // type is enabled.
  if (groups.size() == 4 && seps == "..." &&
      std::all_of(groups.begin(), groups.end(), [](auto g) { return g.size() <= 3; }))
    return false;
  if (groups.size() >= 3) {
    const auto num = [&](size_t g) { return std::stoi(std::string(groups[g].substr(0, 4))); };
    if (date_like(num(0), num(1), num(2), groups[0].size(), groups[2].size())) return false;
  }
  return true;
}

bool is_local_char(char c) {
  return is_alnum(c) || in_set("._%+-", c);
}
bool is_host_char(char c) {
  return is_alnum(c) || c == '-' || c == '.';
}

// Extends the candidate around its '@' (at b + 1) to the whole address: a local part of at most 64
// characters, not starting or ending with '.' nor holding "..", and a host name whose last label is 2-24
// letters.
bool check_email(std::string_view t, size_t& b, size_t& e) {
  const size_t at = b + 1;
  size_t l = at;
  while (l > 0 && is_local_char(t[l - 1])) --l;
  if (at - l > 64 || (l > 0 && t[l - 1] == '/')) return false;  // a URL path, not an address
  size_t r = at + 1;
  while (r < t.size() && is_host_char(t[r])) ++r;
  while (r > at + 1 && (t[r - 1] == '.' || t[r - 1] == '-')) --r;
  if (r < t.size() && t[r] == '@') return false;
  const std::string_view local = t.substr(l, at - l), host = t.substr(at + 1, r - at - 1);
  const size_t dot = host.rfind('.');
  if (local.front() == '.' || local.back() == '.' || local.find("..") != std::string_view::npos ||
      dot == std::string_view::npos || host.find("..") != std::string_view::npos)
    return false;
  const std::string_view tld = host.substr(dot + 1);
  if (tld.size() < 2 || tld.size() > 24 || !std::all_of(tld.begin(), tld.end(), is_alpha)) return false;
  b = l;
  e = r;
  return true;
}

// The end of a PEM private key block starting at b: past its END line, else past its base64 lines.
size_t private_key_end(std::string_view t, size_t b) {
  const size_t end = t.find("-----END ", b);
  if (end != std::string_view::npos && end - b < (64u << 10)) {
    const size_t close = t.find("PRIVATE KEY-----", end);
    if (close != std::string_view::npos && close - end < 64) return close + 16;
  }
  size_t e = t.find('\n', b);
  while (e != std::string_view::npos && e + 1 < t.size()) {
    const size_t next = std::min(t.find('\n', e + 1), t.size());
    const std::string_view line = t.substr(e + 1, next - e - 1);
    if (line.empty() ||
        line.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") !=
            std::string_view::npos)
      break;
    e = next;
  }
  return e == std::string_view::npos ? t.size() : e;
}

// The validated extent of a candidate [b, e) of pattern p, or false.
bool validate(const PiiPattern& p, std::string_view t, size_t& b, size_t& e) {
  switch (p.check) {
    case Check::kEmail:
      return check_email(t, b, e);
    case Check::kPhone:
      // A '(' before the first group without its ')' belongs to the prose: "(call 555-123-4567)".
      if (t[b] == '(' && t.substr(b, e - b).find(')') == std::string_view::npos) ++b;
      return standalone(t, b, e) && check_phone(t.substr(b, e - b));
    case Check::kIpv4:
      return standalone(t, b, e, /*port_may_follow=*/true) && check_ipv4(t, b, e);
    case Check::kIpv6:
      return (b == 0 || (!is_token_char(t[b - 1]) && t[b - 1] != ':' && t[b - 1] != '.')) &&
             (e == t.size() || (!is_token_char(t[e]) && t[e] != ':' && t[e] != '.')) &&
             check_ipv6(t.substr(b, e - b));
    case Check::kCard:
      return standalone(t, b, e) && check_card(t.substr(b, e - b));
    case Check::kToken: {
      if (b > 0 && is_alnum(t[b - 1])) return false;  // "disk-…" holds "sk-"
      const size_t limit = std::min(t.size(), b + p.prefix + p.max_body);
      while (e < limit && in_set(p.body, t[e])) ++e;
      if (e < t.size() && is_alnum(t[e])) return false;  // longer than any such key
      return looks_random(t.substr(b + p.prefix, e - b - p.prefix));
    }
    case Check::kJwt: {
      // Three base64url segments joined by '.', the second a JSON payload too.
      if (b > 0 && is_alnum(t[b - 1])) return false;
      size_t dots = 0, seg = b;
      while (e < t.size() && (in_set(p.body, t[e]) || t[e] == '.')) {
        if (t[e] == '.') {
          if (++dots > 2 || e == seg) return false;
          seg = e + 1;
        }
        ++e;
      }
      return dots == 2 && e > seg && t.compare(t.find('.', b) + 1, 3, "eyJ") == 0 &&
             looks_random(t.substr(b + p.prefix, e - b - p.prefix));
    }
    case Check::kPrivateKey:
      e = private_key_end(t, b);
      return true;
  }
  return false;
}

// One compiled database of patterns, or a usage error naming the pattern that does not compile.
hs_database_t* compile(const std::vector<std::string>& regexes, unsigned flags,
                       const std::function<std::string(size_t, const char*)>& on_error) {
  std::vector<const char*> exprs;
  std::vector<unsigned> ids(regexes.size()), flag(regexes.size(), flags);
  for (const auto& r : regexes) exprs.push_back(r.c_str());
  std::iota(ids.begin(), ids.end(), 0u);
  hs_database_t* db = nullptr;
  hs_compile_error_t* err = nullptr;
  if (hs_compile_multi(exprs.data(), flag.data(), ids.data(), static_cast<unsigned>(exprs.size()),
                       HS_MODE_BLOCK, nullptr, &db, &err) != HS_SUCCESS) {
    std::string why = err->message;
    if (!why.empty() && why.back() == '.') why.pop_back();  // the message goes inside a sentence
    const std::string message = on_error(err->expression < 0 ? 0 : size_t(err->expression), why.c_str());
    hs_free_compile_error(err);
    throw Error(ExitCode::kUsage, message);
  }
  return db;
}

hs_scratch_t* alloc_scratch(const hs_database_t* db) {
  hs_scratch_t* s = nullptr;
  if (hs_alloc_scratch(db, &s) != HS_SUCCESS) throw std::bad_alloc();
  return s;
}

hs_scratch_t* clone_scratch(const hs_scratch_t* from) {
  hs_scratch_t* s = nullptr;
  if (hs_clone_scratch(from, &s) != HS_SUCCESS) throw std::bad_alloc();
  return s;
}

void scan(const hs_database_t* db, std::string_view text, hs_scratch_t* scratch, match_event_handler on,
          void* context) {
  if (text.size() > UINT_MAX)
    fail(ExitCode::kData,
         "a document of {} bytes is over the scanner's 4 GiB limit; lower ingest.max_doc_bytes", text.size());
  if (hs_scan(db, text.data(), static_cast<unsigned>(text.size()), 0, scratch, on, context) != HS_SUCCESS)
    throw std::runtime_error("hs_scan failed");
}

}  // namespace

const char* pii_type_name(PiiType type) {
  static constexpr const char* kNames[] = {"secret", "card", "email", "ip", "phone"};
  return kNames[static_cast<size_t>(type)];
}

const char* pii_placeholder(PiiType type) {
  static constexpr const char* kPlaceholders[] = {"<SECRET>", "<CARD>", "<EMAIL>", "<IP>", "<PHONE>"};
  return kPlaceholders[static_cast<size_t>(type)];
}

PiiType pii_type_from_name(std::string_view name, const std::string& where) {
  for (size_t i = 0; i < kPiiTypes; ++i)
    if (name == pii_type_name(PiiType(i))) return PiiType(i);
  fail(ExitCode::kUsage, "{}: unknown PII type '{}'; use email, phone, ip, card or secret", where, name);
}

struct PiiScanner::Candidate {
  size_t begin, end;
  uint32_t pattern;
};

struct PiiScanner::Database {
  hs_database_t* db = nullptr;
  ~Database() { hs_free_database(db); }
};

PiiScanner::PiiScanner() {
  auto db = std::make_shared<Database>();
  db->db = compile(pii_pattern_regexes(), HS_FLAG_SOM_LEFTMOST, [](size_t i, const char* why) {
    return fmt::format("built-in PII pattern {} does not compile: {}", kPiiPatterns[i].regex, why);
  });
  scratch_ = alloc_scratch(db->db);
  db_ = std::move(db);
}

PiiScanner::PiiScanner(const PiiScanner& other) : db_(other.db_), scratch_(clone_scratch(other.scratch_)) {}

PiiScanner::~PiiScanner() {
  hs_free_scratch(scratch_);
}

void PiiScanner::find(std::string_view text, const std::array<bool, kPiiTypes>& types,
                      std::vector<PiiMatch>& out) {
  out.clear();
  candidates_.clear();
  const auto on_match = [](unsigned id, unsigned long long from, unsigned long long to, unsigned,
                           void* ctx) -> int {
    static_cast<std::vector<Candidate>*>(ctx)->push_back({size_t(from), size_t(to), id});
    return 0;
  };
  scan(db_->db, text, scratch_, on_match, &candidates_);
  for (const Candidate& c : candidates_) {
    const PiiPattern& p = kPiiPatterns[c.pattern];
    if (!types[static_cast<size_t>(p.type)]) continue;
    size_t b = c.begin, e = c.end;
    if (validate(p, text, b, e)) out.push_back({b, e, p.type});
  }
  std::sort(out.begin(), out.end(), [](const PiiMatch& x, const PiiMatch& y) {
    if (x.begin != y.begin) return x.begin < y.begin;
    if (x.end != y.end) return x.end > y.end;
    return x.type < y.type;
  });
  size_t kept = 0, covered = 0;
  for (const PiiMatch& m : out)
    if (kept == 0 || m.begin >= covered) {
      out[kept++] = m;
      covered = m.end;
    }
  out.resize(kept);
}

std::vector<std::string> pii_pattern_regexes() {
  std::vector<std::string> out;
  for (const auto& p : kPiiPatterns) out.emplace_back(p.regex);
  return out;
}

std::string redact_pii(std::string_view text, const std::vector<PiiMatch>& matches) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  for (const PiiMatch& m : matches) {
    out.append(text.substr(at, m.begin - at));
    out.append(pii_placeholder(m.type));
    at = m.end;
  }
  out.append(text.substr(at));
  return out;
}

void EncodingCounts::add(std::string_view t) {
  const size_t n = t.size();
  size_t i = 0;
  // Skips to the next line after a counted one: each line counts once.
  const auto next_line = [&](uint64_t& counter) {
    ++counter;
    const size_t nl = t.find('\n', i);
    i = nl == std::string_view::npos ? n : nl + 1;
  };
  while (i < n) {
    // ASCII eight bytes at a time.
    uint64_t word;
    if (i + 8 <= n && (std::memcpy(&word, t.data() + i, 8), (word & 0x8080808080808080ull) == 0)) {
      i += 8;
      continue;
    }
    const auto c = static_cast<unsigned char>(t[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(t[i + k]) & 0xC0) == 0x80;
    if (ok && len >= 3) {
      const auto c1 = static_cast<unsigned char>(t[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F) && !(c == 0xF0 && c1 < 0x90) &&
           !(c == 0xF4 && c1 > 0x8F);
    }
    if (!ok) {
      next_line(invalid_utf8_lines);
    } else if (len == 3 && t.compare(i, 3, "\xEF\xBF\xBD") == 0) {
      next_line(replacement_char_lines);
    } else {
      i += len;
    }
  }
}

Json EncodingCounts::to_json() const {
  return {{"invalid_utf8", invalid_utf8_lines}, {"replacement_char", replacement_char_lines}};
}

Json redact_pii(Corpus& corpus, PiiScanner& scanner, const PiiOptions& o) {
  std::vector<PiiMatch> matches;
  std::array<uint64_t, kPiiTypes> total{};
  struct PerDomain {
    std::array<uint64_t, kPiiTypes> found{};
    uint64_t documents = 0, with_pii = 0;
  };
  std::vector<PerDomain> per_domain(corpus.domains.size());
  EncodingCounts encoding;
  uint64_t changed = 0, dropped = 0;
  ProgressLine progress("prepare pii", "docs");
  size_t kept = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    Document& d = corpus.docs[i];
    progress.add(1, d.text.size());
    encoding.add(d.text);
    scanner.find(d.text, o.types, matches);
    PerDomain& pd = per_domain[d.domain];
    ++pd.documents;
    for (const PiiMatch& m : matches) {
      ++total[size_t(m.type)];
      ++pd.found[size_t(m.type)];
    }
    if (!matches.empty()) {
      ++pd.with_pii;
      if (o.drop) {
        ++dropped;
        continue;
      }
      d.text = redact_pii(d.text, matches);
      ++changed;
    }
    if (kept != i) corpus.docs[kept] = std::move(d);
    ++kept;
  }
  corpus.docs.resize(kept);
  progress.finish();
  const auto by_type = [](const std::array<uint64_t, kPiiTypes>& n) {
    Json j = Json::object();
    for (size_t t = 0; t < kPiiTypes; ++t) j[pii_type_name(PiiType(t))] = n[t];
    return j;
  };
  Json domains = Json::object();
  for (size_t dom = 0; dom < per_domain.size(); ++dom) {
    const PerDomain& pd = per_domain[dom];
    if (pd.documents == 0) continue;
    domains[corpus.domains[dom]] = {{"documents", pd.documents},
                                    {"documents_with_pii", pd.with_pii},
                                    {o.drop ? "removed" : "redacted", pd.with_pii},
                                    {"found", by_type(pd.found)}};
  }
  Json types = Json::array();
  for (size_t t = 0; t < kPiiTypes; ++t)
    if (o.types[t]) types.push_back(pii_type_name(PiiType(t)));
  return {{"rules", kPiiRules},
          {"action", o.drop ? "drop" : "redact"},
          {"types", types},
          {"found", by_type(total)},
          {"documents_redacted", changed},
          {"removed", {{"pii_drop", dropped}}},
          {"by_domain", domains},
          {"unknown_encoding_lines", encoding.to_json()},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

// ---- safety

std::vector<SafetyEntry> parse_safety_list(std::string_view text, const std::string& origin) {
  std::vector<SafetyEntry> entries;
  int line_no = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line[first] == '#') continue;
    SafetyEntry e;
    e.line = line_no;
    const size_t tab = line.rfind('\t');
    if (tab != std::string_view::npos && tab > first) {
      const std::string w(line.substr(tab + 1));
      char* end = nullptr;
      e.weight = std::strtod(w.c_str(), &end);
      if (w.empty() || *end != '\0' || !(e.weight > 0) || !std::isfinite(e.weight))
        fail(ExitCode::kUsage,
             "safety list {}:{}: weight '{}' is not a positive number; write ENTRY<TAB>WEIGHT", origin,
             line_no, w);
      line = line.substr(0, tab);
    }
    line = line.substr(first);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    e.regex = line.substr(0, 3) == "re:";
    e.text = std::string(e.regex ? line.substr(3) : line);
    if (e.text.empty())
      fail(ExitCode::kUsage, "safety list {}:{}: empty {}; remove the line", origin, line_no,
           e.regex ? "regex after 're:'" : "entry");
    entries.push_back(std::move(e));
  }
  return entries;
}

struct SafetyFilter::Database {
  hs_database_t* db = nullptr;
  ~Database() { hs_free_database(db); }
};

namespace {

// A word or phrase as a pattern: literal characters, any whitespace between words, word boundaries where
// the entry starts or ends with a word character ("bomb" does not match "bombay").
std::string phrase_regex(const std::string& phrase) {
  std::string r;
  if (is_token_char(phrase.front())) r += "\\b";
  for (size_t i = 0; i < phrase.size(); ++i) {
    const char c = phrase[i];
    if (c == ' ' || c == '\t') {
      if (r.size() < 3 || r.compare(r.size() - 3, 3, "\\s+") != 0) r += "\\s+";
    } else if (is_alnum(c) || static_cast<unsigned char>(c) >= 0x80) {
      r.push_back(c);
    } else {
      r.push_back('\\');
      r.push_back(c);
    }
  }
  if (is_token_char(phrase.back())) r += "\\b";
  return r;
}

}  // namespace

SafetyFilter SafetyFilter::load(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    fail(ExitCode::kUsage, "safety.list {}: cannot be read ({}); give a readable list file", path, e.what());
  }
  return SafetyFilter(parse_safety_list(text, path), path);
}

SafetyFilter::SafetyFilter(std::vector<SafetyEntry> entries, const std::string& origin)
    : entries_(std::move(entries)) {
  if (entries_.empty())
    fail(ExitCode::kUsage, "safety list {}: no entries; add some or leave safety.list empty", origin);
  std::vector<std::string> regexes;
  for (const auto& e : entries_) regexes.push_back(e.regex ? e.text : phrase_regex(e.text));
  auto db = std::make_shared<Database>();
  db->db = compile(regexes, HS_FLAG_SOM_LEFTMOST | HS_FLAG_CASELESS, [&](size_t i, const char* why) {
    return fmt::format("safety list {}:{}: '{}' does not compile: {}; fix or remove the line", origin,
                       entries_[i].line, entries_[i].text, why);
  });
  scratch_ = alloc_scratch(db->db);
  db_ = std::move(db);
  counts_.resize(entries_.size());
  last_end_.resize(entries_.size());
}

SafetyFilter::SafetyFilter(const SafetyFilter& other)
    : entries_(other.entries_),
      db_(other.db_),
      scratch_(clone_scratch(other.scratch_)),
      counts_(other.counts_.size()),
      last_end_(other.last_end_.size()) {}

SafetyFilter::SafetyFilter(SafetyFilter&& other) noexcept
    : entries_(std::move(other.entries_)),
      db_(std::move(other.db_)),
      scratch_(std::exchange(other.scratch_, nullptr)),
      counts_(std::move(other.counts_)),
      last_end_(std::move(other.last_end_)) {}

SafetyFilter::~SafetyFilter() {
  hs_free_scratch(scratch_);
}

double SafetyFilter::score(std::string_view text, std::vector<uint64_t>* hits) {
  std::fill(counts_.begin(), counts_.end(), 0);
  std::fill(last_end_.begin(), last_end_.end(), 0);
  uint64_t any = 0;
  struct Ctx {
    SafetyFilter* self;
    uint64_t* any;
  } ctx{this, &any};
  // Each entry counts its non-overlapping matches: a regex that matches at several ends of one occurrence
  // ("a+" on "aaa") counts it once.
  const auto on_match = [](unsigned id, unsigned long long from, unsigned long long to, unsigned,
                           void* p) -> int {
    auto& c = *static_cast<Ctx*>(p);
    if (c.self->counts_[id] > 0 && from < c.self->last_end_[id]) return 0;
    ++c.self->counts_[id];
    c.self->last_end_[id] = to;
    ++*c.any;
    return 0;
  };
  scan(db_->db, text, scratch_, on_match, &ctx);
  if (any == 0) return 0;
  double weighted = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    weighted += entries_[i].weight * double(counts_[i]);
    if (hits) (*hits)[i] += counts_[i];
  }
  uint64_t words = 0;
  for_each_word(text, [&](std::string_view) { ++words; });
  return 1000.0 * weighted / double(std::max(words, kSafetyMinWords));
}

Json safety_filter(Corpus& corpus, SafetyFilter& filter, const SafetyOptions& o) {
  struct PerDomain {
    uint64_t documents = 0, with_matches = 0, removed = 0;
  };
  std::vector<PerDomain> per_domain(corpus.domains.size());
  std::vector<uint64_t> hits(filter.entries().size());
  EncodingCounts encoding;
  uint64_t removed = 0;
  double max_score = 0;
  ProgressLine progress("prepare safety", "docs");
  size_t kept = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    Document& d = corpus.docs[i];
    progress.add(1, d.text.size());
    encoding.add(d.text);
    const double s = filter.score(d.text, &hits);
    PerDomain& pd = per_domain[d.domain];
    ++pd.documents;
    pd.with_matches += s > 0;
    max_score = std::max(max_score, s);
    if (s > o.threshold) {
      ++pd.removed;
      ++removed;
      continue;
    }
    if (kept != i) corpus.docs[kept] = std::move(d);
    ++kept;
  }
  corpus.docs.resize(kept);
  progress.finish();
  Json domains = Json::object();
  for (size_t dom = 0; dom < per_domain.size(); ++dom)
    if (per_domain[dom].documents > 0)
      domains[corpus.domains[dom]] = {{"documents", per_domain[dom].documents},
                                      {"documents_with_matches", per_domain[dom].with_matches},
                                      {"removed", per_domain[dom].removed}};
  // The entries that matched most, for tuning the list and its weights.
  std::vector<size_t> order(hits.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return hits[a] > hits[b]; });
  Json top = Json::array();
  for (size_t k = 0; k < std::min<size_t>(10, order.size()) && hits[order[k]] > 0; ++k) {
    const SafetyEntry& e = filter.entries()[order[k]];
    top.push_back(
        {{"entry", (e.regex ? "re:" : "") + e.text}, {"line", e.line}, {"matches", hits[order[k]]}});
  }
  return {{"list", o.list},
          {"entries", filter.entries().size()},
          {"threshold", o.threshold},
          {"score", "1000 * sum(weight * matches) / max(words, 100)"},
          {"max_score", max_score},
          {"removed", {{"safety_threshold", removed}}},
          {"by_domain", domains},
          {"top_entries", top},
          {"unknown_encoding_lines", encoding.to_json()},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
