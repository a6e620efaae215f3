// A model's chat template (chat_template.h): loading it as transformers does, rendering with HF's
// variables, and locating the assistant replies by rendering prefixes of the conversation.
#include "forge/dataio/chat_template.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <system_error>

namespace forge::data {
namespace {

namespace fs = std::filesystem;

const char* role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kAssistant:
      return "assistant";
    case ChatRole::kUser:
      break;
  }
  return "user";
}

// A special token as tokenizer_config.json writes it: a string, or an AddedToken {"content": ...}.
std::optional<std::string> token_string(const Json& config, const char* key, const std::string& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  fail(ExitCode::kData, "{}: {} is neither a string nor an object with a string \"content\"", path, key);
}

// strftime("%d %b %Y") of the engine's fixed clock, which Llama 3.x templates print as "Today Date".
std::string date_string(int64_t now) {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::tm tm{};
  const auto t = static_cast<time_t>(now);
  gmtime_r(&t, &tm);
  return fmt::format("{:02d} {} {}", tm.tm_mday, kMonths[tm.tm_mon], tm.tm_year + 1900);
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

std::string strip_whitespace(std::string_view s) {
  const auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

JinjaOptions options_for(const std::string& name, const std::string& source) {
  JinjaOptions options;
  options.where =
      source.empty() ? fmt::format("chat template '{}'", name) : fmt::format("chat template of {}", source);
  return options;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string name, std::string source, std::string text,
                           std::optional<std::string> bos_token, std::optional<std::string> eos_token,
                           std::optional<bool> add_bos_token)
    : name_(std::move(name)),
      source_(std::move(source)),
      text_(std::move(text)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)),
      add_bos_token_(add_bos_token),
      template_(text_, options_for(name_, source_)) {}

ChatTemplate ChatTemplate::load(const std::string& tokenizer_config_path, bool fallback) {
  fs::path path = tokenizer_config_path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path /= "tokenizer_config.json";
  const std::string file = path.string();
  const Json config = read_json(file);
  if (!config.is_object()) fail(ExitCode::kData, "{}: not a JSON object", file);

  std::string name = path.parent_path().filename().string();
  if (name.empty() || name == ".") name = path.filename().string();

  // transformers reads a chat_template.jinja beside the config in preference to the config's template.
  std::string source = file;
  std::string text;
  const fs::path jinja_file = path.parent_path() / "chat_template.jinja";
  if (fs::is_regular_file(jinja_file, ec)) {
    source = jinja_file.string();
    text = read_file(source);
  } else {
    const auto it = config.find("chat_template");
    if ((it == config.end() || it->is_null()) && fallback) {
      text = kFallbackTemplate;
    } else if (it == config.end() || it->is_null()) {
      fail(ExitCode::kData, "{} has no chat_template (and there is no chat_template.jinja beside it)", file);
    } else if (it->is_string()) {
      text = it->get<std::string>();
    } else if (it->is_array()) {
      std::vector<std::string> names;
      for (const Json& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          fail(ExitCode::kData,
               "{}: chat_template is a list whose entries are not {{\"name\", \"template\"}}", file);
        }
        names.push_back(entry["name"].get<std::string>());
        if (names.back() == "default") text = entry["template"].get<std::string>();
      }
      if (std::find(names.begin(), names.end(), "default") == names.end()) {
        fail(ExitCode::kData, "{}: chat_template lists no \"default\" template (it has: {})", file,
             fmt::join(names, ", "));
      }
    } else {
      fail(ExitCode::kData, "{}: chat_template is neither a string nor a list of named templates", file);
    }
  }
  std::optional<bool> add_bos;
  if (const auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean()) {
    add_bos = it->get<bool>();
  }
  return ChatTemplate(std::move(name), std::move(source), std::move(text),
                      token_string(config, "bos_token", file), token_string(config, "eos_token", file),
                      add_bos);
}

ChatTemplate ChatTemplate::from_text(std::string name, std::string text, std::optional<std::string> bos_token,
                                     std::optional<std::string> eos_token, std::string source) {
  return ChatTemplate(std::move(name), std::move(source), std::move(text), std::move(bos_token),
                      std::move(eos_token), std::nullopt);
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  // The variables in apply_chat_template's order; ordered_json keeps {"role", "content"} as HF's dicts.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json message = nlohmann::ordered_json::object();
    message["role"] = role_name(m.role);
    message["content"] = m.content;
    list.push_back(std::move(message));
  }
  vars["messages"] = std::move(list);
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (bos_token_) vars["bos_token"] = *bos_token_;
  if (eos_token_) vars["eos_token"] = *eos_token_;
  vars["date_string"] = date_string(JinjaOptions{}.now);
  return template_.render(vars);
}

std::vector<ChatSegment> ChatTemplate::segments(std::span<const ChatMessage> messages,
                                                ScoredReplies scored) const {
  const std::string whole = render(messages, false);
  std::vector<size_t> replies;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == ChatRole::kAssistant) replies.push_back(i);
  }
  if (scored == ScoredReplies::kFinal && replies.size() > 1)
    replies.erase(replies.begin(), replies.end() - 1);

  auto not_prefix = [&](size_t i, std::string_view why) {
    fail(ExitCode::kData,
         "{} does not render conversations prefix by prefix: {} (assistant message {} of a {}-message "
         "conversation), so its replies cannot be told from the prompt",
         options_for(name_, source_).where, why, i + 1, messages.size());
  };
  std::vector<ChatSegment> out;
  size_t cursor = 0;
  for (size_t i : replies) {
    const std::string before = render(messages.first(i), true);
    const std::string through = render(messages.first(i + 1), false);
    if (!starts_with(whole, before) || before.size() < cursor) {
      not_prefix(i,
                 "the messages before the reply, with the generation prompt, are not how the whole "
                 "conversation begins");
    }
    if (!starts_with(whole, through) || through.size() < before.size()) {
      not_prefix(i, "the conversation up to the reply is not how the whole conversation begins");
    }
    if (through.size() == before.size()) not_prefix(i, "the reply renders as nothing");
    if (before.size() > cursor) out.push_back({whole.substr(cursor, before.size() - cursor), false});
    out.push_back({whole.substr(before.size(), through.size() - before.size()), true});
    cursor = through.size();
  }
  if (whole.size() > cursor) out.push_back({whole.substr(cursor), false});
  return out;
}

std::vector<std::string> ChatTemplate::stop_strings() const {
  std::vector<std::string> out;
  if (eos_token_ && !eos_token_->empty()) out.push_back(*eos_token_);
  // The text after a probe reply is the end-of-turn text the template writes after every reply.
  static constexpr std::string_view kProbe = "forge-stop-string-probe";
  const ChatMessage probe[] = {{ChatRole::kUser, "forge-question"},
                               {ChatRole::kAssistant, std::string(kProbe)}};
  for (const ChatSegment& s : segments(probe, ScoredReplies::kFinal)) {
    if (!s.scored) continue;
    const size_t at = s.text.find(kProbe);
    if (at == std::string::npos) break;
    const std::string end = strip_whitespace(std::string_view(s.text).substr(at + kProbe.size()));
    if (!end.empty() && std::find(out.begin(), out.end(), end) == out.end()) out.push_back(end);
  }
  return out;
}

std::string ChatTemplate::sha256() const {
  const Json identity = {{"chat_template", text_},
                         {"bos_token", bos_token_ ? Json(*bos_token_) : Json(nullptr)},
                         {"eos_token", eos_token_ ? Json(*eos_token_) : Json(nullptr)}};
  return sha256_hex(identity.dump());
}

Json ChatTemplate::to_json() const {
  return {{"name", name_}, {"source", source_}, {"sha256", sha256()}};
}

}  // namespace forge::data
