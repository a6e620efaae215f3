// The Jinja subset (forge/dataio/jinja.h) and models' chat templates (forge/dataio/chat_template.h).
// The reference is python3-jinja2 rendering as Hugging Face transformers does: render_templates.py
// (test/dataio/reference) wrote fixtures/chat_templates/expected.json, every fixture template on every
// conversation with and without the generation prompt, and single constructs; this test needs no Python.
#include "forge/dataio/jinja.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/text.h"
#include "forge/dataio/chat_template.h"
#include "support/paths.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace forge::data;
using OJson = nlohmann::ordered_json;

namespace {

std::string fixture(const std::string& name) {
  return forge::test::source_path("test/dataio/fixtures/chat_templates/" + name);
}

const OJson& expected() {
  static const OJson doc = OJson::parse(forge::read_file(fixture("expected.json")));
  return doc;
}

struct Family {
  std::string name, text;
  std::optional<std::string> bos, eos;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = [] {
    std::vector<Family> out;
    const OJson manifest = OJson::parse(forge::read_file(fixture("templates.json")));
    for (const OJson& t : manifest["templates"]) {
      Family f;
      f.name = t["name"].get<std::string>();
      f.text = forge::read_file(fixture(t["file"].get<std::string>()));
      if (!t["bos_token"].is_null()) f.bos = t["bos_token"].get<std::string>();
      if (!t["eos_token"].is_null()) f.eos = t["eos_token"].get<std::string>();
      out.push_back(std::move(f));
    }
    return out;
  }();
  return all;
}

const Family& family(const std::string& name) {
  for (const Family& f : families())
    if (f.name == name) return f;
  FAIL("no fixture template " << name);
  throw std::logic_error("unreachable");
}

ChatTemplate chat_template(const std::string& name) {
  const Family& f = family(name);
  return ChatTemplate::from_text(f.name, f.text, f.bos, f.eos);
}

std::vector<ChatMessage> messages_of(const std::string& conversation) {
  std::vector<ChatMessage> out;
  for (const OJson& m : expected()["conversations"][conversation]["messages"]) {
    const std::string role = m["role"].get<std::string>();
    out.push_back({role == "system" ? ChatRole::kSystem
                   : role == "user" ? ChatRole::kUser
                                    : ChatRole::kAssistant,
                   m["content"].get<std::string>()});
  }
  return out;
}

// Runs `f`, which must fail with forge::Error(kData) and a one-line message; returns the message.
template <typename F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kData);
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    return what;
  }
  FAIL("no forge::Error was thrown");
  return "";
}

std::string joined(const std::vector<ChatSegment>& segments) {
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

std::vector<std::string> scored(const std::vector<ChatSegment>& segments) {
  std::vector<std::string> out;
  for (const ChatSegment& s : segments)
    if (s.scored) out.push_back(s.text);
  return out;
}

}  // namespace

TEST_CASE("every fixture template renders every conversation as jinja2 does with HF's settings", "[jinja]") {
  std::map<std::string, JinjaTemplate> compiled;
  for (const Family& f : families()) compiled.emplace(f.name, JinjaTemplate(f.text));
  size_t outputs = 0, errors = 0;
  for (const OJson& c : expected()["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const std::string conversation = c["conversation"].get<std::string>();
    const Family& f = family(name);
    const OJson& conv = expected()["conversations"][conversation];
    OJson vars = OJson::object();
    vars["messages"] = conv["messages"];
    vars["tools"] = conv.contains("tools") ? conv["tools"] : OJson(nullptr);
    vars["documents"] = nullptr;
    vars["add_generation_prompt"] = c["add_generation_prompt"];
    vars["date_string"] = expected()["date_string"];
    if (f.bos) vars["bos_token"] = *f.bos;
    if (f.eos) vars["eos_token"] = *f.eos;
    INFO(name << " / " << conversation << " / add_generation_prompt=" << c["add_generation_prompt"].dump());
    const JinjaTemplate& t = compiled.at(name);
    if (c.contains("output")) {
      CHECK(t.render(vars) == c["output"].get<std::string>());
      ++outputs;
    } else {
      const std::string what = data_error([&] { t.render(vars); });
      CHECK_THAT(what, Catch::Contains(c["error"]["message"].get<std::string>()));
      if (c["error"]["type"] == "TemplateError") CHECK_THAT(what, Catch::Contains("raise_exception: "));
      ++errors;
    }
  }
  CHECK(outputs > 200);
  CHECK(errors > 0);
}

TEST_CASE("ChatTemplate::render gives HF's text for the plain conversations", "[jinja]") {
  std::set<std::string> plain;
  for (const OJson& name : expected()["plain_conversations"]) plain.insert(name.get<std::string>());
  for (const Family& f : families()) {
    const ChatTemplate t = ChatTemplate::from_text(f.name, f.text, f.bos, f.eos);
    for (const OJson& c : expected()["cases"]) {
      if (c["template"] != f.name) continue;
      const std::string conversation = c["conversation"].get<std::string>();
      if (plain.count(conversation) == 0) continue;
      INFO(f.name << " / " << conversation
                  << " / add_generation_prompt=" << c["add_generation_prompt"].dump());
      const std::vector<ChatMessage> messages = messages_of(conversation);
      const bool prompt = c["add_generation_prompt"].get<bool>();
      if (c.contains("output")) {
        CHECK(t.render(messages, prompt) == c["output"].get<std::string>());
      } else {
        data_error([&] { t.render(messages, prompt); });
      }
    }
  }
}

TEST_CASE("single constructs render as jinja2 renders them", "[jinja]") {
  const OJson& vars = expected()["construct_variables"];
  for (const OJson& c : expected()["constructs"]) {
    const std::string source = c["template"].get<std::string>();
    INFO(source);
    if (c.contains("output")) {
      CHECK(JinjaTemplate(source).render(vars) == c["output"].get<std::string>());
    } else {
      const std::string what = data_error([&] { JinjaTemplate(source).render(vars); });
      CHECK_THAT(what, Catch::Contains(c["error"]["message"].get<std::string>()));
    }
  }
}

TEST_CASE("HF's generation tags render their body; Json variables work as ordered ones", "[jinja]") {
  const JinjaTemplate t(
      "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}");
  CHECK(t.render(forge::Json{{"messages", {{{"content", "a"}}, {{"content", "b"}}}}}) == "[a][b]");
  // forge::Json sorts members; ordered_json keeps them, which tojson shows.
  const JinjaTemplate j("{{ d | tojson }}");
  CHECK(j.render(forge::Json{{"d", {{"b", 1}, {"a", 2}}}}) == "{\"a\": 2, \"b\": 1}");
  OJson ordered = OJson::object();
  ordered["d"] = OJson::object();
  ordered["d"]["b"] = 1;
  ordered["d"]["a"] = 2;
  CHECK(j.render(ordered) == "{\"b\": 1, \"a\": 2}");
}

TEST_CASE("what the subset cannot parse or render is kData naming the construct and the line", "[jinja]") {
  const OJson vars = {{"x", "text"}, {"xs", OJson::array({1, 2})}};
  auto parse_error = [](const std::string& source) { return data_error([&] { JinjaTemplate t(source); }); };
  auto render_error = [&](const std::string& source) {
    return data_error([&] { JinjaTemplate(source).render(vars); });
  };
  CHECK(parse_error("a\n{{ x | wordwrap }}") == "chat template line 2: filter 'wordwrap' is not supported");
  CHECK(parse_error("{{ x is prime }}") == "chat template line 1: test 'prime' is not supported");
  CHECK(parse_error("\n\n{% include 'other.jinja' %}") ==
        "chat template line 3: tag 'include' is not supported");
  CHECK(parse_error("{% filter upper %}x{% endfilter %}") ==
        "chat template line 1: tag 'filter' is not supported");
  CHECK(parse_error("{% for x in xs recursive %}{% endfor %}") ==
        "chat template line 1: recursive loops are not supported");
  CHECK_THAT(parse_error("{% if x %}\nunclosed"),
             Catch::Contains("'if' of line 1 is never closed (no 'endif')"));
  CHECK_THAT(parse_error("{% for x in xs %}{% endif %}"),
             Catch::Contains("unexpected 'endif': the 'for' of line 1 is still open"));
  CHECK_THAT(parse_error("{% endfor %}"), Catch::Contains("unexpected 'endfor'"));
  CHECK(parse_error("ok\n{{ x ") ==
        "chat template line 2: the '{{' tag is never closed (the template ends inside it)");
  CHECK(parse_error("{% if x") ==
        "chat template line 1: the '{%' tag is never closed (the template ends inside it)");
  CHECK(parse_error("\n{# comment") == "chat template line 2: the comment is never closed (no #})");
  CHECK_THAT(parse_error("{{ 'open }}"), Catch::Contains("unterminated string literal"));
  CHECK_THAT(parse_error("{{ x ]] }}"), Catch::Contains("unexpected ']'"));
  CHECK_THAT(parse_error("{% break %}"), Catch::Contains("'break' outside of a loop"));
  CHECK_THAT(parse_error("{{ f(*xs) }}"), Catch::Contains("*args and **kwargs"));
  CHECK_THAT(parse_error("{{ }}"), Catch::Contains("expected an expression"));
  CHECK_THAT(parse_error("{% raw %}never closed"), Catch::Contains("the raw block is never closed"));

  CHECK(render_error("{{ x }}\n{{ raise_exception('Conversation roles must alternate') }}") ==
        "chat template line 2: raise_exception: Conversation roles must alternate");
  CHECK(render_error("{{ raise_exception('two\nlines') }}") ==
        "chat template line 1: raise_exception: two\\nlines");
  CHECK(render_error("{{ x.zfill(3) }}") == "chat template line 1: method str.zfill is not supported");
  CHECK(render_error("{{ '%s' % x }}") == "chat template line 1: '%' string formatting is not supported");
  CHECK(render_error("{{ lipsum() }}") == "chat template line 1: function 'lipsum' is not supported");
  CHECK(render_error("\n{{ missing.attr }}") == "chat template line 2: 'missing' is undefined");
  CHECK(render_error("{% for a, b in xs %}{% endfor %}") ==
        "chat template line 1: 'int' object is not iterable");
  CHECK_THAT(render_error("{{ xs.pop() }}"),
             Catch::Contains("access to attribute 'pop' of 'list' object is unsafe"));
  CHECK_THAT(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
             Catch::Contains("recurses too deeply"));
  CHECK_THAT(render_error("{{ range(200000) | length }}"), Catch::Contains("range too big"));

  JinjaOptions named;
  named.where = "chat template of /models/m/tokenizer_config.json";
  CHECK(data_error([&] { JinjaTemplate t("{{ x | wordwrap }}", named); }) ==
        "chat template of /models/m/tokenizer_config.json line 1: filter 'wordwrap' is not supported");
}

TEST_CASE("rendering is deterministic: the clock is fixed and renders share nothing", "[jinja]") {
  const Family& f = family("llama-3.2-3b-instruct");
  const JinjaTemplate a(f.text), b(f.text);
  const JinjaTemplate copy = a;
  const OJson vars = {{"messages", OJson::array({{{"role", "user"}, {"content", "hi"}}})},
                      {"add_generation_prompt", true},
                      {"bos_token", "<|begin_of_text|>"}};
  const std::string first = a.render(vars);
  CHECK_THAT(first, Catch::Contains("Today Date: 26 Jul 2024"));
  for (int k = 0; k < 3; ++k) {
    CHECK(a.render(vars) == first);
    CHECK(b.render(vars) == first);
    CHECK(copy.render(vars) == first);
  }
  JinjaOptions later;
  later.now = 1735689600;  // 2025-01-01
  CHECK(JinjaTemplate("{{ strftime_now('%d %b %Y %H:%M') }}", later).render(OJson::object()) ==
        "01 Jan 2025 00:00");
}

TEST_CASE("segments cut each family's rendering at the assistant replies", "[jinja][chat_template]") {
  // Where segments() must fail, for every reply (kAll) or even for the last one (kFinal), since the template
  // renders an earlier part of the conversation differently once it goes on: Qwen3 gives the last reply
  // alone the empty <think> block; Mistral v0.3 and Nemo put the system prompt into the last user turn only
  // (a finished conversation loses it); a reply first has an empty conversation as its prompt.
  struct Fails {
    bool all, final;
  };
  std::map<std::pair<std::string, std::string>, Fails> fails;
  for (const char* qwen3 : {"qwen3-0.6b", "qwen3-1.7b"}) {
    for (const char* c : {"multi_turn", "system_multi_turn", "whitespace_content", "reasoning"}) {
      fails[{qwen3, c}] = {true, false};
    }
  }
  for (const char* mistral : {"mistral-7b-instruct-v0.3", "mistral-nemo-instruct-2407"}) {
    for (const char* c : {"system_user_assistant", "system_multi_turn", "whitespace_content"}) {
      fails[{mistral, c}] = {true, true};
    }
  }
  for (const Family& f : families()) {
    if (f.name != "gpt2-fallback") fails[{f.name, "assistant_first"}] = {true, true};
  }
  size_t checked = 0;
  for (const Family& f : families()) {
    const ChatTemplate t = ChatTemplate::from_text(f.name, f.text, f.bos, f.eos);
    for (const OJson& name : expected()["plain_conversations"]) {
      const std::string conversation = name.get<std::string>();
      const std::vector<ChatMessage> messages = messages_of(conversation);
      INFO(f.name << " / " << conversation);
      std::string whole;
      try {
        whole = t.render(messages, false);
      } catch (const forge::Error&) {
        continue;  // the template refuses the conversation (roles, empty): compared in the render test
      }
      size_t assistants = 0;
      for (const ChatMessage& m : messages) assistants += m.role == ChatRole::kAssistant;
      const auto expected_failure = fails.find({f.name, conversation});
      const Fails fail = expected_failure == fails.end() ? Fails{false, false} : expected_failure->second;
      if (fail.final) {
        CHECK_THAT(data_error([&] { t.segments(messages, ScoredReplies::kFinal); }),
                   Catch::Contains("chat template '" + f.name + "'"));
      } else {
        const std::vector<ChatSegment> last = t.segments(messages, ScoredReplies::kFinal);
        CHECK(joined(last) == whole);
        CHECK(scored(last).size() == std::min<size_t>(assistants, 1));
      }
      if (fail.all) {
        const std::string what = data_error([&] { t.segments(messages); });
        CHECK_THAT(what, Catch::Contains("chat template '" + f.name + "'"));
        continue;
      }
      const std::vector<ChatSegment> all = t.segments(messages);
      CHECK(joined(all) == whole);
      const std::vector<std::string> replies = scored(all);
      REQUIRE(replies.size() == assistants);
      size_t k = 0;
      for (const ChatMessage& m : messages) {
        if (m.role != ChatRole::kAssistant) continue;
        // Each reply holds its content (some templates trim it) and ends the template's way.
        const std::string content = forge::trim(m.content);
        if (!content.empty() && content.find('\n') == std::string::npos) {
          CHECK_THAT(replies[k], Catch::Contains(content));
        }
        if (f.eos) CHECK_THAT(replies[k], Catch::Contains(*f.eos) || Catch::Contains("<|im_end|>"));
        ++k;
      }
      ++checked;
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("each family scores its reply and end-of-turn text, nothing of the prompt",
          "[jinja][chat_template]") {
  const std::vector<ChatMessage> with_system = messages_of("system_user_assistant");
  const std::vector<ChatMessage> two_turns = messages_of("multi_turn");
  const std::map<std::string, std::vector<std::string>> system_replies = {
      {"llama-3-8b-instruct", {"4.<|eot_id|>"}},
      {"llama-3.1-8b-instruct", {"4.<|eot_id|>"}},
      {"llama-3.2-3b-instruct", {"4.<|eot_id|>"}},
      {"qwen2-7b-instruct", {"4.<|im_end|>\n"}},
      {"qwen2.5-7b-instruct", {"4.<|im_end|>\n"}},
      {"qwen3-0.6b", {"<think>\n\n</think>\n\n4.<|im_end|>\n"}},
      {"qwen3-1.7b", {"<think>\n\n</think>\n\n4.<|im_end|>\n"}},
      {"mistral-7b-instruct-v0.1", {" 4.</s>"}},
      {"gpt2-fallback", {"4.<|endoftext|>"}},
  };
  for (const auto& [name, replies] : system_replies) {
    INFO(name);
    CHECK(scored(chat_template(name).segments(with_system)) == replies);
  }
  // The original Mistral/Mixtral templates have no system role; their replies on two user turns.
  CHECK(scored(chat_template("mistral-7b-instruct-v0.1-legacy").segments(two_turns)) ==
        std::vector<std::string>{"Hello. How can I help?</s> ", "7</s> "});
  CHECK(scored(chat_template("mixtral-8x7b-instruct-v0.1-legacy").segments(two_turns)) ==
        std::vector<std::string>{"Hello. How can I help?</s>", "7</s>"});
  CHECK(scored(chat_template("qwen2.5-7b-instruct").segments(two_turns)) ==
        std::vector<std::string>{"Hello. How can I help?<|im_end|>\n", "7<|im_end|>\n"});
  CHECK(scored(chat_template("mistral-7b-instruct-v0.3").segments(two_turns)) ==
        std::vector<std::string>{" Hello. How can I help?</s>", " 7</s>"});
  CHECK(scored(chat_template("mistral-nemo-instruct-2407").segments(two_turns)) ==
        std::vector<std::string>{"Hello. How can I help?</s>", "7</s>"});

  const std::vector<ChatSegment> qwen = chat_template("qwen2.5-7b-instruct").segments(with_system);
  REQUIRE(qwen.size() == 2);
  CHECK_FALSE(qwen[0].scored);
  CHECK(qwen[0].text ==
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  // A conversation ending on a user turn scores nothing.
  const std::vector<ChatMessage> open = messages_of("system_user");
  CHECK(scored(chat_template("llama-3.1-8b-instruct").segments(open)).empty());

  // A multi-turn Qwen3 conversation cannot be scored turn by turn, but its final reply can.
  const ChatTemplate qwen3 = chat_template("qwen3-1.7b");
  CHECK_THAT(data_error([&] { qwen3.segments(two_turns); }),
             Catch::Contains("does not render conversations prefix by prefix"));
  CHECK(scored(qwen3.segments(two_turns, ScoredReplies::kFinal)) ==
        std::vector<std::string>{"<think>\n\n</think>\n\n7<|im_end|>\n"});
}

TEST_CASE("stop strings are the eos token and the end-of-turn text", "[jinja][chat_template]") {
  CHECK(chat_template("llama-3-8b-instruct").stop_strings() == std::vector<std::string>{"<|eot_id|>"});
  CHECK(chat_template("llama-3.1-8b-instruct").stop_strings() == std::vector<std::string>{"<|eot_id|>"});
  CHECK(chat_template("qwen2.5-7b-instruct").stop_strings() == std::vector<std::string>{"<|im_end|>"});
  CHECK(chat_template("qwen3-0.6b").stop_strings() == std::vector<std::string>{"<|im_end|>"});
  CHECK(chat_template("mistral-7b-instruct-v0.1-legacy").stop_strings() == std::vector<std::string>{"</s>"});
  CHECK(chat_template("mistral-nemo-instruct-2407").stop_strings() == std::vector<std::string>{"</s>"});
  CHECK(chat_template("gpt2-fallback").stop_strings() == std::vector<std::string>{"<|endoftext|>"});
  // Qwen2 base-style configs name <|endoftext|> as eos; the template still ends turns with <|im_end|>.
  const ChatTemplate qwen = ChatTemplate::from_text("q", family("qwen2-7b-instruct").text, std::nullopt,
                                                    std::string("<|endoftext|>"));
  CHECK(qwen.stop_strings() == std::vector<std::string>{"<|endoftext|>", "<|im_end|>"});
}

TEST_CASE("ChatTemplate::load reads tokenizer_config.json as transformers does", "[jinja][chat_template]") {
  forge::test::TempDir dir;
  const std::string qwen = family("qwen2.5-7b-instruct").text;
  const std::string path =
      dir.write("Qwen2.5-7B-Instruct/tokenizer_config.json", forge::Json{{"chat_template", qwen},
                                                                         {"bos_token", nullptr},
                                                                         {"eos_token", "<|im_end|>"},
                                                                         {"add_bos_token", false}}
                                                                 .dump());
  const ChatTemplate t = ChatTemplate::load(path);
  CHECK(t.name() == "Qwen2.5-7B-Instruct");
  CHECK(t.source() == path);
  CHECK(t.text() == qwen);
  CHECK_FALSE(t.bos_token());
  CHECK(t.eos_token() == std::optional<std::string>("<|im_end|>"));
  CHECK(t.add_bos_token() == std::optional<bool>(false));
  // The model directory works too.
  CHECK(ChatTemplate::load(dir / "Qwen2.5-7B-Instruct").sha256() == t.sha256());

  // AddedToken objects, a list of named templates, no add_bos_token.
  const std::string llama = family("llama-3.1-8b-instruct").text;
  const std::string named = dir.write(
      "llama/tokenizer_config.json",
      forge::Json{{"chat_template",
                   {{{"name", "tool_use"}, {"template", "x"}}, {{"name", "default"}, {"template", llama}}}},
                  {"bos_token", {{"__type", "AddedToken"}, {"content", "<|begin_of_text|>"}}},
                  {"eos_token", {{"content", "<|eot_id|>"}, {"lstrip", false}}}}
          .dump());
  const ChatTemplate l = ChatTemplate::load(named);
  CHECK(l.text() == llama);
  CHECK(l.bos_token() == std::optional<std::string>("<|begin_of_text|>"));
  CHECK(l.eos_token() == std::optional<std::string>("<|eot_id|>"));
  CHECK_FALSE(l.add_bos_token());
  CHECK_THAT(l.render(messages_of("user_only"), true),
             Catch::StartsWith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>"));

  // A chat_template.jinja beside the config wins over its chat_template.
  dir.write("llama/chat_template.jinja", family("gpt2-fallback").text);
  const ChatTemplate sibling = ChatTemplate::load(named);
  CHECK(sibling.text() == family("gpt2-fallback").text);
  CHECK(sibling.source() == dir / "llama/chat_template.jinja");

  // GPT-2: no template.
  const std::string gpt2 =
      dir.write("gpt2/tokenizer_config.json",
                forge::Json{{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}}.dump());
  CHECK_THAT(data_error([&] { ChatTemplate::load(gpt2); }),
             Catch::Contains(gpt2 + " has no chat_template (and there is no chat_template.jinja beside it)"));
  const ChatTemplate fallback = ChatTemplate::load(gpt2, true);
  CHECK(fallback.text() == ChatTemplate::kFallbackTemplate);
  CHECK(fallback.text() == family("gpt2-fallback").text);
  CHECK(fallback.name() == "gpt2");
  CHECK(fallback.render(messages_of("multi_turn"), true) ==
        "Hi!<|endoftext|>Hello. How can I help?<|endoftext|>Name a prime.<|endoftext|>7<|endoftext|>");

  // Bad files: a list without "default", a template outside the subset (naming the file), bad tokens.
  const std::string no_default =
      dir.write("a/tokenizer_config.json",
                forge::Json{{"chat_template", {{{"name", "rag"}, {"template", "x"}}}}}.dump());
  CHECK_THAT(data_error([&] { ChatTemplate::load(no_default); }),
             Catch::Contains("no \"default\" template (it has: rag)"));
  const std::string unsupported = dir.write(
      "b/tokenizer_config.json", forge::Json{{"chat_template", "{{ messages | wordwrap }}"}}.dump());
  CHECK(data_error([&] { ChatTemplate::load(unsupported); }) ==
        "chat template of " + unsupported + " line 1: filter 'wordwrap' is not supported");
  const std::string bad_token =
      dir.write("c/tokenizer_config.json", forge::Json{{"chat_template", "x"}, {"eos_token", 5}}.dump());
  CHECK_THAT(data_error([&] { ChatTemplate::load(bad_token); }), Catch::Contains("eos_token"));
  CHECK_THROWS_AS(ChatTemplate::load(dir / "missing/tokenizer_config.json"), forge::Error);
}

TEST_CASE("the template's SHA-256 covers its text and its bos/eos strings", "[jinja][chat_template]") {
  const Family& f = family("qwen2.5-7b-instruct");
  const ChatTemplate a = ChatTemplate::from_text("a", f.text, std::nullopt, std::string("<|im_end|>"));
  const ChatTemplate b =
      ChatTemplate::from_text("b", f.text, std::nullopt, std::string("<|im_end|>"), "elsewhere");
  const ChatTemplate other_eos =
      ChatTemplate::from_text("a", f.text, std::nullopt, std::string("<|endoftext|>"));
  const ChatTemplate other_bos =
      ChatTemplate::from_text("a", f.text, std::string("<s>"), std::string("<|im_end|>"));
  const ChatTemplate other_text =
      ChatTemplate::from_text("a", f.text + " ", std::nullopt, std::string("<|im_end|>"));
  CHECK(a.sha256().size() == 64);
  CHECK(a.sha256() == b.sha256());  // the name and the source are not part of it
  CHECK(a.sha256() != other_eos.sha256());
  CHECK(a.sha256() != other_bos.sha256());
  CHECK(a.sha256() != other_text.sha256());
  CHECK(b.to_json() == forge::Json{{"name", "b"}, {"source", "elsewhere"}, {"sha256", a.sha256()}});
}
