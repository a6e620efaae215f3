// Chat and preference data rendered with an imported model's own chat template (tokenizer_config.json's
// "chat_template", run by the Jinja subset of jinja.h), so that a fine-tuned Hugging Face model sees its
// conversations exactly as transformers' apply_chat_template shows them at inference, and the loss mask
// scores what the model must generate: each assistant reply and the end-of-turn text after it.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/jinja.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

struct ChatSegment {
  std::string text;
  bool scored = false;  // an assistant reply as the model generates it (content and end-of-turn text)
};

// Which assistant replies segments() scores: every one (SFT), or only the last (a preference pair's reply,
// and templates that render earlier turns differently once the conversation goes on).
enum class ScoredReplies : uint8_t { kAll, kFinal };

class ChatTemplate {
 public:
  // From a tokenizer_config.json (or the model directory holding one): chat_template (a string, or a list of
  // {"name", "template"} of which "default" is taken; a chat_template.jinja beside the file wins, as in
  // transformers), bos_token and eos_token (strings or {"content": ...}) and add_bos_token. forge::Error
  // kData naming the file when the template is outside the Jinja subset, or when there is none and not
  // `fallback` (with it: kFallbackTemplate); kIo when the file cannot be read.
  static ChatTemplate load(const std::string& tokenizer_config_path, bool fallback = false);
  static ChatTemplate from_text(std::string name, std::string text, std::optional<std::string> bos_token,
                                std::optional<std::string> eos_token, std::string source = "");

  // For models that ship no template (GPT-2): transformers' old GPT-2 default, each message's content and
  // the end-of-sequence token (the DialoGPT format). No role markers: the text GPT-2's vocabulary knows.
  static constexpr std::string_view kFallbackTemplate =
      "{% for message in messages %}{{ message.content }}{{ eos_token }}{% endfor %}";

  const std::string& name() const { return name_; }      // the model directory's name
  const std::string& source() const { return source_; }  // the file the template came from
  const std::string& text() const { return text_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  // Whether the tokenizer adds BOS when encoding (absent: the file does not say). Templates that print
  // bos_token themselves want the text encoded without another one.
  std::optional<bool> add_bos_token() const { return add_bos_token_; }

  // apply_chat_template's text: HF's variables (messages, add_generation_prompt, bos_token, eos_token,
  // tools and documents none, date_string) and strftime_now on a fixed date (26 Jul 2024).
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  // render(messages, false) cut into pieces, in order, scored pieces being the assistant replies: the text
  // before assistant message i is render(messages[0..i), true) and the reply what render(messages[0..i])
  // adds to it. forge::Error(kData) naming the template when it does not render prefixes as prefixes of the
  // whole conversation (or renders a reply as nothing), since its replies then cannot be located.
  std::vector<ChatSegment> segments(std::span<const ChatMessage> messages,
                                    ScoredReplies scored = ScoredReplies::kAll) const;

  // What ends a generated reply: the eos token and the end-of-turn text the template puts after an
  // assistant message (e.g. "<|im_end|>", "<|eot_id|>"), without surrounding whitespace, distinct.
  std::vector<std::string> stop_strings() const;

  // SHA-256 of the template text and the bos/eos strings: part of a dataset's version.
  std::string sha256() const;
  Json to_json() const;  // {"name", "source", "sha256"}

 private:
  ChatTemplate(std::string name, std::string source, std::string text, std::optional<std::string> bos_token,
               std::optional<std::string> eos_token, std::optional<bool> add_bos_token);

  std::string name_, source_, text_;
  std::optional<std::string> bos_token_, eos_token_;
  std::optional<bool> add_bos_token_;
  JinjaTemplate template_;
};

}  // namespace forge::data
