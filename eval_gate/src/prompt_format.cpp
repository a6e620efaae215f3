#include "forge/eval_gate/prompt_format.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/dataio/manifest.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <filesystem>

namespace forge::gate {
namespace {

namespace fs = std::filesystem;

// How far up a lineage ModelFiles looks (a fine-tune of a fine-tune of ... an import).
constexpr int kMaxLineageDepth = 64;

// Whether a tokenizer_config.json names a chat template (or has a chat_template.jinja beside it, which
// transformers prefers).
bool has_chat_template(const std::string& tokenizer_config) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(tokenizer_config).parent_path() / "chat_template.jinja", ec)) return true;
  try {
    const Json config = read_json(tokenizer_config);
    return config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null();
  } catch (const Error&) {
    return true;  // unreadable: ChatTemplate::load says why, when chat needs it
  }
}

std::string or_none(const std::string& sha) {
  return sha.empty() ? "none" : sha;
}

}  // namespace

std::string recorded_tokenizer(const ckpt::Manifest& manifest) {
  const auto it = manifest.meta.extra.find("tokenizer_sha256");
  return it != manifest.meta.extra.end() && it->is_string() ? it->get<std::string>() : std::string();
}

ModelFiles ModelFiles::of_checkpoint(const std::string& checkpoint_dir) {
  ModelFiles out;
  std::string dir = checkpoint_dir;
  for (int depth = 0; depth < kMaxLineageDepth; ++depth) {
    std::optional<ckpt::Checkpoint> c;
    try {
      c.emplace(ckpt::Checkpoint::open(dir));
    } catch (const Error& e) {
      if (depth == 0) throw;
      spdlog::debug("{}'s lineage ends at {}: {}", checkpoint_dir, dir, e.what());
      break;
    }
    const ckpt::Manifest& m = c->manifest();
    const std::string recorded = recorded_tokenizer(m);
    if (depth == 0) out.tokenizer_sha256 = recorded;
    // An ancestor's files speak for this model only with the tokenizer it was trained with.
    if (depth > 0 && recorded != out.tokenizer_sha256) break;
    const bool holds = m.files.count("tokenizer.json") > 0 || m.files.count("tokenizer.model") > 0;
    if (holds) {
      out.checkpoint = dir;
      out.tokenizer = c->verify_file("tokenizer.json");
      if (out.tokenizer.empty()) out.tokenizer = c->verify_file("tokenizer.model");
      out.tokenizer_config = c->verify_file("tokenizer_config.json");
      out.generation_config = c->verify_file("generation_config.json");
      return out;
    }
    // A model that records no tokenizer has no ancestor's to borrow (its tokens are not text).
    if (out.tokenizer_sha256.empty()) break;
    const Json lineage = m.meta.extra.value("lineage", Json::object());
    const std::string parent = lineage.is_object() ? lineage.value("parent", std::string()) : std::string();
    if (parent.empty()) break;
    dir = parent;
  }
  return out;
}

void check_tokenizer(const std::string& checkpoint_dir, const std::string& dataset_dir, const char* role) {
  const ckpt::Checkpoint checkpoint = ckpt::Checkpoint::open(checkpoint_dir);
  const std::string recorded = recorded_tokenizer(checkpoint.manifest());
  if (recorded.empty()) return;
  const data::Manifest dataset = data::load_manifest(dataset_dir);
  if (dataset.tokenizer_sha256 == recorded) return;
  // An imported model holds its tokenizer: name it as the one to prepare with.
  std::string file = "FILE";
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (checkpoint.manifest().files.count(name) > 0) {
      file = (fs::path(checkpoint_dir) / name).string();
      break;
    }
  fail(ExitCode::kUsage,
       "{} {} speaks tokenizer {} (its manifest's tokenizer_sha256) but the dataset {} is tokenized with {} "
       "({}): give a dataset prepared with the model's tokenizer (forge-data prepare --tokenizer {})",
       role, checkpoint_dir, recorded, dataset_dir, or_none(dataset.tokenizer_sha256), dataset.tokenizer_file,
       file);
}

std::vector<int32_t> eos_token_ids(const Json& generation_config, const std::string& where) {
  std::vector<int32_t> out;
  if (!generation_config.is_object()) fail(ExitCode::kData, "{}: not a JSON object", where);
  const auto it = generation_config.find("eos_token_id");
  if (it == generation_config.end() || it->is_null()) return out;
  const auto add = [&](const Json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(ExitCode::kData, "{}: eos_token_id {} is not a token id (give an int or a list of ints)", where,
           it->dump());
    const auto id = static_cast<int32_t>(v.get<int64_t>());
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (it->is_array()) {
    for (const Json& v : *it) add(v);
  } else {
    add(*it);
  }
  return out;
}

Stops split_stops(const data::Tokenizer& tokenizer, std::span<const std::string> stop_strings) {
  Stops out;
  std::vector<int> ids;
  for (const std::string& s : stop_strings) {
    if (s.empty()) continue;
    tokenizer.encode(s, ids);
    if (ids.size() == 1) {
      if (std::find(out.tokens.begin(), out.tokens.end(), ids[0]) == out.tokens.end())
        out.tokens.push_back(ids[0]);
    } else if (std::find(out.strings.begin(), out.strings.end(), s) == out.strings.end()) {
      out.strings.push_back(s);
    }
  }
  return out;
}

std::string PromptFormat::chat_name() const {
  if (chat_template) return fmt::format("{} (sha256 {})", chat_template->name(), chat_template->sha256());
  return chat && chat_template_error.empty() ? data::kChatTemplateName : "none";
}

std::vector<int32_t> PromptFormat::encode(std::string_view text) const {
  std::vector<int> ids;
  tokenizer->encode(text, ids);
  return {ids.begin(), ids.end()};
}

std::vector<int32_t> PromptFormat::text_prompt(std::string_view text) const {
  std::vector<int32_t> ids = encode(text);
  if (!ids.empty()) return ids;
  if (tokenizer->eos_id() >= 0)
    ids.push_back(int32_t(tokenizer->eos_id()));
  else if (!eos.empty())
    ids.push_back(eos.front());
  else
    fail(ExitCode::kUsage, "the prompt \"{}\" has no tokens and {} no end-of-sequence token to start from",
         text, tokenizer_path);
  return ids;
}

std::vector<int32_t> PromptFormat::chat_prompt(std::span<const data::ChatMessage> messages) const {
  if (!chat_template_error.empty()) fail(ExitCode::kData, "{}", chat_template_error);
  if (chat_template) return encode(chat_template->render(messages, /*add_generation_prompt=*/true));
  if (!chat)
    fail(
        ExitCode::kUsage,
        "the tokenizer {} has neither forge's chat markers nor a chat template beside it: chat needs a model "
        "trained with a chat-capable tokenizer, or one with its own template (tokenizer_config.json)",
        tokenizer_path);
  std::vector<data::ChatMessage> turns(messages.begin(), messages.end());
  for (auto& m : turns) data::neutralize_markers(m.content);
  return encode(data::render_chat(turns) + std::string(data::kChatAssistant));
}

Stops PromptFormat::stops(bool chat_reply) const {
  Stops out;
  out.tokens = eos;
  if (!chat_reply) return out;
  if (!chat_template_error.empty()) fail(ExitCode::kData, "{}", chat_template_error);
  const auto add_token = [&](int32_t id) {
    if (std::find(out.tokens.begin(), out.tokens.end(), id) == out.tokens.end()) out.tokens.push_back(id);
  };
  if (chat_template) {
    const std::vector<std::string> strings = chat_template->stop_strings();
    const Stops s = split_stops(*tokenizer, strings);
    for (int32_t id : s.tokens) add_token(id);
    out.strings = s.strings;
  } else if (chat) {
    add_token(int32_t(chat->end));
  }
  return out;
}

void PromptFormat::set_stops(const Stops& stops, Sampling& s) const {
  s.stop_tokens = stops.tokens;
  s.stop_after = nullptr;
  if (stops.strings.empty()) return;
  s.stop_after = [tok = tokenizer, strings = stops.strings](std::span<const int32_t> tokens) {
    const std::string text = tok->decode(std::span<const int>(tokens.data(), tokens.size()));
    return find_stop_string(text, strings).first != std::string::npos;
  };
}

std::string PromptFormat::completion(std::span<const int32_t> tokens, const Stops& stops) const {
  std::string text = tokenizer->decode(std::span<const int>(tokens.data(), tokens.size()));
  const size_t at = find_stop_string(text, stops.strings).first;
  if (at != std::string::npos) text.resize(at);
  return text;
}

std::string PromptFormat::stop_text(const Generation& g, const Stops& stops) const {
  if (g.stop_token >= 0) return tokenizer->decode(std::vector<int>{g.stop_token});
  if (!g.stopped) return "";
  const std::string text = tokenizer->decode(std::span<const int>(g.tokens.data(), g.tokens.size()));
  const auto [at, which] = find_stop_string(text, stops.strings);
  return at == std::string::npos ? std::string() : stops.strings[which];
}

PromptFormat PromptFormat::of_model(const std::string& checkpoint_dir, const std::string& dataset_dir,
                                    const std::string& template_path) {
  const ModelFiles files = ModelFiles::of_checkpoint(checkpoint_dir);
  PromptFormat f;
  std::string dataset_template;  // the SHA-256 of the template the dataset's chat data were rendered with
  if (!dataset_dir.empty()) {
    check_tokenizer(checkpoint_dir, dataset_dir, "the model");
    const data::Manifest manifest = data::load_manifest(dataset_dir);
    f.tokenizer_path = dataset_dir + "/" + manifest.tokenizer_file;
    dataset_template =
        manifest.settings.value("chat", Json::object()).value("template_sha256", std::string());
  } else if (!files.tokenizer.empty()) {
    f.tokenizer_path = files.tokenizer;
  } else {
    fail(ExitCode::kUsage,
         "{} holds no tokenizer (tokenizer.json or tokenizer.model; nor does a checkpoint it was trained "
         "from): "
         "give the dataset it was trained on (--dataset)",
         checkpoint_dir);
  }
  f.tokenizer = std::make_shared<const data::Tokenizer>(data::Tokenizer::load(f.tokenizer_path));
  if (dataset_dir.empty() && !files.tokenizer_sha256.empty() &&
      f.tokenizer->sha256() != files.tokenizer_sha256)
    fail(ExitCode::kData, "{}'s tokenizer {} has sha256 {} but {} records {}", checkpoint_dir,
         f.tokenizer_path, f.tokenizer->sha256(), checkpoint_dir, files.tokenizer_sha256);
  try {
    f.chat = data::chat_marker_ids(*f.tokenizer, f.tokenizer_path);
  } catch (const Error&) {
    // No forge markers: chat only through a template.
  }

  const std::string forge_template = data::chat_template_sha256();
  if (!template_path.empty()) {
    f.chat_template = std::make_shared<const data::ChatTemplate>(data::ChatTemplate::load(template_path));
  } else {
    std::shared_ptr<const data::ChatTemplate> own;
    std::string own_error;
    if (!files.tokenizer_config.empty() && has_chat_template(files.tokenizer_config)) {
      try {
        own = std::make_shared<const data::ChatTemplate>(data::ChatTemplate::load(files.tokenizer_config));
      } catch (const Error& e) {
        if (e.code() != ExitCode::kData) throw;
        own_error = e.what();
      }
    }
    // What cannot chat is said when chat is asked for (chat_template_error): text prompts still work.
    if (dataset_template.empty()) {
      // No chat data to agree with: the model's own template, else forge's markers.
      f.chat_template = std::move(own);
      f.chat_template_error = std::move(own_error);
    } else if (own && dataset_template == own->sha256()) {
      f.chat_template = std::move(own);
    } else if (dataset_template != forge_template) {
      f.chat_template_error =
          own ? fmt::format(
                    "dataset {} was prepared with chat template {}, neither the model's own ({}, sha256 "
                    "{}) nor forge's ({}, {}): evaluate on a dataset prepared with the model's template",
                    dataset_dir, dataset_template, files.tokenizer_config, own->sha256(),
                    data::kChatTemplateName, forge_template)
          : !own_error.empty()
              ? own_error
              : fmt::format(
                    "dataset {} was prepared with chat template {} but {} has no template of that "
                    "sha256 and this forge-gate renders {} ({}): give the model's template "
                    "(--template), or prepare the dataset again",
                    dataset_dir, dataset_template, checkpoint_dir, forge_template, data::kChatTemplateName);
    }
    // Else the dataset's chat data are in forge's turns, which the model was trained on: its markers.
  }

  if (!files.generation_config.empty())
    f.eos = eos_token_ids(read_json(files.generation_config), files.generation_config);
  if (f.eos.empty() && f.tokenizer->eos_id() >= 0) f.eos = {int32_t(f.tokenizer->eos_id())};
  return f;
}

}  // namespace forge::gate
