// How prompts become a model's tokens and where its replies end (docs/ARCHITECTURE.md, "Evaluation"): the
// tokenizer (a dataset's, or the one an imported checkpoint keeps), the chat format (the model's own chat
// template, or forge's chat markers) and the stops (generation_config.json's end-of-sequence ids, the end of
// a turn: a stop token where it is one token, else a stop string matched on the decoded text).
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/chat_template.h"
#include "forge/dataio/tokenizer.h"
#include "forge/eval_gate/generate.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::ckpt {
struct Manifest;
}

namespace forge::gate {

// The tokenizer a checkpoint's weights speak, as its manifest records it (extra.tokenizer_sha256: the
// training dataset's, or the file an import kept); "" when it records none (a synthetic stream, an import
// without tokenizer files, checkpoints from before the record).
std::string recorded_tokenizer(const ckpt::Manifest& manifest);

// The files a model speaks through, which forge-ckpt import keeps beside the weights: its tokenizer, its
// chat template and special tokens (tokenizer_config.json) and generation_config.json. Each path is ""
// when absent.
struct ModelFiles {
  std::string checkpoint;  // the checkpoint holding them; "" when none does
  std::string tokenizer;   // tokenizer.json, else tokenizer.model
  std::string tokenizer_config, generation_config;
  std::string tokenizer_sha256;  // what the checkpoint asked about records (recorded_tokenizer)

  // The files of `checkpoint_dir`, else those of the nearest checkpoint up its lineage (ckpt.init_from,
  // the parent's parent, ...) that records the same tokenizer and holds one: a model fine-tuned from an
  // imported checkpoint speaks through the imported model's files. Each file used is checked against its
  // checkpoint's manifest (forge::Error(kData) naming it when damaged).
  static ModelFiles of_checkpoint(const std::string& checkpoint_dir);
};

// forge::Error(kUsage) naming both hashes when the checkpoint records another tokenizer than the one the
// dataset is tokenized with (`role`: "the candidate", "the baseline", ...). Nothing to check when the
// checkpoint records none.
void check_tokenizer(const std::string& checkpoint_dir, const std::string& dataset_dir, const char* role);

// generation_config.json's eos_token_id: an int or a list of ints; none when absent or null.
// forge::Error(kData) naming `where` for anything else.
std::vector<int32_t> eos_token_ids(const Json& generation_config, const std::string& where);

// What ends a sample: stop tokens (not part of it), and stop strings of several tokens, matched on the
// decoded text (the text is cut before the first).
struct Stops {
  std::vector<int32_t> tokens;
  std::vector<std::string> strings;
};

// Stop strings as stops: each that `tokenizer` encodes as one token is a stop token, the others strings.
Stops split_stops(const data::Tokenizer& tokenizer, std::span<const std::string> stop_strings);

struct PromptFormat {
  std::shared_ptr<const data::Tokenizer> tokenizer;
  std::string tokenizer_path;
  std::optional<data::ChatMarkerIds> chat;  // forge's chat markers, when the tokenizer holds them
  // The model's own chat template: chat prompts are rendered with it, and replies end at its stop strings,
  // instead of forge's markers.
  std::shared_ptr<const data::ChatTemplate> chat_template;
  // Why chat cannot be rendered as the model was trained (its own template outside the Jinja subset, a
  // dataset rendered with a template it does not hold): forge::Error(kData) from chat_prompt and stops(true)
  // only, so that text prompts still work.
  std::string chat_template_error;
  // End every sample: generation_config.json's eos_token_id, else the tokenizer's end-of-sequence.
  std::vector<int32_t> eos;

  bool can_chat() const {
    return chat_template != nullptr || !chat_template_error.empty() || chat.has_value();
  }
  // The chat format's name: the template's model directory and SHA-256, forge's template's name, or "none".
  std::string chat_name() const;

  // A text's ids (no BOS or EOS added).
  std::vector<int32_t> encode(std::string_view text) const;
  // A text prompt's ids: encode's, and for a prompt of no tokens the end-of-sequence token (the
  // tokenizer's, else eos's first), which starts a document. forge::Error(kUsage) when there is none.
  std::vector<int32_t> text_prompt(std::string_view text) const;
  // The ids of a conversation with the assistant's turn opened: the model's template rendered with
  // add_generation_prompt (apply_chat_template's text, encoded as it is: a template that wants BOS writes
  // it), else forge's turns (contents' markers neutralized) and the assistant marker. forge::Error(kUsage)
  // when the format cannot chat.
  std::vector<int32_t> chat_prompt(std::span<const data::ChatMessage> messages) const;
  // What ends a chat reply (`chat`) or a text continuation: `eos`, and for a chat reply the end-of-turn
  // marker, or the template's stop strings (its eos token and end-of-turn text) split by split_stops.
  Stops stops(bool chat) const;
  // Sets s.stop_tokens, and s.stop_after for the stop strings (the sample decoded after each token).
  void set_stops(const Stops& stops, Sampling& s) const;
  // A sample's text: its tokens decoded, cut before the first stop string in it.
  std::string completion(std::span<const int32_t> tokens, const Stops& stops) const;
  // What ended a sample: its stop token's text, else the stop string in its text, else "".
  std::string stop_text(const Generation& g, const Stops& stops) const;

  // The format of the model at `checkpoint_dir` (ModelFiles::of_checkpoint):
  //  - the tokenizer: the dataset's when `dataset_dir` is given (the checkpoint must record the same:
  //    check_tokenizer), else the model's own file (forge::Error(kUsage) when it has none);
  //  - the chat format: the template at `template_path` (a tokenizer_config.json or a directory holding
  //    one) when given; else, when the dataset holds no chat data, the model's own template
  //    (tokenizer_config.json's chat_template, or a chat_template.jinja beside it), and forge's markers
  //    for a model without one; when it does, the template its chat data were rendered with (its manifest's
  //    template_sha256): the model's own, or forge's markers. A template that is neither, or a model's own
  //    that cannot be rendered, is chat_template_error (forge::Error(kData) when chat is asked for);
  //  - eos: the model's generation_config.json's eos_token_id, else the tokenizer's end-of-sequence.
  static PromptFormat of_model(const std::string& checkpoint_dir, const std::string& dataset_dir = "",
                               const std::string& template_path = "");
};

}  // namespace forge::gate
