// A Jinja2 subset for Hugging Face chat templates (tokenizer_config.json's "chat_template"): Debian 12
// packages no C++ Jinja engine, and a model's template must render exactly as transformers renders it
// (jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension,
// tojson as json.dumps, raise_exception and strftime_now), byte for byte, or the tokens a model is trained
// on differ from the ones it is prompted with. A template is parsed once and rendered many times.
//
// Supported (what the Llama 3.x, Qwen2/2.5/3, Mistral/Mixtral/Nemo templates use, and the rest of the core
// language around it):
//   Syntax      {{ }}, {% %}, {# #}, whitespace control {%- -%} {{- -}} {#- -#} and {%+ +%}, trim_blocks,
//               lstrip_blocks, {% raw %}; newlines normalized to \n and one trailing newline dropped, as
//               jinja2 does.
//   Tags        if/elif/else; for (tuple targets, `for x in y if cond`, else, loop.index/index0/revindex/
//               revindex0/first/last/length/previtem/nextitem/cycle(), break/continue); set (names, tuples,
//               ns.attr on a namespace(), block set); macro (positional, keyword and default arguments);
//               HF's generation/endgeneration (rendered as its body).
//   Scoping     jinja2's: each loop iteration and each macro call is a scope of its own (a set inside a
//               loop is gone after it, and in the next iteration), if blocks are not; macros see the
//               template's top-level variables and their arguments, not the caller's loop variables.
//   Expressions literals (strings with Python escapes, ints, floats, true/false/none, lists, tuples,
//               dicts), attribute and subscript access (Python's attribute-then-item rules), slices
//               ([1:], [::-1], ...), calls with keyword arguments, + - * / // % ** (Python semantics), ~,
//               comparisons (chained), and/or/not (returning operands), in / not in, is [not] <test>,
//               `a if c else b` (no else: undefined).
//   Filters     abs capitalize count d default e escape first float indent int items join last length
//               list lower map max min reject rejectattr replace reverse round safe select selectattr sort
//               string sum title tojson trim unique upper (tojson as HF's: json.dumps with ensure_ascii,
//               indent, separators, sort_keys; insertion order kept).
//   Tests       defined undefined none boolean true false integer float number string mapping iterable
//               sequence callable sameas odd even divisibleby lower upper in eq/equalto/== ne/!=
//               lt/</lessthan le/<= gt/>/greaterthan ge/>= escaped.
//   Methods     str: strip lstrip rstrip startswith endswith split rsplit splitlines upper lower title
//               capitalize replace find rfind count join removeprefix removesuffix isalnum isalpha isdigit
//               islower isspace isupper; dict: items keys values get copy; list: count index copy. Methods
//               that mutate (list.append, dict.update, ...) fail as HF's immutable sandbox makes them fail.
//   Globals     range, dict, namespace, raise_exception(msg), strftime_now(fmt) on the fixed clock below.
//   Values      Python's: printing None as "None", floats as repr(), lists and dicts as repr(); undefined
//               names follow jinja2's default Undefined (falsy, empty, print as "", an error when used
//               further: an attribute of it, arithmetic on it, calling it).
// Not supported (an error naming the construct): include/extends/import/block/call/filter/with/do tags,
// loop recursion, *args/**kwargs, `%` string formatting and str.format, any other filter, test or method.
// Known differences: case mapping (upper/lower/title/capitalize) is the C library's one-to-one tables plus
// the common one-to-many mappings ("ß" -> "SS", ligatures), title-case digraphs and the final sigma, not all
// of SpecialCasing.txt; repr() of non-ASCII strings escapes only the common non-printable characters; a
// method prints as "<built-in function name>" (Python prints an address); integers are 64-bit (overflow is
// an error). Markup escaping (|safe, |escape) is not modelled: they return strings.
//
// Every failure, in parsing or rendering, is forge::Error(ExitCode::kData) with a one-line message
// "<where> line N: <what>", e.g. "chat template line 3: filter 'wordwrap' is not supported" or
// "chat template line 12: raise_exception: Conversation roles must alternate ...".
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace forge::data {

struct JinjaOptions {
  bool trim_blocks = true;  // Hugging Face's settings
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  // strftime_now's clock in seconds since the epoch (read as UTC): fixed, so that a template printing the
  // date renders the same on every run. Default 2024-07-26 00:00:00, Llama 3.1's own default date.
  int64_t now = 1721952000;
  std::string where = "chat template";  // how messages name the template
};

class JinjaTemplate {
 public:
  // Parses `source`; forge::Error(kData) naming the line on a syntax error or an unsupported construct.
  explicit JinjaTemplate(std::string_view source, JinjaOptions options = {});
  ~JinjaTemplate();
  JinjaTemplate(const JinjaTemplate&);
  JinjaTemplate& operator=(const JinjaTemplate&);
  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;

  // Renders with `variables` (a JSON object: each member a variable). ordered_json keeps the members'
  // order, which tojson and printing a dict show (Json sorts them). Thread-safe: a render shares nothing.
  std::string render(const nlohmann::ordered_json& variables) const;
  std::string render(const Json& variables) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace forge::data
