// `forge-data prepare --chat-template`: chat and preference data rendered with a model's own template
// (fixtures/chat_templates) and encoded with its tokenizer.json (fixtures/hf_tokenizers). The scored tokens
// decode to exactly each reply and the end-of-turn text the template writes after it, the rest to the
// template's prompt side; conversations the template cannot segment are dropped and counted; the template's
// SHA-256 is part of the version; bad options are 64 and a template the engine cannot render 65 before any
// work. (Forge's own template in Jinja form against the built-in path: chat_test.cpp, preference_test.cpp.)
#include "chat_test_support.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/common/text.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/chat_template.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "forge/dataio/verify.h"
#include "support/paths.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>

using namespace forge::data;
using namespace forge::test::chat;
namespace fs = std::filesystem;

namespace {

std::string template_fixture(const std::string& name) {
  return forge::read_file(forge::test::source_path("test/dataio/fixtures/chat_templates/" + name + ".jinja"));
}

std::string tokenizer_fixture(const std::string& name) {
  return forge::test::source_path("test/dataio/fixtures/hf_tokenizers/" + name + ".json");
}

// A model directory as `forge-ckpt import` leaves one: tokenizer_config.json (template, bos, eos) beside
// tokenizer.json. Returns the directory.
std::string model_dir(const forge::test::TempDir& tmp, const std::string& dir,
                      const std::string& template_text, const std::string& tokenizer, const forge::Json& bos,
                      const forge::Json& eos) {
  tmp.write(dir + "/tokenizer_config.json",
            forge::Json{{"chat_template", template_text}, {"bos_token", bos}, {"eos_token", eos}}.dump());
  fs::copy_file(tokenizer_fixture(tokenizer), tmp / (dir + "/tokenizer.json"));
  return tmp / dir;
}

std::string qwen_dir(const forge::test::TempDir& tmp, const std::string& dir = "Qwen2.5-7B-Instruct") {
  return model_dir(tmp, dir, template_fixture("qwen2.5-7b-instruct"), "qwen2", nullptr, "<|im_end|>");
}

const char* role_name(ChatRole r) {
  return r == ChatRole::kSystem ? "system" : r == ChatRole::kUser ? "user" : "assistant";
}

std::string chat_line(const std::vector<ChatMessage>& conv) {
  forge::Json messages = forge::Json::array();
  for (const auto& m : conv) messages.push_back({{"role", role_name(m.role)}, {"content", m.content}});
  return forge::Json{{"messages", messages}}.dump();
}

// Varied conversations: a system prompt every third, two turns every fourth, code and non-ASCII text.
std::vector<std::vector<ChatMessage>> conversations(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<ChatMessage>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<ChatMessage> c;
    if (i % 3 == 0) c.push_back(msg(ChatRole::kSystem, "You are terse. " + words(rng, 4)));
    for (int t = 0; t < 1 + (i % 4 == 1); ++t) {
      c.push_back(msg(ChatRole::kUser, words(rng, 5 + static_cast<int>(rng() % 12))));
      std::string reply = words(rng, 6 + static_cast<int>(rng() % 20));
      if (i % 5 == 2) reply += "\n    x = " + std::to_string(i) + " caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87";
      c.push_back(msg(ChatRole::kAssistant, reply));
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<ChatMessage> cleaned(std::vector<ChatMessage> conv) {
  for (auto& m : conv) {
    m.content = normalize_text(m.content);
    neutralize_markers(m.content);
  }
  return conv;
}

std::string write_chat(const forge::test::TempDir& tmp, const std::vector<std::vector<ChatMessage>>& convs,
                       const std::string& name = "chat.jsonl") {
  std::string text;
  for (const auto& c : convs) text += chat_line(c) + "\n";
  return tmp.write(name, text);
}

PrepareOptions template_options(const std::string& input, const std::string& out, const std::string& format,
                                const std::string& model) {
  PrepareOptions o;
  o.inputs = {{input, "chat"}};
  o.out = out;
  o.ingest.format = format;
  o.valid_fraction = 0.1;
  o.threads = 2;
  o.chat_template = model;
  o.tokenizer_model = model + "/tokenizer.json";
  return o;
}

// Qwen2.5's rendering of the prompt side and of a reply.
std::string qwen_turn(const ChatMessage& m) {
  return std::string("<|im_start|>") + role_name(m.role) + "\n" + m.content + "<|im_end|>\n";
}
constexpr const char* kQwenDefaultSystem =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

// The documents of a dataset keyed by their decoded text (end-of-sequence left out).
std::map<std::string, Doc> docs_by_text(const std::string& dir, const Tokenizer& tok) {
  std::map<std::string, Doc> out;
  for (Doc& d : read_docs(dir)) {
    REQUIRE(d.ids.back() == static_cast<uint32_t>(tok.eos_id()));
    CHECK(d.mask.back() == 0);
    out[decode(tok, std::span<const uint32_t>(d.ids.data(), d.ids.size() - 1))] = std::move(d);
  }
  return out;
}

template <typename F>
forge::ExitCode error_code(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const forge::Error& e) {
    if (what) *what = e.what();
    return e.code();
  }
  FAIL("no forge::Error");
  return forge::ExitCode::kOk;
}

}  // namespace

TEST_CASE("parse_rendered_chat reads render_chat's text back into its messages", "[chat_template]") {
  for (const auto& conv : conversations(20, 4)) {
    const std::vector<ChatMessage> c = cleaned(conv);
    const std::vector<ChatMessage> back = parse_rendered_chat(render_chat(c), "doc");
    REQUIRE(back.size() == c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      CHECK(back[i].role == c[i].role);
      CHECK(back[i].content == c[i].content);
    }
  }
  // Neutralized markers stay content; empty content and a trailing "<|end" fragment are content too.
  const std::vector<ChatMessage> tricky = {msg(ChatRole::kUser, "a <| end|> b <|end"),
                                           msg(ChatRole::kAssistant, ""), msg(ChatRole::kSystem, "|>")};
  const auto back = parse_rendered_chat(render_chat(tricky), "doc");
  REQUIRE(back.size() == 3);
  CHECK(back[0].content == "a <| end|> b <|end");
  CHECK(back[1].content.empty());
  CHECK(back[2].content == "|>");
  CHECK(parse_rendered_chat("", "doc").empty());
  for (const char* bad : {"hello<|end|>", "<|user|>no end", "<|user|>a<|assistant|>b<|end|>"})
    expect_error(forge::ExitCode::kData, [&] { parse_rendered_chat(bad, "src.jsonl:3"); }, {"src.jsonl:3"});
}

TEST_CASE("--chat-template with Qwen2.5's template scores each reply and its <|im_end|>\\n",
          "[chat_template]") {
  forge::test::TempDir tmp;
  const std::string model = qwen_dir(tmp);
  std::vector<std::vector<ChatMessage>> convs = conversations(30, 7);
  // A reply first: the template cannot tell it from a prompt (its prefix renders no conversation).
  convs.push_back({msg(ChatRole::kAssistant, "I speak first."), msg(ChatRole::kUser, "why"),
                   msg(ChatRole::kAssistant, "because")});
  const std::string input = write_chat(tmp, convs);
  const PrepareResult r = prepare_dataset(template_options(input, tmp / "ds", "chat", model));
  verify_dataset(tmp / "ds");
  verify_chat_masks(tmp / "ds");

  const Manifest m = load_manifest(tmp / "ds");
  const ChatTemplate t = ChatTemplate::load(model);
  CHECK(m.format == "chat");
  CHECK(m.tokenizer_file == "tokenizer.json");
  CHECK(uses_model_template(m.settings));
  CHECK(m.settings["chat"]["template"]["kind"] == "model");
  CHECK(m.settings["chat"]["template"]["sha256"] == t.sha256());
  CHECK(m.settings["chat"]["template_sha256"] == t.sha256());
  const forge::Json& q = r.quality.at("chat");
  CHECK(q["template"] == "Qwen2.5-7B-Instruct");
  CHECK(q["model_template"]["source"] == model + "/tokenizer_config.json");
  CHECK(q["model_template"]["sha256"] == t.sha256());
  CHECK(q["model_template"]["dropped"] == 1);
  CHECK(q["degenerate"]["template_cannot_segment"] == 1);
  CHECK(q["degenerate"]["template_raised_exception"] == 0);
  CHECK(q["conversations_encoded"] == 31);
  CHECK(q["conversations"] == 30);
  REQUIRE(q["model_template"]["first_dropped"].size() == 1);
  CHECK_THAT(q["model_template"]["first_dropped"][0].get<std::string>(), Catch::Contains(input + ":31: "));
  INFO(r.summary);
  CHECK_THAT(r.summary, Catch::Contains("chat (Qwen2.5-7B-Instruct): 30 conversations"));
  CHECK_THAT(r.summary, Catch::Contains("template_cannot_segment=1"));

  // Every document: the scored tokens are each reply and "<|im_end|>\n", the rest the template's prompt side.
  const Tokenizer tok = Tokenizer::load(tmp / "ds/tokenizer.json");
  const std::map<std::string, Doc> docs = docs_by_text(tmp / "ds", tok);
  REQUIRE(docs.size() == 30);
  uint64_t scored = 0;
  for (size_t i = 0; i < 30; ++i) {
    const std::vector<ChatMessage> c = cleaned(convs[i]);
    std::string whole = c[0].role == ChatRole::kSystem ? "" : kQwenDefaultSystem, want_scored, want_prompt;
    for (const ChatMessage& mm : c) {
      whole += qwen_turn(mm);
      if (mm.role == ChatRole::kAssistant) {
        want_prompt += "<|im_start|>assistant\n";
        want_scored += mm.content + "<|im_end|>\n";
      } else {
        want_prompt += qwen_turn(mm);
      }
    }
    if (c[0].role != ChatRole::kSystem) want_prompt = kQwenDefaultSystem + want_prompt;
    INFO(whole);
    REQUIRE(docs.count(whole) == 1);
    const Doc& d = docs.at(whole);
    const size_t n = d.ids.size() - 1;
    CHECK(decode_masked(tok, d, 1, n) == want_scored);
    CHECK(decode_masked(tok, d, 0, n) == want_prompt);
    // <|im_start|> and <|im_end|> are single added tokens; <|im_end|> is scored exactly once per reply.
    const auto im_end = tok.piece_id("<|im_end|>");
    REQUIRE(im_end);
    size_t replies = 0, scored_ends = 0;
    for (const ChatMessage& mm : c) replies += mm.role == ChatRole::kAssistant;
    for (size_t k = 0; k < n; ++k) scored_ends += d.ids[k] == *im_end && d.mask[k] == 1;
    CHECK(scored_ends == replies);
    scored += static_cast<uint64_t>(std::count(d.mask.begin(), d.mask.end(), 1));
  }
  CHECK(q["scored_tokens"] == scored);
}

TEST_CASE("--chat-template for preference pairs scores only each half's final reply", "[chat_template]") {
  forge::test::TempDir tmp;
  const std::string model = qwen_dir(tmp);
  std::mt19937 rng(12);
  struct Pair {
    std::vector<ChatMessage> prompt;
    std::string chosen, rejected;
  };
  std::vector<Pair> pairs;
  std::string text;
  for (int i = 0; i < 24; ++i) {
    Pair p;
    if (i % 3 == 0) p.prompt.push_back(msg(ChatRole::kSystem, "Be kind. " + words(rng, 3)));
    if (i % 4 == 1) {  // an earlier assistant turn: context, not scored
      p.prompt.push_back(msg(ChatRole::kUser, words(rng, 5)));
      p.prompt.push_back(msg(ChatRole::kAssistant, "earlier " + words(rng, 6)));
    }
    p.prompt.push_back(msg(ChatRole::kUser, words(rng, 4 + static_cast<int>(rng() % 10))));
    p.chosen = "The answer: " + words(rng, 3 + static_cast<int>(rng() % 15));
    p.rejected = "The answer: " + words(rng, 3 + static_cast<int>(rng() % 15));
    forge::Json prompt = forge::Json::array();
    for (const auto& m : p.prompt) prompt.push_back({{"role", role_name(m.role)}, {"content", m.content}});
    text += forge::Json{{"prompt", prompt}, {"chosen", p.chosen}, {"rejected", p.rejected}}.dump() + "\n";
    pairs.push_back(std::move(p));
  }
  const std::string input = tmp.write("pairs.jsonl", text);
  const PrepareResult r = prepare_dataset(template_options(input, tmp / "ds", "preference", model));
  verify_dataset(tmp / "ds");
  verify_chat_masks(tmp / "ds");
  CHECK(r.quality["preference"]["pairs"] == 24);
  CHECK(r.quality["preference"]["degenerate"]["template_cannot_segment"] == 0);
  CHECK(uses_model_template(load_manifest(tmp / "ds").settings));

  const Tokenizer tok = Tokenizer::load(tmp / "ds/tokenizer.json");
  const std::vector<Doc> docs = read_docs(tmp / "ds");
  REQUIRE(docs.size() == 48);
  std::map<std::string, const Pair*> by_prompt;
  for (const Pair& p : pairs) {
    std::string prompt = p.prompt[0].role == ChatRole::kSystem ? "" : kQwenDefaultSystem;
    for (const ChatMessage& m : cleaned(p.prompt)) prompt += qwen_turn(m);
    by_prompt[prompt + "<|im_start|>assistant\n"] = &p;
  }
  for (size_t i = 0; i < docs.size(); i += 2) {
    const Doc& chosen = docs[i];
    const Doc& rejected = docs[i + 1];
    const std::string prompt = decode_masked(tok, chosen, 0, chosen.ids.size() - 1);
    INFO(prompt);
    REQUIRE(by_prompt.count(prompt) == 1);
    const Pair& p = *by_prompt.at(prompt);
    CHECK(decode_masked(tok, chosen, 1, chosen.ids.size() - 1) == normalize_text(p.chosen) + "<|im_end|>\n");
    CHECK(decode_masked(tok, rejected, 1, rejected.ids.size() - 1) ==
          normalize_text(p.rejected) + "<|im_end|>\n");
    CHECK(decode_masked(tok, rejected, 0, rejected.ids.size() - 1) == prompt);
    // The halves share their prompt tokens, then each scores one run up to the end-of-sequence id.
    const auto first = [](const Doc& d) {
      return static_cast<size_t>(std::find(d.mask.begin(), d.mask.end(), 1) - d.mask.begin());
    };
    REQUIRE(first(chosen) == first(rejected));
    CHECK(std::equal(chosen.ids.begin(), chosen.ids.begin() + static_cast<std::ptrdiff_t>(first(chosen)),
                     rejected.ids.begin()));
    for (const Doc* d : {&chosen, &rejected})
      CHECK(static_cast<size_t>(std::count(d->mask.begin(), d->mask.end(), 1)) ==
            d->ids.size() - 1 - first(*d));
  }

  // verify: a half scoring two runs, halves on different prompt tokens, a scored end-of-sequence id.
  const Manifest m = load_manifest(tmp / "ds");
  const std::string shard = tmp / ("ds/" + m.shards.front().file);
  const ShardData good = read_shard(shard);
  const ShardAttrs attrs = read_shard_layout(shard).attrs;
  ShardData bad = good;
  bad.loss_mask[1] = 1;  // inside the prompt of the first chosen half
  write_shard(shard, bad, attrs, m.token_bytes);
  expect_error(forge::ExitCode::kData, [&] { verify_chat_masks(tmp / "ds"); },
               {shard, "document 0", "more than one run"});
  bad = good;
  bad.tokens[bad.doc_offsets[1] + 1] = bad.tokens[bad.doc_offsets[1] + 1] == 7 ? 8 : 7;
  write_shard(shard, bad, attrs, m.token_bytes);
  expect_error(forge::ExitCode::kData, [&] { verify_chat_masks(tmp / "ds"); },
               {shard, "pair 0", "same prompt tokens"});
  bad = good;
  bad.loss_mask[bad.doc_offsets[1] - 1] = 1;
  write_shard(shard, bad, attrs, m.token_bytes);
  expect_error(forge::ExitCode::kData, [&] { verify_chat_masks(tmp / "ds"); },
               {shard, "document 0", "end-of-sequence"});
  write_shard(shard, good, attrs, m.token_bytes);
  verify_chat_masks(tmp / "ds");
}

TEST_CASE("--chat-template with Llama 3's template: its own BOS once, trimmed replies and <|eot_id|>",
          "[chat_template]") {
  forge::test::TempDir tmp;
  const std::string model =
      model_dir(tmp, "Meta-Llama-3-8B-Instruct", template_fixture("llama-3-8b-instruct"), "llama3",
                "<|begin_of_text|>", "<|eot_id|>");
  std::vector<std::vector<ChatMessage>> convs = conversations(12, 3);
  convs[4].back().content = "  padded reply  \n\n";  // the template trims it
  const std::string input = write_chat(tmp, convs);
  prepare_dataset(template_options(input, tmp / "ds", "chat", model));
  verify_chat_masks(tmp / "ds");
  const Tokenizer tok = Tokenizer::load(tmp / "ds/tokenizer.json");
  const auto bos = tok.piece_id("<|begin_of_text|>");
  REQUIRE(bos);
  const std::map<std::string, Doc> docs = docs_by_text(tmp / "ds", tok);
  REQUIRE(docs.size() == 12);
  for (const auto& c : convs) {
    std::string whole = "<|begin_of_text|>", want_scored, want_prompt = "<|begin_of_text|>";
    for (const ChatMessage& mm : cleaned(c)) {
      const std::string header =
          std::string("<|start_header_id|>") + role_name(mm.role) + "<|end_header_id|>\n\n";
      whole += header + forge::trim(mm.content) + "<|eot_id|>";
      want_prompt += header;
      (mm.role == ChatRole::kAssistant ? want_scored : want_prompt) += forge::trim(mm.content) + "<|eot_id|>";
    }
    INFO(whole);
    REQUIRE(docs.count(whole) == 1);
    const Doc& d = docs.at(whole);
    CHECK(d.ids.front() == *bos);
    CHECK(std::count(d.ids.begin(), d.ids.end(), *bos) == 1);  // encoded without another BOS
    CHECK(decode_masked(tok, d, 1, d.ids.size() - 1) == want_scored);
    CHECK(decode_masked(tok, d, 0, d.ids.size() - 1) == want_prompt);
  }
}

TEST_CASE("the template's SHA-256 is part of the dataset version, where it was read from is not",
          "[chat_template]") {
  forge::test::TempDir tmp;
  const std::string input = write_chat(tmp, conversations(16, 5));
  const std::string a = qwen_dir(tmp, "a");
  prepare_dataset(template_options(input, tmp / "a_ds", "chat", a));
  // The same template elsewhere, given as the file: the same dataset.
  const std::string b = qwen_dir(tmp, "b");
  PrepareOptions ob = template_options(input, tmp / "b_ds", "chat", b);
  ob.chat_template = b + "/tokenizer_config.json";
  prepare_dataset(ob);
  // A template that renders the same text but is another file (a comment added): same shards, new version.
  const std::string c = model_dir(tmp, "c", template_fixture("qwen2.5-7b-instruct") + "{# revised #}",
                                  "qwen2", nullptr, "<|im_end|>");
  prepare_dataset(template_options(input, tmp / "c_ds", "chat", c));
  const Manifest ma = load_manifest(tmp / "a_ds"), mb = load_manifest(tmp / "b_ds"),
                 mc = load_manifest(tmp / "c_ds");
  CHECK(ma.version == mb.version);
  CHECK(ma.version != mc.version);
  REQUIRE(ma.shards.size() == mc.shards.size());
  for (size_t i = 0; i < ma.shards.size(); ++i) CHECK(ma.shards[i].xxh3 == mc.shards[i].xxh3);
  CHECK(mc.settings["chat"]["template_sha256"] == ChatTemplate::load(c).sha256());
  CHECK(ma.settings["chat"]["template_sha256"] != mc.settings["chat"]["template_sha256"]);
}

TEST_CASE("--chat-template: usage errors are 64, a template the engine cannot render 65, before any work",
          "[chat_template]") {
  forge::test::TempDir tmp;
  const std::string model = qwen_dir(tmp);
  const std::string input = write_chat(tmp, conversations(4, 1));
  std::string what;

  PrepareOptions text = template_options(input, tmp / "ds", "text", model);
  CHECK(error_code([&] { prepare_dataset(text); }, &what) == forge::ExitCode::kUsage);
  CHECK_THAT(what, Catch::Contains("--chat-template") && Catch::Contains("--format chat or preference"));

  PrepareOptions no_tokenizer = template_options(input, tmp / "ds", "chat", model);
  no_tokenizer.tokenizer_model.clear();
  CHECK(error_code([&] { prepare_dataset(no_tokenizer); }, &what) == forge::ExitCode::kUsage);
  CHECK_THAT(what, Catch::Contains("needs --tokenizer"));

  PrepareOptions missing = template_options(input, tmp / "ds", "chat", model);
  missing.chat_template = tmp / "nowhere";
  CHECK(error_code([&] { prepare_dataset(missing); }, &what) == forge::ExitCode::kUsage);
  CHECK_THAT(what, Catch::Contains(tmp / "nowhere"));

  // The inputs do not exist: the template fails first (65 naming the construct), before ingest would (64).
  const std::string wordwrap = model_dir(tmp, "ww", "{{ messages | wordwrap }}", "qwen2", nullptr, "x");
  PrepareOptions parse = template_options(tmp / "no-such-input.jsonl", tmp / "ds", "chat", wordwrap);
  CHECK(error_code([&] { prepare_dataset(parse); }, &what) == forge::ExitCode::kData);
  CHECK_THAT(what, Catch::Contains("filter 'wordwrap' is not supported"));
  // One that parses but cannot render (an unsupported method): caught on the probe conversation.
  const std::string method =
      model_dir(tmp, "fmt", "{% for m in messages %}{{ '{}: {}'.format(m.role, m.content) }}{% endfor %}",
                "qwen2", nullptr, "x");
  PrepareOptions render = template_options(tmp / "no-such-input.jsonl", tmp / "ds", "preference", method);
  CHECK(error_code([&] { prepare_dataset(render); }, &what) == forge::ExitCode::kData);
  CHECK_THAT(what, Catch::Contains("probe conversation") && Catch::Contains("format"));
  // And one that renders no reply at all.
  const std::string silent =
      model_dir(tmp, "silent", "{% for m in messages %}{% endfor %}", "qwen2", nullptr, "x");
  PrepareOptions nothing = template_options(tmp / "no-such-input.jsonl", tmp / "ds", "chat", silent);
  CHECK(error_code([&] { prepare_dataset(nothing); }, &what) == forge::ExitCode::kData);
  CHECK_THAT(what, Catch::Contains("probe conversation"));
  CHECK_FALSE(fs::exists(tmp / "ds"));
}

TEST_CASE("conversations a template cannot segment are dropped and counted by reason", "[chat_template]") {
  forge::test::TempDir tmp;
  // Mistral v0.3 folds the system prompt into the last user turn only (a conversation's prefixes do not
  // render as its beginning) and refuses roles that do not alternate (raise_exception).
  const std::string model = model_dir(tmp, "Mistral-7B-Instruct-v0.3",
                                      template_fixture("mistral-7b-instruct-v0.3"), "qwen2", "<s>", "</s>");
  std::vector<std::vector<ChatMessage>> convs = conversations(18, 9);  // 6 with a system prompt
  convs.push_back(
      {msg(ChatRole::kUser, "one"), msg(ChatRole::kUser, "two"), msg(ChatRole::kAssistant, "three")});
  const std::string input = write_chat(tmp, convs);
  const PrepareResult r = prepare_dataset(template_options(input, tmp / "ds", "chat", model));
  verify_chat_masks(tmp / "ds");
  const forge::Json& q = r.quality.at("chat");
  CHECK(q["degenerate"]["template_cannot_segment"] == 6);
  CHECK(q["degenerate"]["template_raised_exception"] == 1);
  CHECK(q["model_template"]["dropped"] == 7);
  CHECK(q["conversations"] == 12);
  REQUIRE(q["model_template"]["first_dropped"].size() == 7);
  CHECK_THAT(q["model_template"]["first_dropped"][6].get<std::string>(),
             Catch::Contains(input + ":19: ") && Catch::Contains("roles must alternate"));
  CHECK_THAT(q["model_template"]["first_dropped"][0].get<std::string>(),
             Catch::Contains("does not render conversations prefix by prefix"));
  // The scored tokens are " " + reply + "</s>" (the template trims the reply).
  const Tokenizer tok = Tokenizer::load(tmp / "ds/tokenizer.json");
  for (const Doc& d : read_docs(tmp / "ds")) {
    const std::string s = decode_masked(tok, d, 1, d.ids.size() - 1);
    CHECK(s.starts_with(" "));
    CHECK(s.ends_with("</s>"));
  }

  // Only conversations it cannot segment: exit 65 naming the first, nothing written.
  const std::string only = write_chat(tmp, {convs[0], convs[3]}, "only.jsonl");
  std::string what;
  CHECK(error_code([&] { prepare_dataset(template_options(only, tmp / "ds2", "chat", model)); }, &what) ==
        forge::ExitCode::kData);
  CHECK_THAT(what, Catch::Contains("no conversation left after the chat template") &&
                       Catch::Contains(only + ":1: "));
  CHECK_FALSE(fs::exists(tmp / "ds2"));
}
