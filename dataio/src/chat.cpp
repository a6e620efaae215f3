#include "forge/dataio/chat.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

std::string_view role_marker(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return kChatSystem;
    case ChatRole::kUser:
      return kChatUser;
    case ChatRole::kAssistant:
      return kChatAssistant;
  }
  return kChatUser;
}

}  // namespace

std::string parse_chat_line(std::string_view line, ChatRecord& record) {
  record = ChatRecord{};
  const Json rec = Json::parse(line, nullptr, false);
  if (rec.is_discarded()) return "not valid JSON";
  if (!rec.is_object()) return "not a JSON object";
  const auto msgs = rec.find("messages");
  if (msgs == rec.end() || !msgs->is_array()) return "no \"messages\" array";
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    if (!m.is_object()) return fmt::format("messages[{}] is not an object", i);
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return fmt::format("messages[{}] has no string \"role\"", i);
    const auto content = m.find("content");
    if (content == m.end() || !content->is_string())
      return fmt::format("messages[{}] has no string \"content\"", i);
    ChatMessage msg;
    const std::string& r = role->get_ref<const std::string&>();
    if (r == "system") {
      msg.role = ChatRole::kSystem;
    } else if (r == "user") {
      msg.role = ChatRole::kUser;
    } else if (r == "assistant") {
      msg.role = ChatRole::kAssistant;
    } else {
      // Clip what we quote: the reason lands in quality.json and on a terminal.
      return fmt::format("messages[{}] has unknown role {} (system, user or assistant)", i,
                         Json(r.substr(0, 40)).dump());
    }
    msg.content = content->get<std::string>();
    record.messages.push_back(std::move(msg));
  }
  const auto str = [&](const char* key) {
    const auto it = rec.find(key);
    return it != rec.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  record.domain = str("domain");
  record.source = str("source");
  record.license = str("license");
  return "";
}

size_t neutralize_markers(std::string& content) {
  size_t count = 0;
  for (size_t at = content.find("<|"); at != std::string::npos; at = content.find("<|", at + 2)) {
    for (const std::string_view marker : kChatMarkers) {
      if (std::string_view(content).substr(at, marker.size()) == marker) {
        content.insert(at + 2, 1, ' ');
        ++count;
        break;
      }
    }
  }
  return count;
}

std::string render_chat(std::span<const ChatMessage> messages) {
  std::string out;
  size_t size = 0;
  for (const auto& m : messages) size += m.content.size() + 24;
  out.reserve(size);
  for (const auto& m : messages) {
    out += role_marker(m.role);
    out += m.content;
    out += kChatEnd;
  }
  return out;
}

std::string chat_degenerate_reason(std::span<const ChatMessage> messages) {
  if (messages.empty()) return "empty_conversation";
  bool assistant = false;
  for (const auto& m : messages) {
    if (m.role != ChatRole::kAssistant) continue;
    if (m.content.empty()) return "empty_assistant_reply";
    assistant = true;
  }
  return assistant ? "" : "no_assistant_turn";
}

Json chat_template_json() {
  return {{"name", kChatTemplateName},
          {"markers",
           {{"system", kChatSystem},
            {"user", kChatUser},
            {"assistant", kChatAssistant},
            {"end_of_turn", kChatEnd}}},
          {"render",
           "for each message: role marker + content + end_of_turn, no separators; the tokenizer's "
           "end-of-sequence id after the conversation"},
          {"content", std::string("each message's content normalized (") + kNormalizeRules +
                          "), then a marker string inside it respelled with a space after '<|'"},
          {"loss_mask",
           "1 from the token after an assistant marker up to and including its end_of_turn; 0 "
           "elsewhere (other roles, the assistant marker, end-of-sequence)"}};
}

std::string chat_template_sha256() {
  return sha256_hex(chat_template_json().dump());
}

ChatMarkerIds chat_marker_ids(const Tokenizer& tok, const std::string& model_path) {
  uint32_t ids[4] = {};
  std::vector<int> got;
  for (size_t k = 0; k < kChatMarkers.size(); ++k) {
    const std::string marker(kChatMarkers[k]);
    const auto id = tok.piece_id(marker);
    // A piece that BPE merely happens to hold encodes as one id alone but not always next to other text;
    // the mask needs the marker's id wherever the template puts it, so probe it in context (counting, so a
    // model that adds a dummy prefix passes too).
    bool ok = id.has_value();
    for (const auto& [before, after] : std::initializer_list<std::pair<const char*, const char*>>{
             {"", ""}, {"a", "b"}, {"Hello <", "| x"}, {"\n", " \n"}, {"<|end", "|>"}, {"x|", "<|"}}) {
      for (int copies = 1; ok && copies <= 2; ++copies) {
        std::string text = before;
        for (int c = 0; c < copies; ++c) text += marker;
        tok.encode(text + after, got);
        ok = std::count(got.begin(), got.end(), static_cast<int>(*id)) == copies &&
             (copies > 1 || *before || *after || got.size() == 1);
      }
    }
    if (!ok)
      fail(ExitCode::kUsage,
           "--tokenizer {}: the chat marker {} is not a single reserved piece of this model; use a tokenizer "
           "trained by 'forge-data prepare' (it reserves {}, {}, {} and {}) or drop --tokenizer to train one",
           model_path, marker, kChatSystem, kChatUser, kChatAssistant, kChatEnd);
    ids[k] = *id;
  }
  return {ids[0], ids[1], ids[2], ids[3]};
}

void chat_loss_mask(std::span<const uint32_t> ids, const ChatMarkerIds& markers, std::vector<uint8_t>& mask) {
  mask.assign(ids.size(), 0);
  bool in_reply = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id == markers.assistant) {
      in_reply = true;  // the marker itself belongs to the prompt: the template puts it there
      continue;
    }
    if (id == markers.system || id == markers.user) {
      in_reply = false;
      continue;
    }
    mask[i] = in_reply ? 1 : 0;
    if (id == markers.end) in_reply = false;
  }
}

void verify_chat_masks(const std::string& dataset_dir) {
  const Manifest m = load_manifest(dataset_dir);
  const bool chat = m.format == "chat";
  for (const auto& e : m.shards) {
    const std::string path = (fs::path(dataset_dir) / e.file).string();
    const ShardData data = read_shard(path);
    if (!chat) {
      if (!data.loss_mask.empty())
        fail(ExitCode::kData, "shard {}: has a /loss_mask but the manifest's format is text", path);
      continue;
    }
    if (data.loss_mask.size() != data.tokens.size())
      fail(ExitCode::kData,
           "shard {}: a chat shard needs a /loss_mask of one value per token ({} for {} tokens)", path,
           data.loss_mask.size(), data.tokens.size());
    for (size_t d = 0; d + 1 < data.doc_offsets.size(); ++d) {
      uint64_t scored = 0;
      for (uint64_t i = data.doc_offsets[d]; i < data.doc_offsets[d + 1]; ++i) {
        if (data.loss_mask[i] > 1)
          fail(ExitCode::kData, "shard {}: /loss_mask value {} at token {} (must be 0 or 1)", path,
               data.loss_mask[i], i);
        scored += data.loss_mask[i];
      }
      if (scored == 0)
        fail(ExitCode::kData,
             "shard {}: document {} scores no token (a chat document needs an assistant reply)", path, d);
    }
  }
}

}  // namespace forge::data
