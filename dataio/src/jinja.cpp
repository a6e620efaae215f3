// The Jinja2 subset of jinja.h. The lexer follows jinja2's (lexer.py: the same regular expressions,
// whitespace control, trim_blocks/lstrip_blocks and line_starting rule), the parser its grammar
// (parser.py: precedence, tests with one bare argument, `for ... if`), and values Python's semantics, since
// the reference is transformers rendering with jinja2 under CPython: the text must match byte for byte.
#include "forge/dataio/jinja.h"

#include "forge/common/error.h"

#include <fmt/format.h>
#include <locale.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <cwctype>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace forge::data {
namespace {

// Thrown inside the engine; line 0 means "the line being rendered". render() and the constructor turn it
// into forge::Error(kData) "<where> line N: <message>".
struct TemplateError {
  int line = 0;
  std::string message;
};

[[noreturn]] void fail(std::string message, int line = 0) {
  throw TemplateError{line, std::move(message)};
}

// ---- UTF-8 and Python's character classes ----

// Decodes the code point at s[i] and advances i. A byte that does not start a valid sequence decodes as
// U+DC80+byte (Python's surrogateescape) so that encoding gives the same bytes back.
uint32_t decode_utf8(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3;
    cp = b0 & 0x07;
  } else {
    ++i;
    return 0xDC00 + b0;
  }
  if (i + static_cast<size_t>(n) >= s.size()) {
    ++i;
    return 0xDC00 + b0;
  }
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xDC00 + b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return 0xDC00 + b0;
  }
  i += static_cast<size_t>(n) + 1;
  return cp;
}

void encode_utf8(uint32_t cp, std::string& out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // an undecodable byte, back as it was
    out += static_cast<char>(cp - 0xDC00);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(decode_utf8(s, i));
  return cps;
}

std::string from_code_points(std::span<const uint32_t> cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) encode_utf8(cp, out);
  return out;
}

// The byte offset of each code point of `s`, and s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    decode_utf8(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode_utf8(s, i);
  return n;
}

// str.isspace(), which is also what `\s` matches in jinja2's regular expressions.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// str.splitlines()'s line boundaries.
bool py_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

// Skips Python whitespace from s[i]; returns the first position after it.
size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!py_space(decode_utf8(s, j))) break;
    i = j;
  }
  return i;
}

// str.strip / lstrip / rstrip: `chars` (code points) or, when absent, whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  auto strip_it = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(std::span(cps).subspan(b, e - b));
}

// Case mapping through the C library's tables (C.UTF-8): Unicode's one-to-one mappings.
locale_t utf8_locale() {
  static const locale_t locale = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    return l;
  }();
  return locale;
}

uint32_t to_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xD800 && c <= 0xDFFF) return c;
  locale_t l = utf8_locale();
  return l != nullptr ? static_cast<uint32_t>(towupper_l(static_cast<wint_t>(c), l)) : c;
}

uint32_t to_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xD800 && c <= 0xDFFF) return c;
  locale_t l = utf8_locale();
  return l != nullptr ? static_cast<uint32_t>(towlower_l(static_cast<wint_t>(c), l)) : c;
}

bool is_upper(uint32_t c) {
  return to_lower(c) != c;
}
// Lower-case letters whose upper case is several characters (ß, ligatures) have no one-to-one mapping.
bool is_lower(uint32_t c) {
  return to_upper(c) != c || c == 0x00DF || c == 0x0149 || c == 0x01F0 || c == 0x0587 ||
         (c >= 0xFB00 && c <= 0xFB06);
}
bool is_cased(uint32_t c) {
  return is_upper(c) || is_lower(c);
}

bool is_alpha(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  locale_t l = utf8_locale();
  return l != nullptr && (c < 0xD800 || c > 0xDFFF) && iswalpha_l(static_cast<wint_t>(c), l) != 0;
}

bool is_digit(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  locale_t l = utf8_locale();
  return l != nullptr && (c < 0xD800 || c > 0xDFFF) && iswdigit_l(static_cast<wint_t>(c), l) != 0;
}

// Python's full case mappings: the C library's one-to-one tables plus Unicode's unconditional
// one-to-many mappings (SpecialCasing.txt: "ß" -> "SS", ligatures, "İ" -> "i̇"), the title-case digraphs
// and the final sigma.
enum class Case : uint8_t { kUpper, kLower, kTitle };

void append_case(std::span<const uint32_t> cps, size_t k, Case want, std::string& out) {
  const uint32_t c = cps[k];
  struct Special {
    uint32_t cp;
    const char* upper;
    const char* title;
  };
  static constexpr Special kSpecial[] = {
      {0x00DF, "SS", "Ss"},           {0x0149, "\u02BCN", "\u02BCN"},
      {0x01F0, "J\u030C", "J\u030C"}, {0x0587, "\u0535\u0552", "\u0535\u0582"},
      {0xFB00, "FF", "Ff"},           {0xFB01, "FI", "Fi"},
      {0xFB02, "FL", "Fl"},           {0xFB03, "FFI", "Ffi"},
      {0xFB04, "FFL", "Ffl"},         {0xFB05, "ST", "St"},
      {0xFB06, "ST", "St"},
  };
  if (want == Case::kLower) {
    if (c == 0x0130) {  // İ
      out += "i\u0307";
      return;
    }
    if (c == 0x03A3) {  // Σ ends a word as ς
      const bool after_cased = k > 0 && is_cased(cps[k - 1]);
      const bool before_cased = k + 1 < cps.size() && is_cased(cps[k + 1]);
      encode_utf8(after_cased && !before_cased ? 0x03C2 : 0x03C3, out);
      return;
    }
    encode_utf8(to_lower(c), out);
    return;
  }
  for (const Special& sp : kSpecial) {
    if (sp.cp == c) {
      out += want == Case::kUpper ? sp.upper : sp.title;
      return;
    }
  }
  if (want == Case::kTitle) {
    if (c >= 0x01C4 && c <= 0x01CC) {  // Ǆ ǅ ǆ, Ǉ ǈ ǉ, Ǌ ǋ ǌ: the middle one
      encode_utf8(0x01C5 + (c - 0x01C4) / 3 * 3, out);
      return;
    }
    if (c >= 0x01F1 && c <= 0x01F3) {
      encode_utf8(0x01F2, out);
      return;
    }
  }
  encode_utf8(to_upper(c), out);
}

std::string map_case(std::string_view s, Case want) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < cps.size(); ++k) append_case(cps, k, want, out);
  return out;
}

std::string py_upper(std::string_view s) {
  return map_case(s, Case::kUpper);
}
std::string py_lower(std::string_view s) {
  return map_case(s, Case::kLower);
}

// str.capitalize(): the first character title case, the rest lower case.
std::string py_capitalize(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) append_case(cps, k, k == 0 ? Case::kTitle : Case::kLower, out);
  return out;
}

// str.title(): title case after an uncased character, lower case after a cased one.
std::string py_title(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  bool previous_cased = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    append_case(cps, k, previous_cased ? Case::kLower : Case::kTitle, out);
    previous_cased = is_cased(cps[k]);
  }
  return out;
}

// ---- Python's number formatting ----

// repr(float): the shortest digits that round-trip, fixed notation for exponents -4..15, else "1e+16".
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent >= 0) {
      const auto int_len = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, mantissa, exponent < 0 ? '-' : '+', std::abs(exponent));
}

// ---- Values ----

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<Value, Value>>;  // insertion order, as Python's dict
using NamespaceAttrs = std::vector<std::pair<std::string, Value>>;
struct Stmt;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kFunction,
  kLoop
};

struct Function;
struct LoopState;

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;            // kString: the text; kUndefined: the error that using it raises
  std::shared_ptr<void> p;  // kList/kTuple: List, kDict: Dict, kNamespace: NamespaceAttrs,
                            // kFunction: Function, kLoop: LoopState

  static Value undefined(std::string why) {
    Value v;
    v.s = std::move(why);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.kind = Kind::kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::move(x);
    return v;
  }
  static Value list(List items, bool tuple = false) {
    Value v;
    v.kind = tuple ? Kind::kTuple : Kind::kList;
    v.p = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value dict(Dict items) {
    Value v;
    v.kind = Kind::kDict;
    v.p = std::make_shared<Dict>(std::move(items));
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_number() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_integral() const { return kind == Kind::kBool || kind == Kind::kInt; }
  int64_t as_int() const { return kind == Kind::kBool ? static_cast<int64_t>(b) : i; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(as_int()); }
  const List& items() const { return *static_cast<const List*>(p.get()); }
  const Dict& entries() const { return *static_cast<const Dict*>(p.get()); }
  NamespaceAttrs& attrs() const { return *static_cast<NamespaceAttrs*>(p.get()); }
  const Function& function() const { return *static_cast<const Function*>(p.get()); }
  LoopState& loop() const { return *static_cast<LoopState*>(p.get()); }
};

struct Function {
  enum class Type : uint8_t { kGlobal, kMethod, kMacro, kCycle } type = Type::kGlobal;
  std::string name;
  Value self;                   // kMethod: the receiver; kCycle: the loop
  const Stmt* macro = nullptr;  // kMacro
};

struct LoopState {
  std::shared_ptr<const List> items;
  int64_t index0 = 0;
};

Value make_function(Function::Type type, std::string name, Value self = {}, const Stmt* macro = nullptr) {
  Value v;
  v.kind = Kind::kFunction;
  auto fn = std::make_shared<Function>();
  fn->type = type;
  fn->name = std::move(name);
  fn->self = std::move(self);
  fn->macro = macro;
  v.p = std::move(fn);
  return v;
}

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.s);
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return v.function().type == Function::Type::kMacro ? "Macro" : "builtin_function_or_method";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

// jinja2's object_type_repr, for the messages of undefined attributes.
std::string object_type(const Value& v) {
  if (v.kind == Kind::kNone) return "None";
  if (v.kind == Kind::kNamespace) return "jinja2.utils.Namespace object";
  if (v.kind == Kind::kLoop) return "jinja2.runtime.LoopContext object";
  return fmt::format("{} object", type_name(v));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.items().empty();
    case Kind::kDict:
      return !v.entries().empty();
    default:
      return true;
  }
}

std::string py_repr(const Value& v);

// repr(str): single quotes unless the text holds one and no double quote; escapes as CPython's for the
// ASCII controls and the common non-printable code points.
std::string py_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode_utf8(s, i);
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      out += fmt::format("\\udc{:02x}", c - 0xDC00);
    } else if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
               (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
               (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xFFF9 && c <= 0xFFFB)) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      encode_utf8(c, out);
    }
  }
  out += quote;
  return out;
}

// str(value), as jinja2 prints it (an undefined value prints as "").
std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return py_float_repr(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = v.kind == Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      const List& items = v.items();
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += ", ";
        out += py_repr(items[k]);
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.entries()) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(key) + ": " + py_repr(value);
      }
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.attrs()) {
        if (!first) out += ", ";
        first = false;
        out += py_string_repr(key) + ": " + py_repr(value);
      }
      return out + "}>";
    }
    case Kind::kFunction: {
      const Function& fn = v.function();
      if (fn.type == Function::Type::kMacro) return fmt::format("<Macro '{}'>", fn.name);
      return fmt::format("<built-in function {}>", fn.name);
    }
    case Kind::kLoop: {
      const LoopState& loop = v.loop();
      return fmt::format("<LoopContext {}/{}>", loop.index0 + 1, loop.items->size());
    }
  }
  return "";
}

std::string py_repr(const Value& v) {
  if (v.kind == Kind::kString) return py_string_repr(v.s);
  if (v.kind == Kind::kUndefined) return "Undefined";
  return py_str(v);
}

bool py_equal(const Value& a, const Value& b);

const Value* dict_find(const Dict& d, const Value& key) {
  for (const auto& [k, v] : d)
    if (py_equal(k, key)) return &v;
  return nullptr;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList:
    case Kind::kTuple: {
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!py_equal(x[k], y[k])) return false;
      return true;
    }
    case Kind::kDict: {
      const Dict &x = a.entries(), &y = b.entries();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x) {
        const Value* other = dict_find(y, key);
        if (other == nullptr || !py_equal(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.p == b.p;
  }
}

// a < b (Python's ordering; a TypeError between unrelated types).
bool py_less(const Value& a, const Value& b, const char* op = "<") {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s;  // UTF-8 order = code point order
  if (a.kind == b.kind && a.is_sequence()) {
    const List &x = a.items(), &y = b.items();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!py_equal(x[k], y[k])) return py_less(x[k], y[k], op);
    }
    return x.size() < y.size();
  }
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

// The items a for loop (or list(), join, ...) iterates: a list's items, a dict's keys, a string's
// characters; an undefined value iterates as empty.
List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
    case Kind::kTuple:
      return v.items();
    case Kind::kDict: {
      List keys;
      keys.reserve(v.entries().size());
      for (const auto& [key, value] : v.entries()) keys.push_back(key);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (size_t i = 0; i < v.s.size();) {
        const size_t start = i;
        decode_utf8(v.s, i);
        chars.push_back(Value::string(v.s.substr(start, i - start)));
      }
      return chars;
    }
    default:
      fail(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

// len(value); an undefined value has length 0.
int64_t py_len(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(code_point_count(v.s));
    case Kind::kList:
    case Kind::kTuple:
      return static_cast<int64_t>(v.items().size());
    case Kind::kDict:
      return static_cast<int64_t>(v.entries().size());
    default:
      fail(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

// `item in container`.
bool py_contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (item.kind == Kind::kUndefined) fail_undefined(item);
      if (item.kind != Kind::kString) {
        fail(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      }
      return container.s.find(item.s) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const Value& x : container.items())
        if (py_equal(x, item)) return true;
      return false;
    case Kind::kDict:
      return dict_find(container.entries(), item) != nullptr;
    default:
      fail(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

// ---- JSON (HF's tojson: json.dumps) ----

struct JsonStyle {
  std::optional<std::string> indent;  // None: one line
  std::string item_separator = ", ", key_separator = ": ";
  bool ensure_ascii = false, sort_keys = false;
};

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t c = decode_utf8(s, i);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      out += fmt::format("\\u{:04x}", c);
    } else if (ensure_ascii && c >= 0x80) {
      if (c >= 0x10000) {
        const uint32_t v = c - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", c);
      }
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

void json_dump(const Value& v, const JsonStyle& style, int level, std::string& out) {
  auto newline = [&](int at) {
    out += '\n';
    for (int k = 0; k < at; ++k) out += *style.indent;
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Kind::kFloat:
      out += json_float(v.f);
      return;
    case Kind::kString:
      json_string(v.s, style.ensure_ascii, out);
      return;
    case Kind::kList:
    case Kind::kTuple: {
      const List& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += style.item_separator;
        if (style.indent) newline(level + 1);
        json_dump(items[k], style, level + 1, out);
      }
      if (style.indent) newline(level);
      out += ']';
      return;
    }
    case Kind::kDict: {
      if (v.entries().empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> members;
      for (const auto& [key, value] : v.entries()) {
        std::string name;
        switch (key.kind) {
          case Kind::kString:
            name = key.s;
            break;
          case Kind::kNone:
            name = "null";
            break;
          case Kind::kBool:
            name = key.b ? "true" : "false";
            break;
          case Kind::kInt:
            name = std::to_string(key.i);
            break;
          case Kind::kFloat:
            name = json_float(key.f);
            break;
          default:
            fail(fmt::format("tojson: keys must be str, int, float, bool or None, not {}", type_name(key)));
        }
        members.emplace_back(std::move(name), &value);
      }
      if (style.sort_keys) {
        std::stable_sort(members.begin(), members.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t k = 0; k < members.size(); ++k) {
        if (k > 0) out += style.item_separator;
        if (style.indent) newline(level + 1);
        json_string(members[k].first, style.ensure_ascii, out);
        out += style.key_separator;
        json_dump(*members[k].second, style, level + 1, out);
      }
      if (style.indent) newline(level);
      out += '}';
      return;
    }
    default:
      fail(fmt::format("tojson: Object of type {} is not JSON serializable", type_name(v)));
  }
}

template <typename J>
Value from_json(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.emplace_back(Value::string(it.key()), from_json(it.value()));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();  // binary and discarded values do not occur in parsed JSON
  }
}

// ---- Lexer (jinja2's lexer.py) ----

enum class Tok : uint8_t {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // data, name, operator, the decoded string
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

class Lexer {
 public:
  Lexer(std::string_view source, const JinjaOptions& options) : options_(options) {
    // Newlines normalized and one trailing newline dropped, as jinja2's tokeniter does.
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') newlines_.push_back(k);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t open = find_tag(pos);
      if (open == std::string::npos) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      const char kind = src_[open + 1];
      size_t after = open + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos, open - pos);
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(open, raw_end);
      text = strip_before(std::move(text), sign, kind != '{');
      emit_data(std::move(text), pos);
      line_starting_ = false;
      if (raw) {
        pos = lex_raw(open, raw_end);
      } else if (kind == '#') {
        pos = lex_comment(open, after);
      } else {
        pos = lex_tag(kind == '%', open, after);
      }
    }
    tokens_.push_back(Token{Tok::kEof, "", line_of(src_.size()), 0, 0});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t pos) const {
    return static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin()) +
           1;
  }

  bool starts(size_t pos, std::string_view what) const {
    return pos <= src_.size() && src_.compare(pos, what.size(), what) == 0;
  }

  // The first "{{", "{%" or "{#" at or after pos.
  size_t find_tag(size_t pos) const {
    for (size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  // The text before a tag: "-" strips all whitespace before it; lstrip_blocks strips the spaces and tabs
  // between the start of the line and a block or comment tag (not "+", not a variable).
  std::string strip_before(std::string text, char sign, bool block_or_comment) const {
    if (sign == '-') {
      size_t end = text.size();
      // rstrip of Python whitespace, code point by code point from the end.
      auto offsets = code_point_offsets(text);
      size_t k = offsets.size() - 1;
      while (k > 0) {
        size_t at = offsets[k - 1];
        size_t tmp = at;
        if (!py_space(decode_utf8(text, tmp))) break;
        end = at;
        --k;
      }
      text.resize(end);
    } else if (sign != '+' && options_.lstrip_blocks && block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() && skip_space(text, l_pos) == text.size()) {
        text.resize(l_pos);
      }
    }
    return text;
  }

  void emit_data(std::string text, size_t pos) {
    if (text.empty()) return;
    tokens_.push_back(Token{Tok::kData, std::move(text), line_of(pos), 0, 0});
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) at `open`; raw_end: the position after it.
  bool match_raw_begin(size_t open, size_t& raw_end) const {
    size_t q = open + 2;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
    q = skip_space(src_, q);
    if (!starts(q, "raw")) return false;
    q = skip_space(src_, q + 3);
    if (starts(q, "-%}")) {
      raw_end = skip_space(src_, q + 3);
      return true;
    }
    if (starts(q, "%}")) {
      raw_end = q + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t open, size_t body) {
    line_starting_ = body > 0 && src_[body - 1] == '\n';
    for (size_t k = src_.find("{%", body); k != std::string::npos; k = src_.find("{%", k + 1)) {
      size_t q = k + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(src_, q);
      if (!starts(q, "endraw")) continue;
      q = skip_space(src_, q + 6);
      size_t end = 0;
      if (starts(q, "+%}")) {
        end = q + 3;
      } else if (starts(q, "-%}")) {
        end = skip_space(src_, q + 3);
      } else if (starts(q, "%}")) {
        end = q + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_data(strip_before(src_.substr(body, k - body), sign, true), body);
      line_starting_ = src_[end - 1] == '\n';
      return end;
    }
    fail("the raw block is never closed (no {% endraw %})", line_of(open));
  }

  size_t lex_comment(size_t open, size_t body) {
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) fail("the comment is never closed (no #})", line_of(open));
    size_t end = close + 2;
    const char sign = close > body ? src_[close - 1] : 0;
    if (sign == '-') {
      end = skip_space(src_, end);
    } else if (sign != '+' && options_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = src_[end - 1] == '\n';
    return end;
  }

  static bool is_digit_char(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_name_char(char c) { return is_name_start(c) || is_digit_char(c); }

  // (\d+_)*\d+ from pos; returns its end, or pos when there is no digit.
  size_t digits(size_t pos) const {
    size_t q = pos;
    while (q < src_.size() && is_digit_char(src_[q])) {
      ++q;
      if (q + 1 < src_.size() && src_[q] == '_' && is_digit_char(src_[q + 1])) ++q;
    }
    return q;
  }

  // e[+-]?digits from pos; returns its end, or pos when there is none.
  size_t exponent(size_t pos) const {
    if (pos >= src_.size() || (src_[pos] != 'e' && src_[pos] != 'E')) return pos;
    size_t q = pos + 1;
    if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
    const size_t e = digits(q);
    return e > q ? e : pos;
  }

  void lex_number(size_t& pos, int line) {
    const size_t int_end = digits(pos);
    size_t end = int_end;
    bool is_float = false;
    if (pos == 0 || src_[pos - 1] != '.') {  // jinja2's (?<!\.)
      size_t frac_end = int_end;
      if (int_end + 1 < src_.size() && src_[int_end] == '.' && is_digit_char(src_[int_end + 1])) {
        frac_end = digits(int_end + 1);
      }
      const size_t with_exp = exponent(frac_end);
      if (frac_end > int_end && with_exp > frac_end) {
        end = with_exp;
        is_float = true;
      } else if (exponent(int_end) > int_end) {
        end = exponent(int_end);
        is_float = true;
      } else if (frac_end > int_end) {
        end = frac_end;
        is_float = true;
      }
    }
    std::string text;
    Token t{is_float ? Tok::kFloat : Tok::kInt, "", line, 0, 0};
    if (is_float) {
      for (size_t k = pos; k < end; ++k)
        if (src_[k] != '_') text += src_[k];
      std::from_chars(text.data(), text.data() + text.size(), t.f);
    } else {
      // jinja2's integer_re: 0b/0o/0x prefixes, [1-9](_?\d)*, 0(_?0)*.
      size_t q = pos;
      int base = 10;
      if (src_[q] == '0' && q + 1 < src_.size() &&
          (src_[q + 1] == 'b' || src_[q + 1] == 'B' || src_[q + 1] == 'o' || src_[q + 1] == 'O' ||
           src_[q + 1] == 'x' || src_[q + 1] == 'X')) {
        const char p = static_cast<char>(src_[q + 1] | 0x20);
        base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
        q += 2;
        auto ok = [&](char c) {
          if (base == 2) return c == '0' || c == '1';
          if (base == 8) return c >= '0' && c <= '7';
          return is_digit_char(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        };
        while (q < src_.size() &&
               (ok(src_[q]) || (src_[q] == '_' && q + 1 < src_.size() && ok(src_[q + 1])))) {
          if (src_[q] != '_') text += src_[q];
          ++q;
        }
        if (text.empty()) fail("invalid integer literal", line);
      } else if (src_[q] == '0') {
        ++q;
        while (q < src_.size() &&
               (src_[q] == '0' || (src_[q] == '_' && q + 1 < src_.size() && src_[q + 1] == '0')))
          ++q;
        text = "0";
      } else {
        while (q < int_end) {
          if (src_[q] != '_') text += src_[q];
          ++q;
        }
      }
      end = q;
      auto r = std::from_chars(text.data(), text.data() + text.size(), t.i, base);
      if (r.ec != std::errc()) fail("integer literal out of range", line);
    }
    tokens_.push_back(std::move(t));
    pos = end;
  }

  // A string literal from pos (at the quote), with Python's escapes (jinja2 decodes "unicode-escape").
  void lex_string(size_t& pos, int line) {
    const char quote = src_[pos];
    std::string out;
    size_t q = pos + 1;
    while (true) {
      if (q >= src_.size()) fail("unterminated string literal", line);
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) fail("unterminated string literal", line);
      const char e = src_[q + 1];
      q += 2;
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k, ++q) {
          if (q >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[q]))) {
            fail(fmt::format("truncated \\{} escape in a string literal", e), line);
          }
          const char h = src_[q];
          v = v * 16 + static_cast<uint32_t>(is_digit_char(h) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          encode_utf8(hex(2), out);
          break;
        case 'u':
        case 'U': {
          const uint32_t cp = hex(e == 'u' ? 4 : 8);
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            fail("a surrogate or out-of-range \\u escape in a string literal is not supported", line);
          }
          encode_utf8(cp, out);
          break;
        }
        case 'N':
          fail("\\N{...} escapes in string literals are not supported", line);
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k, ++q) {
              v = v * 8 + static_cast<uint32_t>(src_[q] - '0');
            }
            encode_utf8(v, out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{Tok::kString, std::move(out), line, 0, 0});
    pos = q + 1;
  }

  // The inside of a {{ }} or {% %} tag, up to and including its end.
  size_t lex_tag(bool block, size_t open, size_t pos) {
    const int open_line = line_of(open);
    tokens_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, "", open_line, 0, 0});
    std::vector<char> balance;
    while (true) {
      if (pos >= src_.size()) {
        fail(fmt::format("the '{}' tag is never closed (the template ends inside it)", block ? "{%" : "{{"),
             open_line);
      }
      const int line = line_of(pos);
      if (balance.empty()) {
        size_t end = 0;
        if (block) {
          if (starts(pos, "+%}")) {
            end = pos + 3;
          } else if (starts(pos, "-%}")) {
            end = skip_space(src_, pos + 3);
          } else if (starts(pos, "%}")) {
            end = pos + 2;
            if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
          }
        } else if (starts(pos, "-}}")) {
          end = skip_space(src_, pos + 3);
        } else if (starts(pos, "}}")) {
          end = pos + 2;
        }
        if (end > 0) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", line, 0, 0});
          line_starting_ = src_[end - 1] == '\n';
          return end;
        }
      }
      const char c = src_[pos];
      size_t after_space = skip_space(src_, pos);
      if (after_space > pos) {
        pos = after_space;
      } else if (is_digit_char(c)) {
        lex_number(pos, line);
      } else if (is_name_start(c)) {
        size_t q = pos;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        tokens_.push_back(Token{Tok::kName, src_.substr(pos, q - pos), line, 0, 0});
        pos = q;
      } else if (c == '\'' || c == '"') {
        lex_string(pos, line);
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (std::string_view two : kTwo)
          if (starts(pos, two)) op = two;
        if (op.empty() && std::string_view("+-/*%~[](){}<>=.:|,;").find(c) != std::string_view::npos) op = c;
        if (op.empty()) {
          size_t tmp = pos;
          std::string ch;
          encode_utf8(decode_utf8(src_, tmp), ch);
          fail(fmt::format("unexpected character '{}'", ch), line);
        }
        if (op == "{" || op == "(" || op == "[") {
          balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
        } else if (op == "}" || op == ")" || op == "]") {
          if (balance.empty()) fail(fmt::format("unexpected '{}'", op), line);
          if (balance.back() != op[0])
            fail(fmt::format("unexpected '{}', expected '{}'", op, balance.back()), line);
          balance.pop_back();
        }
        tokens_.push_back(Token{Tok::kOp, op, line, 0, 0});
        pos += op.size();
      }
    }
  }

  const JinjaOptions& options_;
  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
  bool line_starting_ = true;
};

// ---- Syntax tree ----

class Renderer;
struct Args {
  List pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using FilterFn = Value (*)(Renderer&, const Value&, const Args&);
using TestFn = bool (*)(Renderer&, const Value&, const Args&);
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

enum class Ex : uint8_t {
  kConst,
  kName,
  kList,
  kTuple,
  kDict,    // args: key, value, key, value, ...
  kAttr,    // args[0].name
  kItem,    // args[0][args[1]]
  kSlice,   // args[0][args[1]:args[2]:args[3]], each bound may be null
  kCall,    // args[0](args[1..], kwargs)
  kFilter,  // args[0] | name(args[1..], kwargs)
  kTest,    // args[0] is [not] name(args[1..], kwargs)
  kNeg,
  kPos,
  kNot,
  kAnd,
  kOr,
  kBinary,   // args[0] name args[1]
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
  kCond,     // args[1] if args[0] else args[2] (may be null)
  kConcat,   // args joined by ~
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  Ex kind = Ex::kConst;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
};

enum class St : uint8_t {
  kText,
  kPrint,
  kIf,        // if expr: body else else_body (an elif is an if alone in else_body)
  kFor,       // for targets in expr [if cond]: body else else_body
  kSet,       // targets = expr
  kSetAttr,   // targets[0].text = expr
  kSetBlock,  // targets[0] = rendered body
  kMacro,     // text(params=defaults): body
  kBreak,
  kContinue,
  kBlock,  // HF's {% generation %}: its body
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
struct Stmt {
  St kind = St::kText;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  std::vector<std::string> targets;
  bool unpack = false;  // targets is a tuple
  std::vector<StmtPtr> body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per parameter, null when it has none
};

ExprPtr make_expr(Ex kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// ---- Parser (jinja2's parser.py) ----

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::vector<StmtPtr> parse_template() {
    std::string found;
    return subparse({}, "", 0, found);
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == Tok::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "the end of the template";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return "a number";
      case Tok::kData:
        return "text";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kVarBegin:
        return "'{{'";
      default:
        return fmt::format("'{}'", t.text);
    }
  }

  [[noreturn]] void unexpected(std::string_view wanted) const {
    fail(fmt::format("expected {}, found {}", wanted, describe(cur())), cur().line);
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected(fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) unexpected("a name");
    std::string name = cur().text;
    next();
    return name;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) unexpected("'%}'");
    next();
  }

  // Statements up to a block tag named in `ends` (consumed; its name in `found`), or the end of the
  // template when `ends` is empty.
  std::vector<StmtPtr> subparse(const std::vector<std::string_view>& ends, std::string_view opener,
                                int opener_line, std::string& found) {
    std::vector<StmtPtr> body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          fail(fmt::format("'{}' of line {} is never closed (no '{}')", opener, opener_line, ends.back()),
               t.line);
        }
        found.clear();
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = St::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = St::kPrint;
        s->line = t.line;
        next();
        s->expr = parse_tuple(true, {}, false);
        if (cur().type != Tok::kVarEnd) unexpected("'}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type != Tok::kName) unexpected("a tag name");
        if (std::find(ends.begin(), ends.end(), cur().text) != ends.end()) {
          found = cur().text;
          next();
          return body;
        }
        if (!opener.empty() && is_end_tag(cur().text)) {
          fail(fmt::format("unexpected '{}': the '{}' of line {} is still open", cur().text, opener,
                           opener_line),
               cur().line);
        }
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  static bool is_end_tag(std::string_view name) {
    return name == "elif" || name == "else" || name.substr(0, 3) == "end";
  }

  StmtPtr parse_statement() {
    const std::string name = cur().text;
    const int line = cur().line;
    if (name == "if") {
      next();
      return parse_if_rest(line);
    }
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside of a loop", name), line);
      next();
      expect_block_end();
      auto s = std::make_unique<Stmt>();
      s->kind = name == "break" ? St::kBreak : St::kContinue;
      s->line = line;
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker extension: renders its body
      next();
      expect_block_end();
      auto s = std::make_unique<Stmt>();
      s->kind = St::kBlock;
      s->line = line;
      std::string found;
      s->body = subparse({"endgeneration"}, "generation", line, found);
      expect_block_end();
      return s;
    }
    if (is_end_tag(name)) fail(fmt::format("unexpected '{}'", name), line);
    fail(fmt::format("tag '{}' is not supported", name), line);
  }

  // After "if" or "elif".
  StmtPtr parse_if_rest(int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = St::kIf;
    s->line = line;
    s->expr = parse_tuple(false, {}, false);
    expect_block_end();
    std::string found;
    s->body = subparse({"elif", "else", "endif"}, "if", line, found);
    if (found == "elif") {
      s->else_body.push_back(parse_if_rest(tokens_[pos_ - 1].line));
    } else if (found == "else") {
      expect_block_end();
      s->else_body = subparse({"endif"}, "if", line, found);
      expect_block_end();
    } else {
      expect_block_end();
    }
    return s;
  }

  // name, or name, name, ... (a tuple); parenthesized tuples too.
  void parse_targets(Stmt& s) {
    const bool parens = skip_op("(");
    while (true) {
      s.targets.push_back(expect_name());
      if (!skip_op(",")) break;
      s.unpack = true;
      if (cur().type != Tok::kName) break;
    }
    if (parens) {
      expect_op(")");
      s.unpack = true;
    }
  }

  StmtPtr parse_for() {
    const int line = cur().line;
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = St::kFor;
    s->line = line;
    parse_targets(*s);
    if (!skip_name("in")) unexpected("'in'");
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail("recursive loops are not supported", cur().line);
    expect_block_end();
    ++loop_depth_;
    std::string found;
    s->body = subparse({"endfor", "else"}, "for", line, found);
    --loop_depth_;
    if (found == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"}, "for", line, found);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const int line = cur().line;
    next();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    const std::string name = expect_name();
    if (skip_op(".")) {
      s->kind = St::kSetAttr;
      s->targets.push_back(name);
      s->text = expect_name();
      expect_op("=");
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    s->targets.push_back(name);
    while (skip_op(",")) {
      s->unpack = true;
      if (cur().type != Tok::kName) break;
      s->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      s->kind = St::kSet;
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    if (s->unpack) unexpected("'='");
    if (is_op("|")) fail("filters on a block set are not supported", cur().line);
    expect_block_end();
    s->kind = St::kSetBlock;
    std::string found;
    s->body = subparse({"endset"}, "set", line, found);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro() {
    const int line = cur().line;
    next();
    auto s = std::make_unique<Stmt>();
    s->kind = St::kMacro;
    s->line = line;
    s->text = expect_name();
    expect_op("(");
    bool any_default = false;
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      s->params.push_back(expect_name());
      if (skip_op("=")) {
        s->defaults.push_back(parse_expression(true));
        any_default = true;
      } else {
        if (any_default) fail("a macro argument without a default follows one with a default", cur().line);
        s->defaults.push_back(nullptr);
      }
    }
    expect_op(")");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string found;
    s->body = subparse({"endmacro"}, "macro", line, found);
    loop_depth_ = saved;
    expect_block_end();
    return s;
  }

  // ---- Expressions ----

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd || t.type == Tok::kEof) return true;
    if (t.type == Tok::kOp && t.text == ")") return true;
    return t.type == Tok::kName && std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string_view>& extra_end,
                      bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make_expr(Ex::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) otherwise = parse_condexpr();
      auto e = make_expr(Ex::kCond, line);
      e->args.push_back(std::move(test));
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(Ex kind, ExprPtr left, ExprPtr right, int line, std::string op = "") {
    auto e = make_expr(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      left = binary(Ex::kOr, std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      left = binary(Ex::kAnd, std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make_expr(Ex::kNot, cur().line);
      next();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" ||
                                 t.text == ">" || t.text == ">=")) {
        ops.push_back(t.text);
        next();
      } else if (is_name("in")) {
        ops.emplace_back("in");
        next();
      } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
        ops.emplace_back("not in");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make_expr(Ex::kCompare, line);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      left = binary(Ex::kBinary, std::move(left), parse_concat(), line, op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make_expr(Ex::kConcat, line);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      left = binary(Ex::kBinary, std::move(left), parse_pow(), line, op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      left = binary(Ex::kBinary, std::move(left), parse_unary(true), line, "**");
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make_expr(is_op("-") ? Ex::kNeg : Ex::kPos, cur().line);
      next();
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      ExprPtr e;
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        e = make_expr(Ex::kConst, line);
        e->value = Value::boolean(t.text == "true" || t.text == "True");
      } else if (t.text == "none" || t.text == "None") {
        e = make_expr(Ex::kConst, line);
        e->value = Value::none();
      } else {
        e = make_expr(Ex::kName, line);
        e->name = t.text;
      }
      next();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string text;
      while (cur().type == Tok::kString) {
        text += cur().text;
        next();
      }
      auto e = make_expr(Ex::kConst, line);
      e->value = Value::string(std::move(text));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = make_expr(Ex::kConst, line);
      e->value = t.type == Tok::kInt ? Value::integer(t.i) : Value::floating(t.f);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make_expr(Ex::kList, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make_expr(Ex::kDict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == Tok::kName) {
        auto e = make_expr(Ex::kAttr, line);
        e->name = cur().text;
        e->args.push_back(std::move(node));
        next();
        return e;
      }
      if (cur().type == Tok::kInt) {
        auto key = make_expr(Ex::kConst, line);
        key->value = Value::integer(cur().i);
        next();
        auto e = make_expr(Ex::kItem, line);
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(key));
        return e;
      }
      unexpected("a name or a number after '.'");
    }
    expect_op("[");
    // Jinja's parse_subscribed: an expression or a slice start:stop:step, each part optional.
    ExprPtr bounds[3];
    bool slice = false;
    if (!is_op(":")) bounds[0] = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]") && !is_op(",")) bounds[1] = parse_expression(true);
      if (skip_op(":")) {
        if (!is_op("]") && !is_op(",")) bounds[2] = parse_expression(true);
      }
    }
    if (is_op(",")) fail("subscripts with several indexes are not supported", cur().line);
    expect_op("]");
    auto e = make_expr(slice ? Ex::kSlice : Ex::kItem, line);
    e->args.push_back(std::move(node));
    if (slice) {
      for (auto& b : bounds) e->args.push_back(std::move(b));
    } else {
      e->args.push_back(std::move(bounds[0]));
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool any = false;
    while (!is_op(")")) {
      if (any) expect_op(",");
      if (is_op(")")) break;
      any = true;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported", cur().line);
      if (cur().type == Tok::kName && look().type == Tok::kOp && look().text == "=") {
        std::string key = cur().text;
        next();
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument", cur().line);
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(Ex::kCall, cur().line);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr node) {
    next();  // '|'
    const int line = cur().line;
    auto e = make_expr(Ex::kFilter, line);
    e->name = expect_name();
    if (is_op(".")) fail(fmt::format("filter '{}.{}' is not supported", e->name, look().text), line);
    e->filter = find_filter(e->name);
    if (e->filter == nullptr) fail(fmt::format("filter '{}' is not supported", e->name), line);
    e->args.push_back(std::move(node));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr node) {
    next();  // 'is'
    const int line = cur().line;
    auto e = make_expr(Ex::kTest, line);
    e->negated = skip_name("not");
    e->name = expect_name();
    if (is_op(".")) fail(fmt::format("test '{}.{}' is not supported", e->name, look().text), line);
    e->test = find_test(e->name);
    if (e->test == nullptr) fail(fmt::format("test '{}' is not supported", e->name), line);
    e->args.push_back(std::move(node));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == Tok::kName || t.type == Tok::kString || t.type == Tok::kInt ||
                t.type == Tok::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("tests cannot be chained with 'is'", t.line);
      // A test takes one argument without parentheses: `x is divisibleby 3`, `x is sameas false`.
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

// ---- Rendering ----

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  Value* find(std::string_view name) {
    for (Scope* s = this; s != nullptr; s = s->parent) {
      for (auto& [n, v] : s->vars)
        if (n == name) return &v;
    }
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& [n, v] : vars) {
      if (n == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(name, std::move(value));
  }
};

// The arguments of a call bound to Python-style parameters `names`: each present one, in order.
std::vector<std::optional<Value>> bind(const Args& a, std::initializer_list<std::string_view> names,
                                       std::string_view what) {
  std::vector<std::optional<Value>> out(names.size());
  if (a.pos.size() > names.size()) {
    fail(fmt::format("{} takes at most {} argument(s) ({} given)", what, names.size(), a.pos.size()));
  }
  for (size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k];
  for (const auto& [key, value] : a.kw) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) fail(fmt::format("{} got an unexpected keyword argument '{}'", what, key));
    const auto k = static_cast<size_t>(it - names.begin());
    if (out[k]) fail(fmt::format("{} got multiple values for argument '{}'", what, key));
    out[k] = value;
  }
  return out;
}

const std::string& want_string(const Value& v, std::string_view what) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind != Kind::kString) fail(fmt::format("{} must be a string, not {}", what, type_name(v)));
  return v.s;
}

int64_t want_int(const Value& v, std::string_view what) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_integral()) fail(fmt::format("{} must be an integer, not {}", what, type_name(v)));
  return v.as_int();
}

Value unsafe_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

bool is_one_of(std::string_view name, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return is_one_of(name, std::span<const std::string_view>(names.begin(), names.size()));
}

// Python's str, dict and list methods. Those that mutate are unsafe in HF's immutable sandbox.
constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
    "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
    "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
    "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
    "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
    "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
    "swapcase",   "title",        "translate",    "upper",   "zfill"};
constexpr std::string_view kDictMethods[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                             "pop",   "popitem", "setdefault", "update", "values"};
constexpr std::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListMethods[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                             "insert", "pop",   "remove", "reverse", "sort"};
constexpr std::string_view kListMutators[] = {"append", "clear",  "extend",  "insert",
                                              "pop",    "remove", "reverse", "sort"};

class Renderer {
 public:
  enum class Flow { kNormal, kBreak, kContinue };

  Renderer(const JinjaOptions& options, Scope& root) : options(options), root_(root) {}

  const JinjaOptions& options;
  int line = 0;

  Flow exec(const std::vector<StmtPtr>& body, Scope& scope, std::string& out) {
    for (const StmtPtr& sp : body) {
      const Stmt& st = *sp;
      line = st.line;
      switch (st.kind) {
        case St::kText:
          out += st.text;
          break;
        case St::kPrint:
          out += py_str(eval(*st.expr, scope));
          break;
        case St::kIf: {
          const Flow flow = exec(truthy(eval(*st.expr, scope)) ? st.body : st.else_body, scope, out);
          if (flow != Flow::kNormal) return flow;
          break;
        }
        case St::kFor:
          exec_for(st, scope, out);
          break;
        case St::kSet:
          assign(st, eval(*st.expr, scope), scope);
          break;
        case St::kSetAttr: {
          Value value = eval(*st.expr, scope);
          line = st.line;
          Value* target = scope.find(st.targets[0]);
          if (target == nullptr || target->kind != Kind::kNamespace) {
            fail("cannot assign attribute on non-namespace object");
          }
          NamespaceAttrs& attrs = target->attrs();
          auto it =
              std::find_if(attrs.begin(), attrs.end(), [&](const auto& a) { return a.first == st.text; });
          if (it != attrs.end()) {
            it->second = std::move(value);
          } else {
            attrs.emplace_back(st.text, std::move(value));
          }
          break;
        }
        case St::kSetBlock: {
          std::string captured;
          Scope inner{&scope, {}};
          exec(st.body, inner, captured);
          scope.set(st.targets[0], Value::string(std::move(captured)));
          break;
        }
        case St::kMacro:
          scope.set(st.text, make_function(Function::Type::kMacro, st.text, {}, &st));
          break;
        case St::kBreak:
          return Flow::kBreak;
        case St::kContinue:
          return Flow::kContinue;
        case St::kBlock: {
          const Flow flow = exec(st.body, scope, out);
          if (flow != Flow::kNormal) return flow;
          break;
        }
      }
    }
    return Flow::kNormal;
  }

  Value eval(const Expr& e, Scope& scope) {
    line = e.line;
    switch (e.kind) {
      case Ex::kConst:
        return e.value;
      case Ex::kName:
        return lookup(scope, e.name);
      case Ex::kList:
      case Ex::kTuple: {
        List items;
        items.reserve(e.args.size());
        for (const ExprPtr& x : e.args) items.push_back(eval(*x, scope));
        return Value::list(std::move(items), e.kind == Ex::kTuple);
      }
      case Ex::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], scope);
          Value value = eval(*e.args[k + 1], scope);
          auto it = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return py_equal(kv.first, key); });
          if (it != d.end()) {
            it->second = std::move(value);
          } else {
            d.emplace_back(std::move(key), std::move(value));
          }
        }
        return Value::dict(std::move(d));
      }
      case Ex::kAttr: {
        Value obj = eval(*e.args[0], scope);
        line = e.line;
        return getattr(obj, e.name);
      }
      case Ex::kItem: {
        Value obj = eval(*e.args[0], scope);
        Value key = eval(*e.args[1], scope);
        line = e.line;
        return getitem(obj, key);
      }
      case Ex::kSlice: {
        Value obj = eval(*e.args[0], scope);
        Value bounds[3];
        for (int k = 0; k < 3; ++k) bounds[k] = e.args[k + 1] ? eval(*e.args[k + 1], scope) : Value::none();
        line = e.line;
        return slice(obj, bounds[0], bounds[1], bounds[2]);
      }
      case Ex::kCall: {
        Value callee = eval(*e.args[0], scope);
        Args a = eval_args(e, scope);
        line = e.line;
        return call(callee, a);
      }
      case Ex::kFilter: {
        Value v = eval(*e.args[0], scope);
        Args a = eval_args(e, scope);
        line = e.line;
        return e.filter(*this, v, a);
      }
      case Ex::kTest: {
        Value v = eval(*e.args[0], scope);
        Args a = eval_args(e, scope);
        line = e.line;
        return Value::boolean(e.test(*this, v, a) != e.negated);
      }
      case Ex::kNeg:
      case Ex::kPos: {
        Value v = eval(*e.args[0], scope);
        line = e.line;
        if (v.is_undefined()) fail_undefined(v);
        const bool neg = e.kind == Ex::kNeg;
        if (v.kind == Kind::kFloat) return Value::floating(neg ? -v.f : v.f);
        if (v.is_integral()) {
          if (neg && v.as_int() == INT64_MIN) fail("integer overflow");
          return Value::integer(neg ? -v.as_int() : v.as_int());
        }
        fail(fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
      }
      case Ex::kNot:
        return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case Ex::kAnd: {
        Value left = eval(*e.args[0], scope);
        return truthy(left) ? eval(*e.args[1], scope) : left;
      }
      case Ex::kOr: {
        Value left = eval(*e.args[0], scope);
        return truthy(left) ? left : eval(*e.args[1], scope);
      }
      case Ex::kBinary: {
        Value left = eval(*e.args[0], scope);
        Value right = eval(*e.args[1], scope);
        line = e.line;
        return arithmetic(e.name, left, right);
      }
      case Ex::kCompare: {
        Value left = eval(*e.args[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          line = e.line;
          if (!compare(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Ex::kCond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and has no else section");
      case Ex::kConcat: {
        std::string out;
        for (const ExprPtr& x : e.args) out += py_str(eval(*x, scope));
        return Value::string(std::move(out));
      }
    }
    return {};
  }

  Value lookup(Scope& scope, const std::string& name) {
    if (Value* v = scope.find(name)) return *v;
    if (is_one_of(name, {"range", "dict", "namespace", "raise_exception", "strftime_now", "lipsum", "cycler",
                         "joiner"})) {
      return make_function(Function::Type::kGlobal, name);
    }
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  // A real attribute of `obj` (a method, a namespace's or a loop's attribute), as Python's getattr finds it.
  std::optional<Value> python_attribute(const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case Kind::kString:
        if (is_one_of(name, kStrMethods)) return make_function(Function::Type::kMethod, name, obj);
        break;
      case Kind::kList:
      case Kind::kTuple:
        if (obj.kind == Kind::kList ? is_one_of(name, kListMethods) : is_one_of(name, {"count", "index"})) {
          if (is_one_of(name, kListMutators)) return unsafe_attribute(obj, name);
          return make_function(Function::Type::kMethod, name, obj);
        }
        break;
      case Kind::kDict:
        if (is_one_of(name, kDictMethods)) {
          if (is_one_of(name, kDictMutators)) return unsafe_attribute(obj, name);
          return make_function(Function::Type::kMethod, name, obj);
        }
        break;
      case Kind::kNamespace:
        for (const auto& [key, value] : obj.attrs())
          if (key == name) return value;
        break;
      case Kind::kLoop: {
        const LoopState& loop = obj.loop();
        const auto n = static_cast<int64_t>(loop.items->size());
        const int64_t i = loop.index0;
        if (name == "index") return Value::integer(i + 1);
        if (name == "index0") return Value::integer(i);
        if (name == "revindex") return Value::integer(n - i);
        if (name == "revindex0") return Value::integer(n - i - 1);
        if (name == "first") return Value::boolean(i == 0);
        if (name == "last") return Value::boolean(i == n - 1);
        if (name == "length") return Value::integer(n);
        if (name == "depth") return Value::integer(1);
        if (name == "depth0") return Value::integer(0);
        if (name == "previtem") {
          return i > 0 ? (*loop.items)[static_cast<size_t>(i - 1)]
                       : Value::undefined("there is no previous item");
        }
        if (name == "nextitem") {
          return i + 1 < n ? (*loop.items)[static_cast<size_t>(i + 1)]
                           : Value::undefined("there is no next item");
        }
        if (name == "cycle") return make_function(Function::Type::kCycle, name, obj);
        if (name == "changed") return make_function(Function::Type::kGlobal, "loop.changed");
        break;
      }
      default:
        break;
    }
    return std::nullopt;
  }

  // obj.name: Python's attribute, else obj["name"] (jinja2's sandboxed getattr).
  Value getattr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) fail_undefined(obj);
    if (!name.empty() && name[0] == '_') return unsafe_attribute(obj, name);
    if (auto a = python_attribute(obj, name)) return *a;
    if (obj.kind == Kind::kDict) {
      if (const Value* v = dict_find(obj.entries(), Value::string(name))) return *v;
    }
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type(obj), name));
  }

  // obj[key]: the item, else (for a string key) Python's attribute (jinja2's sandboxed getitem).
  Value getitem(const Value& obj, const Value& key) {
    if (obj.is_undefined()) fail_undefined(obj);
    if ((obj.is_sequence() || obj.kind == Kind::kString) && key.is_integral()) {
      int64_t k = key.as_int();
      if (obj.kind == Kind::kString) {
        const std::vector<size_t> offsets = code_point_offsets(obj.s);
        const auto n = static_cast<int64_t>(offsets.size()) - 1;
        if (k < 0) k += n;
        if (k >= 0 && k < n) {
          const auto at = static_cast<size_t>(k);
          return Value::string(obj.s.substr(offsets[at], offsets[at + 1] - offsets[at]));
        }
      } else {
        const auto n = static_cast<int64_t>(obj.items().size());
        if (k < 0) k += n;
        if (k >= 0 && k < n) return obj.items()[static_cast<size_t>(k)];
      }
    } else if (obj.kind == Kind::kDict) {
      if (const Value* v = dict_find(obj.entries(), key)) return *v;
    }
    if (key.kind == Kind::kString) {
      if (!key.s.empty() && key.s[0] == '_') return unsafe_attribute(obj, key.s);
      if (auto a = python_attribute(obj, key.s)) return *a;
      return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type(obj), key.s));
    }
    return Value::undefined(fmt::format("{} has no element {}", object_type(obj), py_repr(key)));
  }

  Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
    if (obj.is_undefined()) fail_undefined(obj);
    auto bound = [&](const Value& v, bool& ok) -> std::optional<int64_t> {
      if (v.kind == Kind::kNone) return std::nullopt;
      if (!v.is_integral()) ok = false;
      return v.as_int();
    };
    bool ok = true;
    const auto start = bound(start_v, ok), stop = bound(stop_v, ok), step_o = bound(step_v, ok);
    if (!ok || !(obj.is_sequence() || obj.kind == Kind::kString)) {
      return Value::undefined(fmt::format("{} cannot be sliced with these bounds", object_type(obj)));
    }
    const int64_t step = step_o.value_or(1);
    if (step == 0) fail("slice step cannot be zero");
    std::vector<size_t> offsets;
    int64_t n = 0;
    if (obj.kind == Kind::kString) {
      offsets = code_point_offsets(obj.s);
      n = static_cast<int64_t>(offsets.size()) - 1;
    } else {
      n = static_cast<int64_t>(obj.items().size());
    }
    // slice.indices(n)
    const int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
    auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
      if (!b) return dflt;
      int64_t x = *b;
      if (x < 0) {
        x += n;
        if (x < lower) x = lower;
      } else if (x > upper) {
        x = upper;
      }
      return x;
    };
    const int64_t from = clamp(start, step > 0 ? lower : upper), to = clamp(stop, step > 0 ? upper : lower);
    std::vector<int64_t> picks;
    for (int64_t k = from; step > 0 ? k < to : k > to; k += step) picks.push_back(k);
    if (obj.kind == Kind::kString) {
      std::string out;
      for (int64_t k : picks) {
        const auto at = static_cast<size_t>(k);
        out.append(obj.s, offsets[at], offsets[at + 1] - offsets[at]);
      }
      return Value::string(std::move(out));
    }
    List out;
    out.reserve(picks.size());
    for (int64_t k : picks) out.push_back(obj.items()[static_cast<size_t>(k)]);
    return Value::list(std::move(out), obj.kind == Kind::kTuple);
  }

  Args eval_args(const Expr& e, Scope& scope) {
    Args a;
    const size_t first = 1;  // args[0] is the callee, the filtered or the tested value
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
    for (const auto& [key, x] : e.kwargs) a.kw.emplace_back(key, eval(*x, scope));
    return a;
  }

  bool compare(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return py_equal(left, right);
    if (op == "!=") return !py_equal(left, right);
    if (op == "<") return py_less(left, right, "<");
    if (op == ">") return py_less(right, left, ">");
    if (op == "<=") return py_less(left, right, "<=") || py_equal(left, right);
    if (op == ">=") return py_less(right, left, ">=") || py_equal(left, right);
    if (op == "in") return py_contains(right, left);
    return !py_contains(right, left);  // "not in"
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    auto type_error = [&]() -> Value {
      fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
    };
    const bool numbers = a.is_number() && b.is_number();
    const bool ints = a.is_integral() && b.is_integral();
    if (op == "+") {
      if (ints) {
        int64_t r = 0;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (numbers) return Value::floating(a.as_double() + b.as_double());
      if (a.kind == Kind::kString && b.kind == Kind::kString) return Value::string(a.s + b.s);
      if (a.kind == b.kind && a.is_sequence()) {
        List out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(out), a.kind == Kind::kTuple);
      }
      if (a.kind == Kind::kString) {
        fail(fmt::format("can only concatenate str (not \"{}\") to str", type_name(b)));
      }
      return type_error();
    }
    if (op == "-") {
      if (ints) {
        int64_t r = 0;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (numbers) return Value::floating(a.as_double() - b.as_double());
      return type_error();
    }
    if (op == "*") {
      if (ints) {
        int64_t r = 0;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
        return Value::integer(r);
      }
      if (numbers) return Value::floating(a.as_double() * b.as_double());
      const Value* seq = a.is_integral() ? &b : &a;
      const Value* count = a.is_integral() ? &a : &b;
      if (count->is_integral() && (seq->kind == Kind::kString || seq->is_sequence())) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        if (seq->kind == Kind::kString) {
          if (n > 0 && seq->s.size() * static_cast<size_t>(n) > (size_t{1} << 30)) fail("string too long");
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(std::move(out));
        }
        List out;
        for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq->items().begin(), seq->items().end());
        return Value::list(std::move(out), seq->kind == Kind::kTuple);
      }
      return type_error();
    }
    if (op == "%" && a.kind == Kind::kString) fail("'%' string formatting is not supported");
    if (!numbers) return type_error();
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        int64_t r = 1, base = a.as_int();
        for (int64_t e = b.as_int(); e > 0; --e) {
          if (__builtin_mul_overflow(r, base, &r)) fail("integer overflow");
        }
        return Value::integer(r);
      }
      return Value::floating(std::pow(a.as_double(), b.as_double()));
    }
    const bool zero = b.kind == Kind::kFloat ? b.f == 0 : b.as_int() == 0;
    if (zero) {
      fail(op == "/"    ? "division by zero"
           : op == "//" ? "integer division or modulo by zero"
                        : "modulo by zero");
    }
    if (op == "/") return Value::floating(a.as_double() / b.as_double());
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) fail("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    // CPython's float_divmod.
    const double x = a.as_double(), y = b.as_double();
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value::floating(mod);
    double floordiv = std::copysign(0.0, x / y);
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    }
    return Value::floating(floordiv);
  }

  Value call(const Value& callee, const Args& a) {
    if (callee.is_undefined()) fail_undefined(callee);
    if (callee.kind != Kind::kFunction) fail(fmt::format("'{}' object is not callable", type_name(callee)));
    const Function& fn = callee.function();
    switch (fn.type) {
      case Function::Type::kGlobal:
        return call_global(fn.name, a);
      case Function::Type::kMethod:
        return call_method(fn.self, fn.name, a);
      case Function::Type::kMacro:
        return call_macro(*fn.macro, a);
      case Function::Type::kCycle: {
        if (a.pos.empty()) fail("no items for cycling given");
        const auto k = static_cast<size_t>(fn.self.loop().index0) % a.pos.size();
        return a.pos[k];
      }
    }
    return {};
  }

  Value call_global(const std::string& name, const Args& a);
  Value call_method(const Value& self, const std::string& name, const Args& a);

  Value call_macro(const Stmt& macro, const Args& a) {
    if (depth_ >= 64) fail(fmt::format("macro '{}' recurses too deeply", macro.text));
    if (a.pos.size() > macro.params.size()) {
      fail(fmt::format("macro '{}' takes not more than {} argument(s)", macro.text, macro.params.size()));
    }
    for (const auto& [key, value] : a.kw) {
      if (std::find(macro.params.begin(), macro.params.end(), key) == macro.params.end()) {
        fail(fmt::format("macro '{}' takes no keyword argument '{}'", macro.text, key));
      }
    }
    Scope scope{&root_, {}};
    for (size_t k = 0; k < macro.params.size(); ++k) {
      const std::string& param = macro.params[k];
      Value value;
      bool given = false;
      if (k < a.pos.size()) {
        value = a.pos[k];
        given = true;
      }
      for (const auto& [key, v] : a.kw) {
        if (key != param) continue;
        if (given) fail(fmt::format("macro '{}' got multiple values for argument '{}'", macro.text, key));
        value = v;
        given = true;
      }
      if (!given) {
        value = macro.defaults[k] ? eval(*macro.defaults[k], scope)
                                  : Value::undefined(fmt::format("parameter '{}' was not provided", param));
      }
      scope.vars.emplace_back(param, std::move(value));
    }
    ++depth_;
    std::string out;
    exec(macro.body, scope, out);
    --depth_;
    return Value::string(std::move(out));
  }

 private:
  void bind_targets(const Stmt& st, const Value& item, Scope& scope) {
    if (!st.unpack) {
      scope.set(st.targets[0], item);
      return;
    }
    const List parts = iterate(item);
    if (parts.size() < st.targets.size()) {
      fail(fmt::format("not enough values to unpack (expected {}, got {})", st.targets.size(), parts.size()));
    }
    if (parts.size() > st.targets.size()) {
      fail(fmt::format("too many values to unpack (expected {})", st.targets.size()));
    }
    for (size_t k = 0; k < parts.size(); ++k) scope.set(st.targets[k], parts[k]);
  }

  void assign(const Stmt& st, const Value& value, Scope& scope) { bind_targets(st, value, scope); }

  void exec_for(const Stmt& st, Scope& scope, std::string& out) {
    Value seq = eval(*st.expr, scope);
    line = st.line;
    List items = iterate(seq);
    if (st.cond) {
      List kept;
      for (Value& item : items) {
        Scope probe{&scope, {}};
        bind_targets(st, item, probe);
        if (truthy(eval(*st.cond, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<const List>(std::move(items));
    Value loop_value;
    loop_value.kind = Kind::kLoop;
    loop_value.p = state;
    const List& list = *state->items;
    for (size_t k = 0; k < list.size(); ++k) {
      state->index0 = static_cast<int64_t>(k);
      Scope iteration{&scope, {}};
      bind_targets(st, list[k], iteration);
      iteration.vars.emplace_back("loop", loop_value);
      if (exec(st.body, iteration, out) == Flow::kBreak) break;
    }
    if (list.empty() && !st.else_body.empty()) {
      Scope inner{&scope, {}};
      exec(st.else_body, inner, out);
    }
  }

  Scope& root_;
  int depth_ = 0;
};

// ---- Globals and methods ----

// datetime.strftime on a naive datetime at `now` (UTC): %f is 000000, %z and %Z are empty, the rest is the
// C library's strftime in the C locale, as CPython calls it.
std::string py_strftime(const std::string& format, int64_t now) {
  std::string c_format;
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] == '%' && k + 1 < format.size()) {
      const char c = format[++k];
      if (c == 'f') {
        c_format += "000000";
      } else if (c != 'z' && c != 'Z') {
        c_format += '%';
        c_format += c;
      }
    } else {
      c_format += format[k];
    }
  }
  if (c_format.empty()) return "";
  static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
  std::tm tm{};
  const auto t = static_cast<time_t>(now);
  gmtime_r(&t, &tm);
  for (size_t size = 256; size <= (size_t{1} << 20); size *= 4) {
    std::string buf(size, '\0');
    const size_t n = c_locale != nullptr ? strftime_l(buf.data(), size, c_format.c_str(), &tm, c_locale)
                                         : std::strftime(buf.data(), size, c_format.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
  }
  return "";
}

std::vector<std::string> split_whitespace(const std::vector<uint32_t>& cps, int64_t maxsplit,
                                          bool from_right) {
  std::vector<std::string> parts;
  const auto n = static_cast<int64_t>(cps.size());
  std::span<const uint32_t> all(cps);
  if (!from_right) {
    int64_t i = 0;
    while (true) {
      while (i < n && py_space(cps[static_cast<size_t>(i)])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {  // the rest, as it is
        parts.push_back(from_code_points(all.subspan(static_cast<size_t>(i))));
        break;
      }
      int64_t j = i;
      while (j < n && !py_space(cps[static_cast<size_t>(j)])) ++j;
      parts.push_back(from_code_points(all.subspan(static_cast<size_t>(i), static_cast<size_t>(j - i))));
      i = j;
    }
    return parts;
  }
  int64_t i = n;
  while (true) {
    while (i > 0 && py_space(cps[static_cast<size_t>(i - 1)])) --i;
    if (i <= 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(from_code_points(all.subspan(0, static_cast<size_t>(i))));
      break;
    }
    int64_t j = i;
    while (j > 0 && !py_space(cps[static_cast<size_t>(j - 1)])) --j;
    parts.push_back(from_code_points(all.subspan(static_cast<size_t>(j), static_cast<size_t>(i - j))));
    i = j;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split_on(const std::string& s, const std::string& sep, int64_t maxsplit,
                                  bool from_right) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(sep, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t at = s.rfind(sep, end - sep.size());
    if (at == std::string::npos) break;
    parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
    end = at;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& replacement,
                       int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i == s.size()) break;
      const size_t start = i;
      decode_utf8(s, i);
      out.append(s, start, i - start);
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

Value string_list(std::vector<std::string> parts) {
  List items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

Value Renderer::call_global(const std::string& name, const Args& a) {
  if (name == "raise_exception") {
    // HF's global: jinja2.exceptions.TemplateError(message).
    fail("raise_exception: " + (a.pos.empty() ? std::string() : py_str(a.pos[0])));
  }
  if (name == "strftime_now") {
    const auto p = bind(a, {"format"}, "strftime_now()");
    if (!p[0]) fail("strftime_now() needs a format");
    return Value::string(py_strftime(want_string(*p[0], "strftime_now()'s format"), options.now));
  }
  if (name == "range") {
    if (!a.kw.empty()) fail("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) fail("range() takes 1 to 3 arguments");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = want_int(a.pos[0], "range()'s argument");
    } else {
      start = want_int(a.pos[0], "range()'s argument");
      stop = want_int(a.pos[1], "range()'s argument");
      if (a.pos.size() == 3) step = want_int(a.pos[2], "range()'s argument");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    List items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (items.size() >= 100000) fail("range too big: the sandbox allows at most 100000 items");
      items.push_back(Value::integer(k));
    }
    return Value::list(std::move(items));
  }
  if (name == "dict" || name == "namespace") {
    std::vector<std::pair<std::string, Value>> members;
    auto put = [&](const std::string& key, const Value& value) {
      auto it = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.first == key; });
      if (it != members.end()) {
        it->second = value;
      } else {
        members.emplace_back(key, value);
      }
    };
    if (a.pos.size() > 1) fail(fmt::format("{}() takes at most 1 positional argument", name));
    if (!a.pos.empty()) {
      if (a.pos[0].kind != Kind::kDict) fail(fmt::format("{}()'s positional argument must be a dict", name));
      for (const auto& [key, value] : a.pos[0].entries()) put(want_string(key, "a key"), value);
    }
    for (const auto& [key, value] : a.kw) put(key, value);
    if (name == "dict") {
      Dict d;
      for (auto& [key, value] : members) d.emplace_back(Value::string(key), std::move(value));
      return Value::dict(std::move(d));
    }
    Value ns;
    ns.kind = Kind::kNamespace;
    ns.p = std::make_shared<NamespaceAttrs>(std::move(members));
    return ns;
  }
  fail(fmt::format("function '{}' is not supported", name));
}

Value Renderer::call_method(const Value& self, const std::string& name, const Args& a) {
  const std::string what = fmt::format("{}.{}()", type_name(self), name);
  if (self.kind == Kind::kString) {
    const std::string& s = self.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const auto p = bind(a, {"chars"}, what);
      std::optional<std::string> chars;
      if (p[0] && p[0]->kind != Kind::kNone) chars = want_string(*p[0], what);
      return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith" || name == "endswith") {
      const auto p = bind(a, {"prefix", "start", "end"}, what);
      if (!p[0]) fail(fmt::format("{} needs an argument", what));
      if (p[1] || p[2]) fail(fmt::format("{} with start or end is not supported", what));
      List candidates = p[0]->kind == Kind::kTuple ? p[0]->items() : List{*p[0]};
      for (const Value& c : candidates) {
        const std::string& x = want_string(c, what);
        if (name == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                                 : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0) {
          return Value::boolean(true);
        }
      }
      return Value::boolean(false);
    }
    if (name == "split" || name == "rsplit") {
      const auto p = bind(a, {"sep", "maxsplit"}, what);
      const int64_t maxsplit = p[1] ? want_int(*p[1], what) : -1;
      if (!p[0] || p[0]->kind == Kind::kNone) {
        return string_list(split_whitespace(code_points(s), maxsplit, name == "rsplit"));
      }
      return string_list(split_on(s, want_string(*p[0], what), maxsplit, name == "rsplit"));
    }
    if (name == "splitlines") {
      const auto p = bind(a, {"keepends"}, what);
      const bool keep = p[0] && truthy(*p[0]);
      std::vector<std::string> lines;
      const std::vector<uint32_t> cps = code_points(s);
      size_t start = 0;
      for (size_t k = 0; k < cps.size(); ++k) {
        if (!py_line_break(cps[k])) continue;
        size_t end = k + 1;
        if (cps[k] == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') end = k + 2;
        lines.push_back(from_code_points(std::span(cps).subspan(start, (keep ? end : k) - start)));
        start = end;
        k = end - 1;
      }
      if (start < cps.size()) lines.push_back(from_code_points(std::span(cps).subspan(start)));
      return string_list(std::move(lines));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      bind(a, {}, what);
      if (name == "upper") return Value::string(py_upper(s));
      if (name == "lower") return Value::string(py_lower(s));
      if (name == "title") return Value::string(py_title(s));
      return Value::string(py_capitalize(s));
    }
    if (name == "replace") {
      const auto p = bind(a, {"old", "new", "count"}, what);
      if (!p[0] || !p[1]) fail(fmt::format("{} needs two arguments", what));
      return Value::string(py_replace(s, want_string(*p[0], what), want_string(*p[1], what),
                                      p[2] ? want_int(*p[2], what) : -1));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      const auto p = bind(a, {"sub", "start", "end"}, what);
      if (!p[0]) fail(fmt::format("{} needs an argument", what));
      if (p[1] || p[2]) fail(fmt::format("{} with start or end is not supported", what));
      const std::string& sub = want_string(*p[0], what);
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::integer(n);
      }
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      if (at == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(code_point_count(std::string_view(s).substr(0, at))));
    }
    if (name == "join") {
      const auto p = bind(a, {"iterable"}, what);
      if (!p[0]) fail(fmt::format("{} needs an argument", what));
      std::string out;
      bool first = true;
      for (const Value& item : iterate(*p[0])) {
        if (!first) out += s;
        first = false;
        out += want_string(item, "each item joined");
      }
      return Value::string(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const auto p = bind(a, {"affix"}, what);
      if (!p[0]) fail(fmt::format("{} needs an argument", what));
      const std::string& x = want_string(*p[0], what);
      if (name == "removeprefix") {
        return Value::string(s.compare(0, x.size(), x) == 0 && s.size() >= x.size() ? s.substr(x.size()) : s);
      }
      const bool ends = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      return Value::string(ends && !x.empty() ? s.substr(0, s.size() - x.size()) : s);
    }
    if (name == "isalnum" || name == "isalpha" || name == "isdigit" || name == "isspace" ||
        name == "islower" || name == "isupper") {
      bind(a, {}, what);
      const std::vector<uint32_t> cps = code_points(s);
      if (name == "islower" || name == "isupper") {
        bool any_cased = false, wrong = false;
        for (uint32_t c : cps) {
          if (is_lower(c)) {
            any_cased = true;
            wrong = wrong || name == "isupper";
          } else if (is_upper(c)) {
            any_cased = true;
            wrong = wrong || name == "islower";
          }
        }
        return Value::boolean(any_cased && !wrong);
      }
      if (cps.empty()) return Value::boolean(false);
      for (uint32_t c : cps) {
        const bool ok = name == "isalpha"   ? is_alpha(c)
                        : name == "isdigit" ? is_digit(c)
                        : name == "isspace" ? py_space(c)
                                            : is_alpha(c) || is_digit(c);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    }
    fail(fmt::format("method str.{} is not supported", name));
  }
  if (self.kind == Kind::kDict) {
    if (name == "items" || name == "keys" || name == "values") {
      bind(a, {}, what);
      List out;
      for (const auto& [key, value] : self.entries()) {
        if (name == "items") {
          out.push_back(Value::list({key, value}, true));
        } else {
          out.push_back(name == "keys" ? key : value);
        }
      }
      return Value::list(std::move(out));
    }
    if (name == "get") {
      const auto p = bind(a, {"key", "default"}, what);
      if (!p[0]) fail(fmt::format("{} needs a key", what));
      if (const Value* v = dict_find(self.entries(), *p[0])) return *v;
      return p[1] ? *p[1] : Value::none();
    }
    if (name == "copy") {
      bind(a, {}, what);
      return self;
    }
    fail(fmt::format("method dict.{} is not supported", name));
  }
  if (self.is_sequence()) {
    if (name == "count" || name == "index") {
      const auto p = bind(a, {"value"}, what);
      if (!p[0]) fail(fmt::format("{} needs an argument", what));
      int64_t n = 0, k = 0;
      for (const Value& x : self.items()) {
        if (py_equal(x, *p[0])) {
          if (name == "index") return Value::integer(k);
          ++n;
        }
        ++k;
      }
      if (name == "index") fail(fmt::format("{} is not in {}", py_repr(*p[0]), type_name(self)));
      return Value::integer(n);
    }
    if (name == "copy") {
      bind(a, {}, what);
      return Value::list(self.items());
    }
  }
  fail(fmt::format("method {}.{} is not supported", type_name(self), name));
}

// ---- Filters ----

std::optional<std::string> optional_string(const std::optional<Value>& v, std::string_view what) {
  if (!v || v->kind == Kind::kNone) return std::nullopt;
  return want_string(*v, what);
}

// jinja2's make_attrgetter: "a.b.0" looks up item by item (digits as integers).
Value get_attribute_path(Renderer& r, Value item, const Value& attribute, const std::optional<Value>& dflt) {
  std::vector<Value> parts;
  if (attribute.kind == Kind::kString) {
    size_t start = 0;
    while (true) {
      const size_t dot = attribute.s.find('.', start);
      const std::string part =
          attribute.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else if (attribute.kind != Kind::kNone) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = r.getitem(item, part);
    if (dflt && item.is_undefined()) item = *dflt;
  }
  return item;
}

Value f_trim(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"chars"}, "trim");
  return Value::string(py_strip(py_str(v), optional_string(p[0], "trim's chars"), true, true));
}

Value f_length(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "length");
  return Value::integer(py_len(v));
}

Value f_tojson(Renderer&, const Value& v, const Args& a) {
  // HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps(...).
  const auto p = bind(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonStyle style;
  style.ensure_ascii = p[0] && truthy(*p[0]);
  if (p[1] && p[1]->kind != Kind::kNone) {
    if (p[1]->kind == Kind::kString) {
      style.indent = p[1]->s;
    } else {
      style.indent =
          std::string(static_cast<size_t>(std::max<int64_t>(0, want_int(*p[1], "tojson's indent"))), ' ');
    }
    style.item_separator = ",";
  }
  if (p[2] && p[2]->kind != Kind::kNone) {
    if (!p[2]->is_sequence() || p[2]->items().size() != 2)
      fail("tojson's separators must be a pair of strings");
    style.item_separator = want_string(p[2]->items()[0], "a separator");
    style.key_separator = want_string(p[2]->items()[1], "a separator");
  }
  style.sort_keys = p[3] && truthy(*p[3]);
  std::string out;
  json_dump(v, style, 0, out);
  return Value::string(std::move(out));
}

Value f_string(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "string");
  return v.kind == Kind::kString ? v : Value::string(py_str(v));
}

Value f_upper(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "upper");
  return Value::string(py_upper(py_str(v)));
}

Value f_lower(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "lower");
  return Value::string(py_lower(py_str(v)));
}

Value f_capitalize(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "capitalize");
  return Value::string(py_capitalize(py_str(v)));
}

Value f_title(Renderer&, const Value& v, const Args& a) {
  // jinja2's do_title: words start after -, whitespace, (, {, [ or <.
  bind(a, {}, "title");
  const std::vector<uint32_t> cps = code_points(py_str(v));
  std::string out;
  bool at_start = true;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
    if (sep) {
      encode_utf8(c, out);
    } else {
      append_case(cps, k, at_start ? Case::kUpper : Case::kLower, out);
    }
    at_start = sep;
  }
  return Value::string(std::move(out));
}

Value f_default(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"default_value", "boolean"}, "default");
  const bool boolean = p[1] && truthy(*p[1]);
  if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
  return v;
}

Value f_first(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "first");
  List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "last");
  List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_join(Renderer& r, const Value& v, const Args& a) {
  const auto p = bind(a, {"d", "attribute"}, "join");
  const std::string sep = p[0] ? py_str(*p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(p[1] ? get_attribute_path(r, item, *p[1], std::nullopt) : item);
  }
  return Value::string(std::move(out));
}

Value f_replace(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"old", "new", "count"}, "replace");
  if (!p[0] || !p[1]) fail("replace needs the old and the new string");
  const int64_t count = p[2] && p[2]->kind != Kind::kNone ? want_int(*p[2], "replace's count") : -1;
  return Value::string(py_replace(py_str(v), py_str(*p[0]), py_str(*p[1]), count));
}

Value f_items(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "items");
  if (v.is_undefined()) return Value::list({});
  if (v.kind != Kind::kDict) fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [key, value] : v.entries()) out.push_back(Value::list({key, value}, true));
  return Value::list(std::move(out));
}

Value f_list(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "list");
  return Value::list(iterate(v));
}

Value select_or_reject(Renderer& r, const Value& v, const Args& a, bool by_attribute, bool select) {
  const char* what = by_attribute ? (select ? "selectattr" : "rejectattr") : (select ? "select" : "reject");
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (a.pos.empty()) fail(fmt::format("{} needs an attribute name", what));
    attribute = a.pos[next++];
  }
  TestFn test = nullptr;
  Args test_args;
  if (next < a.pos.size()) {
    const std::string& name = want_string(a.pos[next++], fmt::format("{}'s test", what));
    test = find_test(name);
    if (test == nullptr) fail(fmt::format("test '{}' is not supported", name));
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next), a.pos.end());
    test_args.kw = a.kw;
  } else if (!a.kw.empty()) {
    fail(fmt::format("{} got keyword arguments without a test", what));
  }
  List out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? get_attribute_path(r, item, attribute, std::nullopt) : item;
    const bool passed = test != nullptr ? test(r, subject, test_args) : truthy(subject);
    if (passed == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Renderer& r, const Value& v, const Args& a) {
  return select_or_reject(r, v, a, false, true);
}
Value f_reject(Renderer& r, const Value& v, const Args& a) {
  return select_or_reject(r, v, a, false, false);
}
Value f_selectattr(Renderer& r, const Value& v, const Args& a) {
  return select_or_reject(r, v, a, true, true);
}
Value f_rejectattr(Renderer& r, const Value& v, const Args& a) {
  return select_or_reject(r, v, a, true, false);
}

Value f_map(Renderer& r, const Value& v, const Args& a) {
  List out;
  if (a.pos.empty()) {
    const auto p = bind(a, {"attribute", "default"}, "map");
    if (!p[0]) fail("map needs a filter name or attribute=");
    for (const Value& item : iterate(v)) out.push_back(get_attribute_path(r, item, *p[0], p[1]));
    return Value::list(std::move(out));
  }
  const std::string& name = want_string(a.pos[0], "map's filter");
  FilterFn filter = find_filter(name);
  if (filter == nullptr) fail(fmt::format("filter '{}' is not supported", name));
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& item : iterate(v)) out.push_back(filter(r, item, rest));
  return Value::list(std::move(out));
}

// int(text, base) as Python reads it (whitespace around, a sign, underscores between digits).
std::optional<int64_t> parse_py_int(std::string_view text, int base) {
  std::string s = py_strip(text, std::nullopt, true, true);
  bool negative = false;
  size_t k = 0;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) negative = s[k++] == '-';
  if (base == 16 && s.size() >= k + 2 && s[k] == '0' && (s[k + 1] == 'x' || s[k + 1] == 'X')) k += 2;
  std::string digits;
  for (; k < s.size(); ++k) {
    if (s[k] == '_' && !digits.empty() && k + 1 < s.size() && s[k + 1] != '_') continue;
    digits += s[k];
  }
  if (digits.empty()) return std::nullopt;
  uint64_t value = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (value > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

std::optional<double> parse_py_float(std::string_view text) {
  std::string s = py_strip(text, std::nullopt, true, true);
  std::string lower = py_lower(s);
  size_t k = 0;
  double sign = 1;
  if (!lower.empty() && (lower[0] == '+' || lower[0] == '-')) {
    sign = lower[0] == '-' ? -1 : 1;
    k = 1;
  }
  const std::string rest = lower.substr(k);
  if (rest == "inf" || rest == "infinity") return sign * HUGE_VAL;
  if (rest == "nan") return std::nan("");
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    clean += s[i];
  }
  if (!clean.empty() && clean[0] == '+') clean.erase(0, 1);
  double value = 0;
  auto r = std::from_chars(clean.data(), clean.data() + clean.size(), value);
  if (clean.empty() || r.ec != std::errc() || r.ptr != clean.data() + clean.size()) return std::nullopt;
  return value;
}

Value f_int(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"default", "base"}, "int");
  const Value dflt = p[0] ? *p[0] : Value::integer(0);
  const int base = p[1] ? static_cast<int>(want_int(*p[1], "int's base")) : 10;
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.kind == Kind::kFloat) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return dflt;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.kind == Kind::kString) {
    if (auto i = parse_py_int(v.s, base)) return Value::integer(*i);
    if (auto f = parse_py_float(v.s); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(*f));
    }
  }
  return dflt;
}

Value f_float(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"default"}, "float");
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.kind == Kind::kString) {
    if (auto f = parse_py_float(v.s)) return Value::floating(*f);
  }
  return p[0] ? *p[0] : Value::floating(0.0);
}

Value f_abs(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "abs");
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind == Kind::kFloat) return Value::floating(std::fabs(v.f));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value::integer(std::abs(v.as_int()));
  }
  fail(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value f_round(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"precision", "method"}, "round");
  const int64_t precision = p[0] ? want_int(*p[0], "round's precision") : 0;
  const std::string method = p[1] ? want_string(*p[1], "round's method") : "common";
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail(fmt::format("round needs a number, not {}", type_name(v)));
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::floating(std::ceil(v.as_double() * scale) / scale);
  if (method == "floor") return Value::floating(std::floor(v.as_double() * scale) / scale);
  if (method != "common") fail("round's method must be 'common', 'ceil' or 'floor'");
  if (v.is_integral()) return Value::integer(v.as_int());
  return Value::floating(std::nearbyint(v.f * scale) / scale);  // half to even, as Python's round
}

// The sort key of jinja2's sort/unique/min/max: the attribute, lower-cased unless case_sensitive.
Value sort_key(Renderer& r, const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value key = attribute ? get_attribute_path(r, item, *attribute, std::nullopt) : item;
  if (!case_sensitive && key.kind == Kind::kString) key.s = py_lower(key.s);
  return key;
}

Value f_sort(Renderer& r, const Value& v, const Args& a) {
  const auto p = bind(a, {"reverse", "case_sensitive", "attribute"}, "sort");
  const bool reverse = p[0] && truthy(*p[0]);
  const bool case_sensitive = p[1] && truthy(*p[1]);
  List items = iterate(v);
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k)
    keyed.emplace_back(sort_key(r, items[k], p[2], case_sensitive), k);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  List out;
  for (const auto& [key, k] : keyed) out.push_back(items[k]);
  return Value::list(std::move(out));
}

Value f_unique(Renderer& r, const Value& v, const Args& a) {
  const auto p = bind(a, {"case_sensitive", "attribute"}, "unique");
  const bool case_sensitive = p[0] && truthy(*p[0]);
  List out, seen;
  for (const Value& item : iterate(v)) {
    Value key = sort_key(r, item, p[1], case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value min_or_max(Renderer& r, const Value& v, const Args& a, bool max) {
  const auto p = bind(a, {"case_sensitive", "attribute"}, max ? "max" : "min");
  const bool case_sensitive = p[0] && truthy(*p[0]);
  const List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(r, items[0], p[1], case_sensitive);
  for (size_t k = 1; k < items.size(); ++k) {
    Value key = sort_key(r, items[k], p[1], case_sensitive);
    if (max ? py_less(best_key, key) : py_less(key, best_key)) {
      best = k;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value f_min(Renderer& r, const Value& v, const Args& a) {
  return min_or_max(r, v, a, false);
}
Value f_max(Renderer& r, const Value& v, const Args& a) {
  return min_or_max(r, v, a, true);
}

Value f_sum(Renderer& r, const Value& v, const Args& a) {
  const auto p = bind(a, {"attribute", "start"}, "sum");
  Value total = p[1] ? *p[1] : Value::integer(0);
  for (const Value& item : iterate(v)) {
    total = Renderer::arithmetic("+", total, p[0] ? get_attribute_path(r, item, *p[0], std::nullopt) : item);
  }
  return total;
}

Value f_reverse(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "reverse");
  if (v.kind == Kind::kString) {
    std::vector<uint32_t> cps = code_points(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::string(from_code_points(cps));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_indent(Renderer&, const Value& v, const Args& a) {
  const auto p = bind(a, {"width", "first", "blank"}, "indent");
  std::string indention = "    ";
  if (p[0]) {
    indention =
        p[0]->kind == Kind::kString
            ? p[0]->s
            : std::string(static_cast<size_t>(std::max<int64_t>(0, want_int(*p[0], "indent's width"))), ' ');
  }
  const bool first = p[1] && truthy(*p[1]);
  const bool blank = p[2] && truthy(*p[2]);
  // jinja2's do_indent, on str.splitlines() of the text plus a newline.
  const std::string text = py_str(v) + "\n";
  std::vector<std::string> lines;
  {
    const std::vector<uint32_t> cps = code_points(text);
    size_t start = 0;
    for (size_t k = 0; k < cps.size(); ++k) {
      if (!py_line_break(cps[k])) continue;
      lines.push_back(from_code_points(std::span(cps).subspan(start, k - start)));
      if (cps[k] == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      start = k + 1;
    }
    if (start < cps.size()) lines.push_back(from_code_points(std::span(cps).subspan(start)));
  }
  std::string out;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k > 0) out += "\n" + indention;
      out += lines[k];
    }
  } else if (!lines.empty()) {
    out = lines[0];
    if (lines.size() > 1) {
      out += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) out += "\n";
        out += lines[k].empty() ? lines[k] : indention + lines[k];
      }
    }
  }
  if (first) out = indention + out;
  return Value::string(std::move(out));
}

Value f_escape(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "escape");
  std::string out;
  for (char c : py_str(v)) {
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
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value::string(std::move(out));
}

Value f_safe(Renderer&, const Value& v, const Args& a) {
  bind(a, {}, "safe");
  return Value::string(py_str(v));
}

FilterFn find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"abs", f_abs},         {"capitalize", f_capitalize},
      {"count", f_length},    {"d", f_default},
      {"default", f_default}, {"e", f_escape},
      {"escape", f_escape},   {"first", f_first},
      {"float", f_float},     {"indent", f_indent},
      {"int", f_int},         {"items", f_items},
      {"join", f_join},       {"last", f_last},
      {"length", f_length},   {"list", f_list},
      {"lower", f_lower},     {"map", f_map},
      {"max", f_max},         {"min", f_min},
      {"reject", f_reject},   {"rejectattr", f_rejectattr},
      {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round},     {"safe", f_safe},
      {"select", f_select},   {"selectattr", f_selectattr},
      {"sort", f_sort},       {"string", f_string},
      {"sum", f_sum},         {"title", f_title},
      {"tojson", f_tojson},   {"trim", f_trim},
      {"unique", f_unique},   {"upper", f_upper},
  };
  const auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

// ---- Tests ----

const Value& test_arg(const Args& a, std::string_view test) {
  const auto p = bind(a, {"other"}, fmt::format("test '{}'", test));
  if (!p[0]) fail(fmt::format("test '{}' needs an argument", test));
  return a.pos.empty() ? a.kw[0].second : a.pos[0];
}

bool t_defined(Renderer&, const Value& v, const Args&) {
  return !v.is_undefined();
}
bool t_undefined(Renderer&, const Value& v, const Args&) {
  return v.is_undefined();
}
bool t_none(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kNone;
}
bool t_boolean(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kBool;
}
bool t_true(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kBool && v.b;
}
bool t_false(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kBool && !v.b;
}
bool t_integer(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kInt;
}
bool t_float(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kFloat;
}
bool t_number(Renderer&, const Value& v, const Args&) {
  return v.is_number();
}
bool t_string(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kString;
}
bool t_mapping(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kDict;
}
// jinja2's Undefined defines __iter__, __len__, __getitem__ and __call__: iterable, a sequence, callable.
bool t_iterable(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.is_sequence() || v.kind == Kind::kDict ||
         v.kind == Kind::kLoop;
}
bool t_sequence(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kUndefined || v.kind == Kind::kString || v.is_sequence() || v.kind == Kind::kDict;
}
bool t_callable(Renderer&, const Value& v, const Args&) {
  return v.kind == Kind::kFunction || v.kind == Kind::kUndefined || v.kind == Kind::kLoop;
}
bool t_escaped(Renderer&, const Value&, const Args&) {
  return false;
}

bool t_sameas(Renderer&, const Value& v, const Args& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind != other.kind) return false;
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kUndefined:
      return true;
    case Kind::kBool:
      return v.b == other.b;
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      return py_equal(v, other);
    default:
      return v.p == other.p;
  }
}

int64_t test_int(const Value& v, std::string_view test) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_integral()) fail(fmt::format("test '{}' needs an integer, not {}", test, type_name(v)));
  return v.as_int();
}

bool t_odd(Renderer&, const Value& v, const Args&) {
  return test_int(v, "odd") % 2 != 0;
}
bool t_even(Renderer&, const Value& v, const Args&) {
  return test_int(v, "even") % 2 == 0;
}
bool t_divisibleby(Renderer&, const Value& v, const Args& a) {
  const int64_t d = test_int(test_arg(a, "divisibleby"), "divisibleby");
  if (d == 0) fail("integer division or modulo by zero");
  return test_int(v, "divisibleby") % d == 0;
}

bool case_test(const Value& v, bool upper) {
  bool any_cased = false;
  const std::string s = py_str(v);
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode_utf8(s, i);
    if (is_lower(c)) {
      if (upper) return false;
      any_cased = true;
    } else if (is_upper(c)) {
      if (!upper) return false;
      any_cased = true;
    }
  }
  return any_cased;
}
bool t_lower(Renderer&, const Value& v, const Args&) {
  return case_test(v, false);
}
bool t_upper(Renderer&, const Value& v, const Args&) {
  return case_test(v, true);
}

bool t_in(Renderer&, const Value& v, const Args& a) {
  return py_contains(test_arg(a, "in"), v);
}
bool t_eq(Renderer&, const Value& v, const Args& a) {
  return py_equal(v, test_arg(a, "eq"));
}
bool t_ne(Renderer&, const Value& v, const Args& a) {
  return !py_equal(v, test_arg(a, "ne"));
}
bool t_lt(Renderer&, const Value& v, const Args& a) {
  return py_less(v, test_arg(a, "lt"));
}
bool t_gt(Renderer&, const Value& v, const Args& a) {
  return py_less(test_arg(a, "gt"), v, ">");
}
bool t_le(Renderer&, const Value& v, const Args& a) {
  const Value& o = test_arg(a, "le");
  return py_less(v, o, "<=") || py_equal(v, o);
}
bool t_ge(Renderer&, const Value& v, const Args& a) {
  const Value& o = test_arg(a, "ge");
  return py_less(o, v, ">=") || py_equal(v, o);
}

TestFn find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"sameas", t_sameas},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"lower", t_lower},
      {"upper", t_upper},
      {"in", t_in},
      {"escaped", t_escaped},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
  };
  const auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

// Messages are one line: a raised message may hold newlines.
std::string one_line(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---- The public class ----

struct JinjaTemplate::Impl {
  JinjaOptions options;
  std::vector<StmtPtr> body;
};

JinjaTemplate::JinjaTemplate(std::string_view source, JinjaOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->options = std::move(options);
  try {
    Lexer lexer(source, impl->options);
    Parser parser(lexer.run());
    impl->body = parser.parse_template();
  } catch (const TemplateError& e) {
    throw Error(ExitCode::kData,
                fmt::format("{} line {}: {}", impl->options.where, e.line, one_line(e.message)));
  }
  impl_ = std::move(impl);
}

JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(const JinjaTemplate&) = default;
JinjaTemplate& JinjaTemplate::operator=(const JinjaTemplate&) = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables) const {
  const JinjaOptions& options = impl_->options;
  if (!variables.is_object()) {
    throw Error(ExitCode::kData,
                fmt::format("{}: the variables to render with must be a JSON object", options.where));
  }
  Scope root;
  root.vars.reserve(variables.size());
  for (auto it = variables.begin(); it != variables.end(); ++it)
    root.vars.emplace_back(it.key(), from_json(it.value()));
  Renderer renderer(options, root);
  std::string out;
  try {
    renderer.exec(impl_->body, root, out);
  } catch (const TemplateError& e) {
    throw Error(ExitCode::kData, fmt::format("{} line {}: {}", options.where,
                                             e.line != 0 ? e.line : renderer.line, one_line(e.message)));
  }
  return out;
}

std::string JinjaTemplate::render(const Json& variables) const {
  return render(nlohmann::ordered_json(variables));
}

}  // namespace forge::data
