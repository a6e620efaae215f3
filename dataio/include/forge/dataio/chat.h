// The chat format (docs/DATA.md, "Chat data"): conversations rendered with a fixed template whose role
// markers and end-of-turn marker are single tokens reserved in every tokenizer `prepare` trains, and the
// loss mask that scores only the assistant's replies. The template's description and its SHA-256 are part
// of the dataset's settings, so changing the template changes every chat dataset's version.
#pragma once

#include "forge/common/json.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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

// Why a well-formed conversation cannot be trained on, or "" when it can: "empty_conversation",
// "no_assistant_turn" or "empty_assistant_reply" (an assistant message with empty content).
std::string chat_degenerate_reason(std::span<const ChatMessage> messages);

// The template as JSON (name, markers, rendering and masking rules) and the SHA-256 of its dump().
Json chat_template_json();
std::string chat_template_sha256();

struct ChatMarkerIds {
  uint32_t system = 0, user = 0, assistant = 0, end = 0;
};

// The marker ids of `tokenizer`. Each marker must be one piece that the tokenizer produces wherever the
// marker appears in text (a user-defined symbol); otherwise forge::Error(kUsage) naming `model_path`, the
// marker and the fix.
ChatMarkerIds chat_marker_ids(const Tokenizer& tokenizer, const std::string& model_path);

// The loss mask of one encoded conversation (`mask` gets ids.size() values): 1 for every token after an
// assistant marker up to and including its end-of-turn, 0 for the other roles' markers and content, the
// assistant marker itself, and whatever follows the last end-of-turn (the end-of-sequence id).
void chat_loss_mask(std::span<const uint32_t> ids, const ChatMarkerIds& markers, std::vector<uint8_t>& mask);

// For a chat dataset (manifest format "chat"): every shard has a /loss_mask of 0s and 1s that scores at
// least one token of each document; for a text dataset: no shard has one. forge::Error(kData) names the
// shard and the document otherwise.
void verify_chat_masks(const std::string& dataset_dir);

}  // namespace forge::data
