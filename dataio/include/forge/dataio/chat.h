// The chat format (docs/DATA.md, "Chat data"): conversations rendered with a fixed template whose role
// markers and end-of-turn marker are single tokens reserved in every tokenizer `prepare` trains, and the
// loss mask that scores only the assistant's replies. The template's description and its SHA-256 are part
// of the dataset's settings, so changing the template changes every chat dataset's version.
// The preference format (docs/DATA.md, "Preference data") reuses the template: a pair is a prompt with a
// chosen and a rejected reply, rendered as two conversations whose masks score only that final reply.
#pragma once

#include "forge/common/json.h"

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace forge::data {

class Tokenizer;

inline constexpr std::string_view kChatSystem = "<|system|>";
inline constexpr std::string_view kChatUser = "<|user|>";
inline constexpr std::string_view kChatAssistant = "<|assistant|>";
inline constexpr std::string_view kChatEnd = "<|end|>";  // end of turn
inline constexpr std::array<std::string_view, 4> kChatMarkers = {kChatSystem, kChatUser, kChatAssistant,
                                                                 kChatEnd};
inline constexpr const char* kChatTemplateName = "forge-chat-1";

enum class ChatRole : uint8_t { kSystem, kUser, kAssistant };

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
};

// One JSONL record: {"messages": [{"role", "content"}, ...], "domain"?, "source"?, "license"?}.
struct ChatRecord {
  std::vector<ChatMessage> messages;
  std::string domain, source, license;  // "" when absent (or not a string)
};

// Parses one line. Returns "" on success, else why the line is malformed, as a short phrase for
// "file:line: why" (not JSON, not an object, no "messages" array, a message that is not an object or
// lacks a string role or content, an unknown role). An empty "messages" array parses (it is degenerate).
std::string parse_chat_line(std::string_view line, ChatRecord& record);

// Content must not be able to start or end a turn: each marker string inside it is respelled with a space
// after "<|" ("<|user|>" -> "<| user|>"), which no tokenizer reads as a marker and which normalization
// keeps. Returns the number of markers respelled.
size_t neutralize_markers(std::string& content);

// For each message: its role marker, its content, kChatEnd; nothing between messages.
std::string render_chat(std::span<const ChatMessage> messages);

// The messages of a text render_chat made (a chat document, or one half of a preference pair, after the
// cleaning stages): split at the markers, which content cannot hold (neutralize_markers).
// forge::Error(kData) naming `where` when the text is not such a rendering (internal: a stage changed it).
std::vector<ChatMessage> parse_rendered_chat(std::string_view text, const std::string& where);

// Why a well-formed conversation cannot be trained on, or "" when it can: "empty_conversation",
// "no_assistant_turn" or "empty_assistant_reply" (an assistant message with empty content).
std::string chat_degenerate_reason(std::span<const ChatMessage> messages);

// render_chat as a Jinja chat template (tokenizer_config.json's chat_template), for models handed to other
// tools in the Hugging Face layout: the same text for the same messages, and the assistant marker as the
// generation prompt.
std::string chat_template_jinja();

// The template as JSON (name, markers, rendering and masking rules) and the SHA-256 of its dump().
Json chat_template_json();
std::string chat_template_sha256();

struct ChatMarkerIds {
  uint32_t system = 0, user = 0, assistant = 0, end = 0;
};

// The id of `piece` when `tokenizer` makes it one token wherever it appears in text (a user-defined symbol),
// probed in several contexts; nullopt otherwise.
std::optional<uint32_t> reserved_piece_id(const Tokenizer& tokenizer, std::string_view piece);

// The marker ids of `tokenizer`. Each marker must be one piece that the tokenizer produces wherever the
// marker appears in text (a user-defined symbol); otherwise forge::Error(kUsage) naming `model_path`, the
// marker and the fix.
ChatMarkerIds chat_marker_ids(const Tokenizer& tokenizer, const std::string& model_path);

// The loss mask of one encoded conversation (`mask` gets ids.size() values): 1 for every token after an
// assistant marker up to and including its end-of-turn, 0 for the other roles' markers and content, the
// assistant marker itself, and whatever follows the last end-of-turn (the end-of-sequence id).
void chat_loss_mask(std::span<const uint32_t> ids, const ChatMarkerIds& markers, std::vector<uint8_t>& mask);

// The mask of one half of a preference pair: chat_loss_mask restricted to the final assistant reply (from
// the token after the last assistant marker up to and including its end-of-turn). Assistant turns inside
// the prompt are context; DPO sums log-probabilities over the reply alone.
void final_reply_loss_mask(std::span<const uint32_t> ids, const ChatMarkerIds& markers,
                           std::vector<uint8_t>& mask);

// settings.chat.template.kind of a chat or preference dataset rendered with a model's own chat template
// (`forge-data prepare --chat-template`, chat_template.h) rather than forge's: its masks come from the
// template's segments, not from marker ids.
inline constexpr const char* kModelTemplateKind = "model";
bool uses_model_template(const Json& settings);

// For a chat dataset (manifest format "chat"): every shard has a /loss_mask of 0s and 1s that scores at
// least one token of each document; for a preference dataset besides: every shard holds an even number of
// documents, each document's mask is exactly final_reply_loss_mask of its tokens (end-of-sequence
// unscored) and the two halves of a pair share their prompt tokens; for a text dataset: no shard has a
// mask. A dataset rendered with a model's template (uses_model_template) has no markers to recompute the
// masks from; what still holds is checked: masks of 0s and 1s scoring at least one token of each document,
// each document ending with the end-of-sequence id unscored, and for preference whole pairs whose halves
// each score one run of tokens (the final reply) after the same prompt tokens. forge::Error(kData) names
// the shard and the document otherwise.
void verify_chat_masks(const std::string& dataset_dir);

// ---- Preference pairs ----

// One JSONL record: {"prompt", "chosen", "rejected", "domain"?, "source"?, "license"?}. The prompt is a
// string (one user message) or a list of messages; each reply a string, an assistant message object or a
// list holding one assistant message.
struct PreferenceRecord {
  std::vector<ChatMessage> prompt;
  std::string chosen, rejected;  // the replies' content
  std::string domain, source, license;
};

// Parses one line. Returns "" on success, else why the line is malformed, as for parse_chat_line. Empty
// strings and an empty prompt list parse (they are degenerate).
std::string parse_preference_line(std::string_view line, PreferenceRecord& record);

// The degenerate reasons, in the order preference_degenerate_reason checks them.
inline constexpr std::array<const char*, 5> kPreferenceDegenerateReasons = {
    "empty_prompt", "prompt_ends_with_assistant", "empty_chosen_reply", "empty_rejected_reply",
    "identical_replies"};

// Why a well-formed (and cleaned) pair cannot be trained on, or "": one of kPreferenceDegenerateReasons.
// An empty prompt has no message with content.
std::string preference_degenerate_reason(const PreferenceRecord& record);

// Between the two rendered halves of a pair while it is one Document: a bare end-of-turn. A rendered
// conversation never holds two end-of-turn markers in a row (every turn opens with a role marker) and
// content cannot hold a marker (neutralize_markers), so the first "<|end|><|end|>" of a pair's text is the
// end of its chosen half; normalization leaves markers alone, so the separator survives every stage.
inline constexpr std::string_view kPairSeparator = kChatEnd;

// render_chat(prompt + chosen) + kPairSeparator + render_chat(prompt + rejected).
std::string render_preference_pair(const PreferenceRecord& record);

// The chosen and the rejected half of a text made by render_preference_pair; forge::Error(kData) naming
// `where` when the text holds no separator.
std::pair<std::string_view, std::string_view> split_preference_pair(std::string_view text,
                                                                    const std::string& where);

// The pair rule as JSON, for the dataset's settings.
Json preference_rules_json();

}  // namespace forge::data
