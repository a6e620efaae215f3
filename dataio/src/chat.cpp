#include "forge/dataio/chat.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <optional>

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

// "" when `rec` is a parsed JSON object, else why the line is malformed.
std::string check_record(const Json& rec) {
  if (rec.is_discarded()) return "not valid JSON";
  if (!rec.is_object()) return "not a JSON object";
  return "";
}

// One {"role", "content"} object; `where` names it in the reason ("messages[2]").
std::string parse_message(const Json& m, const std::string& where, ChatMessage& msg) {
  if (!m.is_object()) return where + " is not an object";
  const auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return where + " has no string \"role\"";
  const auto content = m.find("content");
  if (content == m.end() || !content->is_string()) return where + " has no string \"content\"";
  const std::string& r = role->get_ref<const std::string&>();
  if (r == "system") {
    msg.role = ChatRole::kSystem;
  } else if (r == "user") {
    msg.role = ChatRole::kUser;
  } else if (r == "assistant") {
    msg.role = ChatRole::kAssistant;
  } else {
    // Clip what we quote: the reason lands in quality.json and on a terminal.
    return fmt::format("{} has unknown role {} (system, user or assistant)", where,
                       Json(r.substr(0, 40)).dump());
  }
  msg.content = content->get<std::string>();
  return "";
}

std::string parse_messages(const Json& list, const char* name, std::vector<ChatMessage>& out) {
  for (size_t i = 0; i < list.size(); ++i) {
    ChatMessage msg;
    if (std::string why = parse_message(list[i], fmt::format("{}[{}]", name, i), msg); !why.empty())
      return why;
    out.push_back(std::move(msg));
  }
  return "";
}

// The optional string fields every record may carry ("" when absent or not a string).
void read_meta(const Json& rec, std::string& domain, std::string& source, std::string& license) {
  const auto str = [&](const char* key) {
    const auto it = rec.find(key);
    return it != rec.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  domain = str("domain");
  source = str("source");
  license = str("license");
}

// A preference reply: a string, one assistant message, or a list holding one assistant message.
std::string parse_reply(const Json& rec, const char* name, std::string& content) {
  const auto it = rec.find(name);
  if (it == rec.end()) return fmt::format("no \"{}\" reply", name);
  if (it->is_string()) {
    content = it->get<std::string>();
    return "";
  }
  const Json* m = &*it;
  std::string where = name;
  if (it->is_array()) {
    if (it->size() != 1)
      return fmt::format(
          "\"{}\" is a list of {} messages (give only the assistant reply; the prompt goes "
          "in \"prompt\")",
          name, it->size());
    m = &(*it)[0];
    where += "[0]";
  } else if (!it->is_object()) {
    return fmt::format("\"{}\" is not a string, an assistant message or a list of one", name);
  }
  ChatMessage msg;
  if (std::string why = parse_message(*m, where, msg); !why.empty()) return why;
  if (msg.role != ChatRole::kAssistant)
    return fmt::format("{} has role {} (a reply is an assistant message)", where, (*m)["role"].dump());
  content = std::move(msg.content);
  return "";
}

}  // namespace

std::string parse_chat_line(std::string_view line, ChatRecord& record) {
  record = ChatRecord{};
  const Json rec = Json::parse(line, nullptr, false);
  if (const std::string why = check_record(rec); !why.empty()) return why;
  const auto msgs = rec.find("messages");
  if (msgs == rec.end() || !msgs->is_array()) return "no \"messages\" array";
  if (std::string why = parse_messages(*msgs, "messages", record.messages); !why.empty()) return why;
  read_meta(rec, record.domain, record.source, record.license);
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

std::vector<ChatMessage> parse_rendered_chat(std::string_view text, const std::string& where) {
  std::vector<ChatMessage> out;
  size_t at = 0;
  const auto bad = [&](std::string_view why) {
    fail(ExitCode::kData,
         "{}: {} at byte {} of a rendered conversation (internal: a stage changed the rendered text)", where,
         why, at);
  };
  while (at < text.size()) {
    ChatMessage m;
    const std::string_view rest = text.substr(at);
    if (rest.starts_with(kChatSystem)) {
      m.role = ChatRole::kSystem;
      at += kChatSystem.size();
    } else if (rest.starts_with(kChatUser)) {
      m.role = ChatRole::kUser;
      at += kChatUser.size();
    } else if (rest.starts_with(kChatAssistant)) {
      m.role = ChatRole::kAssistant;
      at += kChatAssistant.size();
    } else {
      bad("no role marker");
    }
    // "<|end|>" has no border (no proper prefix that is also a suffix), so its first occurrence cannot
    // begin inside the content: content holds no marker.
    const size_t end = text.find(kChatEnd, at);
    if (end == std::string_view::npos) bad("a turn without its end-of-turn marker");
    const std::string_view content = text.substr(at, end - at);
    for (const std::string_view marker : kChatMarkers)
      if (content.find(marker) != std::string_view::npos) bad("a marker inside a message's content");
    m.content = std::string(content);
    out.push_back(std::move(m));
    at = end + kChatEnd.size();
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

std::optional<uint32_t> reserved_piece_id(const Tokenizer& tok, std::string_view piece) {
  const auto id = tok.piece_id(piece);
  // A piece that BPE merely happens to hold encodes as one id alone but not always next to other text; a
  // reserved one is its id wherever it appears, so probe it in context (counting, so that a model that
  // adds a dummy prefix passes too).
  bool ok = id.has_value();
  std::vector<int> got;
  for (const auto& [before, after] : std::initializer_list<std::pair<const char*, const char*>>{
           {"", ""}, {"a", "b"}, {"Hello <", "| x"}, {"\n", " \n"}, {"<|end", "|>"}, {"x|", "<|"}}) {
    for (int copies = 1; ok && copies <= 2; ++copies) {
      std::string text = before;
      for (int c = 0; c < copies; ++c) text += piece;
      tok.encode(text + after, got);
      ok = std::count(got.begin(), got.end(), static_cast<int>(*id)) == copies &&
           (copies > 1 || *before || *after || got.size() == 1);
    }
  }
  return ok ? id : std::nullopt;
}

ChatMarkerIds chat_marker_ids(const Tokenizer& tok, const std::string& model_path) {
  uint32_t ids[4] = {};
  for (size_t k = 0; k < kChatMarkers.size(); ++k) {
    const auto id = reserved_piece_id(tok, kChatMarkers[k]);
    if (!id)
      fail(ExitCode::kUsage,
           "--tokenizer {}: the chat marker {} is not a single reserved piece of this model; use a tokenizer "
           "trained by 'forge-data prepare' (it reserves {}, {}, {} and {}) or drop --tokenizer to train one",
           model_path, kChatMarkers[k], kChatSystem, kChatUser, kChatAssistant, kChatEnd);
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

void final_reply_loss_mask(std::span<const uint32_t> ids, const ChatMarkerIds& markers,
                           std::vector<uint8_t>& mask) {
  chat_loss_mask(ids, markers, mask);
  const auto last = std::find(ids.rbegin(), ids.rend(), markers.assistant);
  const auto reply = static_cast<std::ptrdiff_t>(ids.rend() - last);  // 0 when there is no assistant marker
  std::fill(mask.begin(), mask.begin() + reply, uint8_t{0});
}

namespace {

// The documents of a preference shard, which holds whole pairs (chosen, rejected); kData otherwise.
uint64_t whole_pairs(const std::string& path, const ShardData& data) {
  const uint64_t docs = data.documents();
  if (docs % 2 != 0)
    fail(ExitCode::kData,
         "shard {}: {} documents, but a preference shard holds whole pairs (chosen, rejected); rebuild it "
         "with 'forge-data prepare --format preference'",
         path, docs);
  return docs;
}

// The preference checks of one shard (masks already known to be one 0/1 value per token): pairs whole, each
// half's mask exactly its final reply, both halves on the same prompt tokens.
void verify_pairs(const std::string& path, const ShardData& data, const ChatMarkerIds& markers) {
  const uint64_t docs = whole_pairs(path, data);
  std::vector<uint8_t> want;
  std::span<const uint32_t> prompt[2];
  for (uint64_t d = 0; d < docs; ++d) {
    const uint64_t a = data.doc_offsets[d], b = data.doc_offsets[d + 1];
    // The end-of-sequence id closes every document unscored, also one cut inside its reply.
    const std::span<const uint32_t> ids(data.tokens.data() + a, b - a - (b > a ? 1 : 0));
    final_reply_loss_mask(ids, markers, want);
    want.push_back(0);
    for (uint64_t i = 0; i < b - a; ++i)
      if (data.loss_mask[a + i] != want[i])
        fail(ExitCode::kData,
             "shard {}: document {} ({} of pair {}) has mask {} at its token {}, the final-reply rule gives "
             "{}",
             path, d, d % 2 ? "rejected" : "chosen", d / 2, data.loss_mask[a + i], i, want[i]);
    const auto last = std::find(ids.rbegin(), ids.rend(), markers.assistant);
    prompt[d % 2] = ids.first(static_cast<size_t>(ids.rend() - last));
    if (d % 2 == 1 && !std::equal(prompt[0].begin(), prompt[0].end(), prompt[1].begin(), prompt[1].end()))
      fail(ExitCode::kData,
           "shard {}: documents {} and {} (pair {}) do not start with the same prompt tokens", path, d - 1, d,
           d / 2);
  }
}

// The preference checks of one shard of a dataset rendered with a model's template, whose masks cannot be
// recomputed without the template: pairs whole, each half scoring one run of tokens (its final reply, the
// tokens after it unscored), and both halves on the same prompt tokens, the ones before that run.
void verify_template_pairs(const std::string& path, const ShardData& data) {
  const uint64_t docs = whole_pairs(path, data);
  std::span<const uint32_t> prompt[2];
  for (uint64_t d = 0; d < docs; ++d) {
    const uint64_t a = data.doc_offsets[d], b = data.doc_offsets[d + 1];
    const std::span<const uint8_t> mask(data.loss_mask.data() + a, b - a);
    const auto first = static_cast<size_t>(std::find(mask.begin(), mask.end(), uint8_t{1}) - mask.begin());
    const auto last = static_cast<size_t>(mask.rend() - std::find(mask.rbegin(), mask.rend(), uint8_t{1}));
    if (std::find(mask.begin() + static_cast<std::ptrdiff_t>(first),
                  mask.begin() + static_cast<std::ptrdiff_t>(last),
                  uint8_t{0}) != mask.begin() + static_cast<std::ptrdiff_t>(last))
      fail(ExitCode::kData,
           "shard {}: document {} ({} of pair {}) scores more than one run of tokens; a half scores only its "
           "final reply",
           path, d, d % 2 ? "rejected" : "chosen", d / 2);
    prompt[d % 2] = std::span<const uint32_t>(data.tokens.data() + a, first);
    if (d % 2 == 1 && !std::equal(prompt[0].begin(), prompt[0].end(), prompt[1].begin(), prompt[1].end()))
      fail(ExitCode::kData,
           "shard {}: documents {} and {} (pair {}) do not start with the same prompt tokens before their "
           "scored replies",
           path, d - 1, d, d / 2);
  }
}

}  // namespace

bool uses_model_template(const Json& settings) {
  const auto chat = settings.find("chat");
  if (chat == settings.end() || !chat->is_object()) return false;
  const auto t = chat->find("template");
  return t != chat->end() && t->is_object() && t->value("kind", "") == kModelTemplateKind;
}

void verify_chat_masks(const std::string& dataset_dir) {
  const Manifest m = load_manifest(dataset_dir);
  const bool masked = m.format == "chat" || m.format == "preference" || m.format == "image-text";
  const bool model_template = masked && uses_model_template(m.settings);
  std::optional<ChatMarkerIds> markers;
  if (m.format == "preference" && !model_template) {
    const std::string model = (fs::path(dataset_dir) / m.tokenizer_file).string();
    markers = chat_marker_ids(Tokenizer::load(model), model);
  }
  for (const auto& e : m.shards) {
    const std::string path = (fs::path(dataset_dir) / e.file).string();
    const ShardData data = read_shard(path);
    if (!masked) {
      if (!data.loss_mask.empty())
        fail(ExitCode::kData, "shard {}: has a /loss_mask but the manifest's format is text", path);
      continue;
    }
    if (data.loss_mask.size() != data.tokens.size())
      fail(ExitCode::kData,
           "shard {}: a {} shard needs a /loss_mask of one value per token ({} for {} tokens)", path,
           m.format, data.loss_mask.size(), data.tokens.size());
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
             "shard {}: document {} scores no token (a {} document needs an assistant reply)", path, d,
             m.format);
      // Without markers the rule is not recomputed; the document still ends with the end-of-sequence id,
      // which no template segment holds, unscored.
      const uint64_t end = data.doc_offsets[d + 1] - 1;
      if (model_template && (data.tokens[end] != static_cast<uint32_t>(m.eos_id) || data.loss_mask[end] != 0))
        fail(ExitCode::kData,
             "shard {}: document {} does not end with the end-of-sequence id {} unscored (token {}, mask {})",
             path, d, m.eos_id, data.tokens[end], data.loss_mask[end]);
    }
    if (markers) verify_pairs(path, data, *markers);
    if (model_template && m.format == "preference") verify_template_pairs(path, data);
  }
}

// ---- Preference pairs ----

std::string parse_preference_line(std::string_view line, PreferenceRecord& record) {
  record = PreferenceRecord{};
  const Json rec = Json::parse(line, nullptr, false);
  if (const std::string why = check_record(rec); !why.empty()) return why;
  const auto prompt = rec.find("prompt");
  if (prompt == rec.end()) return "no \"prompt\"";
  if (prompt->is_string()) {
    record.prompt.push_back({ChatRole::kUser, prompt->get<std::string>()});
  } else if (prompt->is_array()) {
    if (std::string why = parse_messages(*prompt, "prompt", record.prompt); !why.empty()) return why;
  } else {
    return "\"prompt\" is not a string or a list of messages";
  }
  if (std::string why = parse_reply(rec, "chosen", record.chosen); !why.empty()) return why;
  if (std::string why = parse_reply(rec, "rejected", record.rejected); !why.empty()) return why;
  read_meta(rec, record.domain, record.source, record.license);
  return "";
}

std::string preference_degenerate_reason(const PreferenceRecord& r) {
  if (std::all_of(r.prompt.begin(), r.prompt.end(), [](const ChatMessage& m) { return m.content.empty(); }))
    return kPreferenceDegenerateReasons[0];
  // The reply would follow a reply: there is no question the pair ranks answers to.
  if (r.prompt.back().role == ChatRole::kAssistant) return kPreferenceDegenerateReasons[1];
  if (r.chosen.empty()) return kPreferenceDegenerateReasons[2];
  if (r.rejected.empty()) return kPreferenceDegenerateReasons[3];
  // Identical halves give DPO a zero margin and no gradient; they only dilute the batch.
  if (r.chosen == r.rejected) return kPreferenceDegenerateReasons[4];
  return "";
}

std::string render_preference_pair(const PreferenceRecord& r) {
  std::vector<ChatMessage> conv = r.prompt;
  conv.push_back({ChatRole::kAssistant, r.chosen});
  std::string out = render_chat(conv);
  out += kPairSeparator;
  conv.back().content = r.rejected;
  out += render_chat(conv);
  return out;
}

std::string chat_template_jinja() {
  return fmt::format(
      "{{% for message in messages %}}{{{{ '<|' + message['role'] + '|>' + message['content'] + '{}' }}}}"
      "{{% endfor %}}{{% if add_generation_prompt %}}{{{{ '{}' }}}}{{% endif %}}",
      kChatEnd, kChatAssistant);
}

std::pair<std::string_view, std::string_view> split_preference_pair(std::string_view text,
                                                                    const std::string& where) {
  const std::string junction = std::string(kChatEnd) + std::string(kPairSeparator);
  const size_t at = text.find(junction);
  if (at == std::string_view::npos)
    fail(ExitCode::kData,
         "{}: a preference pair without the separator between its halves (internal: a "
         "stage changed the rendered pair)",
         where);
  return {text.substr(0, at + kChatEnd.size()), text.substr(at + junction.size())};
}

Json preference_rules_json() {
  return {{"pairs",
           "documents 2k and 2k + 1 of each (split, domain) stream are the chosen and the rejected "
           "conversation of pair k, in the same shard"},
          {"render", "each half: the prompt messages, then the reply as one assistant turn (chat template)"},
          {"loss_mask",
           "only the final assistant reply of each half and its end_of_turn; assistant turns in the prompt "
           "are context"},
          {"cleaning",
           "dedup, near dedup, decontamination and the validation split see a pair as one unit (prompt plus "
           "both replies)"},
          {"max_tokens", "applies to each half; a pair is dropped when either half is dropped"}};
}

}  // namespace forge::data
