// A model's own prompt format (prompt_format.h): generation_config.json's eos ids, stop strings split into
// stop tokens and strings, chat prompts as the template renders them, the stop criteria on decoded text,
// and the Generator ending a sample where they say.
#include "forge/eval_gate/prompt_format.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/eval_gate/generate.h"
#include "support/paths.h"
#include "support/training.h"

#include <catch2/catch.hpp>

using namespace forge::gate;
using forge::Json;
using forge::data::ChatMessage;
using forge::data::ChatRole;
using forge::data::ChatTemplate;
using forge::data::Tokenizer;

namespace {

std::shared_ptr<const Tokenizer> qwen2_tokenizer() {
  return std::make_shared<const Tokenizer>(
      Tokenizer::load(forge::test::source_path("test/dataio/fixtures/hf_tokenizers/qwen2.json")));
}

std::string qwen25_template() {
  return forge::read_file(
      forge::test::source_path("test/dataio/fixtures/chat_templates/qwen2.5-7b-instruct.jinja"));
}

constexpr const char* kTurnTemplate =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}</turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

int32_t id_of(const Tokenizer& tok, const std::string& piece) {
  const auto id = tok.piece_id(piece);
  REQUIRE(id.has_value());
  return int32_t(*id);
}

std::vector<int32_t> encode(const Tokenizer& tok, const std::string& text) {
  std::vector<int> ids;
  tok.encode(text, ids);
  return {ids.begin(), ids.end()};
}

forge::ExitCode error_code(const std::function<void()>& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    return e.code();
  }
  return forge::ExitCode::kOk;
}

}  // namespace

TEST_CASE("eos_token_ids reads an int, a list of ints, or nothing", "[gate][prompt_format]") {
  CHECK(eos_token_ids(Json{{"eos_token_id", 7}}, "g") == std::vector<int32_t>{7});
  CHECK(eos_token_ids(Json{{"eos_token_id", {128001, 128008, 128009, 128001}}}, "g") ==
        std::vector<int32_t>{128001, 128008, 128009});
  CHECK(eos_token_ids(Json{{"eos_token_id", nullptr}}, "g").empty());
  CHECK(eos_token_ids(Json{{"bos_token_id", 1}}, "g").empty());
  for (const Json& bad : {Json{{"eos_token_id", "2"}}, Json{{"eos_token_id", -1}},
                          Json{{"eos_token_id", 2.5}}, Json{{"eos_token_id", {1, "x"}}}, Json::array()})
    CHECK(error_code([&] { eos_token_ids(bad, "g"); }) == forge::ExitCode::kData);
}

TEST_CASE("find_stop_string: the earliest, the longest of those starting there", "[gate][prompt_format]") {
  const std::vector<std::string> stops = {"</turn>", "</t", "END", ""};
  CHECK(find_stop_string("abc", stops).first == std::string::npos);
  CHECK(find_stop_string("", stops).first == std::string::npos);
  CHECK(find_stop_string("Hi</turn> END", stops) == std::pair<size_t, size_t>{2, 0});
  CHECK(find_stop_string("Hi</tu", stops) == std::pair<size_t, size_t>{2, 1});
  CHECK(find_stop_string("x END </turn>", stops) == std::pair<size_t, size_t>{2, 2});
}

TEST_CASE("split_stops: one-token stop strings are stop tokens, the others strings",
          "[gate][prompt_format]") {
  const auto tok = qwen2_tokenizer();
  const int32_t im_end = id_of(*tok, "<|im_end|>");
  REQUIRE(encode(*tok, "</turn>").size() > 1);
  const std::vector<std::string> strings = {"<|im_end|>", "</turn>", "<|im_end|>", "", "</turn>"};
  const Stops s = split_stops(*tok, strings);
  CHECK(s.tokens == std::vector<int32_t>{im_end});
  CHECK(s.strings == std::vector<std::string>{"</turn>"});
}

TEST_CASE("a model's chat template: prompts, stops and completions", "[gate][prompt_format]") {
  PromptFormat f;
  f.tokenizer = qwen2_tokenizer();
  const Tokenizer& tok = *f.tokenizer;
  const int32_t endoftext = id_of(tok, "<|endoftext|>"), im_end = id_of(tok, "<|im_end|>");
  f.eos = {endoftext};
  CHECK_FALSE(f.can_chat());
  const std::vector<ChatMessage> messages = {{ChatRole::kSystem, "Be brief."},
                                             {ChatRole::kUser, "Hi <|im_end|> there"}};
  CHECK(error_code([&] { f.chat_prompt(messages); }) == forge::ExitCode::kUsage);

  f.chat_template = std::make_shared<const ChatTemplate>(
      ChatTemplate::from_text("qwen", qwen25_template(), std::nullopt, std::string("<|im_end|>")));
  REQUIRE(f.can_chat());
  // The template's text with the generation prompt, encoded as it is (special tokens in content included,
  // as transformers' apply_chat_template(tokenize=True) does).
  const std::string text = f.chat_template->render(messages, true);
  CHECK(text.ends_with("<|im_start|>assistant\n"));
  CHECK(f.chat_prompt(messages) == encode(tok, text));
  // A text continuation ends at eos only; a reply also at the end of its turn (one token here).
  CHECK(f.stops(false).tokens == std::vector<int32_t>{endoftext});
  const Stops own = f.stops(true);
  CHECK(own.tokens == std::vector<int32_t>{endoftext, im_end});
  CHECK(own.strings.empty());

  // A template whose turns end with text of several tokens: a stop string, cut from the completion.
  f.chat_template = std::make_shared<const ChatTemplate>(
      ChatTemplate::from_text("turn", kTurnTemplate, std::nullopt, std::nullopt));
  const Stops turn = f.stops(true);
  CHECK(turn.tokens == std::vector<int32_t>{endoftext});
  CHECK(turn.strings == std::vector<std::string>{"</turn>"});
  Sampling s;
  f.set_stops(turn, s);
  CHECK(s.stop_tokens == turn.tokens);
  REQUIRE(s.stop_after);
  const std::vector<int32_t> hello = encode(tok, "Hello world"), end = encode(tok, "</turn>");
  std::vector<int32_t> sample = hello;
  CHECK_FALSE(s.stop_after(sample));
  for (size_t i = 0; i < end.size(); ++i) {
    sample.push_back(end[i]);
    CHECK(s.stop_after(sample) == (i + 1 == end.size()));
  }
  CHECK(f.completion(sample, turn) == "Hello world");
  Generation g;
  g.tokens = sample;
  g.stopped = true;
  CHECK(f.stop_text(g, turn) == "</turn>");
  g.stop_token = im_end;
  CHECK(f.stop_text(g, turn) == "<|im_end|>");
  // Without stop strings nothing is cut and nothing is called after each token.
  Sampling plain;
  f.set_stops(f.stops(false), plain);
  CHECK_FALSE(plain.stop_after);
  CHECK(f.completion(sample, f.stops(false)) == "Hello world</turn>");
}

TEST_CASE("the Generator ends a sample where stop_after says and records its stop token",
          "[gate][generate]") {
  const auto cfg = forge::trainer::gpt2_spec(2, 32, 4, 64, 24, 24);
  forge::trainer::GPT model(cfg, {.batch = 2});
  forge::test::randomize_weights(model, 5, 0.4f);
  Generator generator(model, 2);
  const std::vector<Request> requests = {{{1, 2, 3}, 1}, {{4, 5}, 2}};
  Sampling s;
  s.max_new_tokens = 10;
  const auto free = generator.run(requests, s);
  REQUIRE(free[0].tokens.size() == 10);
  s.stop_after = [](std::span<const int32_t> tokens) { return tokens.size() == 3; };
  const auto cut = generator.run(requests, s);
  for (size_t i = 0; i < requests.size(); ++i) {
    CHECK(cut[i].stopped);
    CHECK(cut[i].stop_token == -1);
    CHECK(cut[i].tokens == std::vector<int32_t>(free[i].tokens.begin(), free[i].tokens.begin() + 3));
  }
  s.stop_after = nullptr;
  s.stop_tokens = {free[0].tokens[1]};
  const auto stopped = generator.run(std::span(requests.data(), 1), s);
  CHECK(stopped[0].stopped);
  CHECK(stopped[0].stop_token == free[0].tokens[1]);
  CHECK(stopped[0].tokens.size() <= 1);
}
