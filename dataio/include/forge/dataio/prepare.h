// `forge-data prepare`: raw text -> a versioned dataset directory (docs/DATA.md). The dataset appears at
// --out only when complete: it is built in a sibling temporary directory and renamed into place.
#pragma once

#include "forge/common/config.h"
#include "forge/common/json.h"
#include "forge/dataio/dedup.h"
#include "forge/dataio/filters.h"
#include "forge/dataio/ingest.h"
#include "forge/dataio/language.h"
#include "forge/dataio/pii.h"
#include "forge/dataio/ranks.h"
#include "forge/dataio/repository.h"
#include "forge/dataio/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

// Chat datasets (IngestOptions::format "chat"): a conversation longer than `max_tokens` tokens (its
// end-of-sequence id included; 0 = no limit) is dropped, or cut to its first max_tokens - 1 tokens plus the
// end-of-sequence id, keeping their mask; a cut conversation that keeps no scored token is dropped.
struct ChatPrepareOptions {
  uint64_t max_tokens = 0;
  bool drop_long = false;  // "drop" policy; false = "truncate"
};

struct PrepareOptions {
  std::vector<InputSpec> inputs;
  std::string out;
  // An existing tokenizer: a SentencePiece model or a Hugging Face tokenizer.json (Tokenizer::load); "" =
  // train one.
  std::string tokenizer_model;
  // Chat and preference: render with a model's own chat template (ChatTemplate::load: a
  // tokenizer_config.json or the model directory holding one) instead of forge's; needs tokenizer_model
  // (the model's tokenizer), whose ids then need no forge markers. Each conversation is cut into the
  // template's segments (ChatTemplate::segments: every reply scored for chat, the final one for each half
  // of a pair), each segment encoded on its own (no BOS added: templates print bos_token themselves), the
  // mask 1 on the tokens of scored segments. "" = forge's template (chat.h).
  std::string chat_template;
  std::vector<std::string> eval_sets;
  double valid_fraction = 0.01;
  uint64_t shard_tokens = 64ull << 20;
  uint64_t split_seed = 0;
  int decontam_ngram = 13;
  bool near_dedup = true;
  int threads = 0;  // tokenizer encoding threads (0 = all cores)
  IngestOptions ingest;
  MinHashOptions minhash;
  FilterOptions filters;
  PiiOptions pii;
  SafetyOptions safety;
  LanguageOptions language;
  RepositoryOptions repository;
  LicenseOptions license;
  TokenizerTrainOptions tokenizer;
  ChatPrepareOptions chat;
};

// The INI keys of prepare.ini (and --section.key overrides), with their defaults.
ConfigSchema prepare_schema();
// Fills the stage settings of `options` from a loaded config; bad values are rejected naming the key.
void apply_config(const Config& config, PrepareOptions& options);

struct PrepareResult {
  std::string dataset_dir, version, summary;
  Json quality;
};

// On every rank of a distributed prepare (forge/dataio/ranks.h), with the same options: the dataset is the
// one a single process makes of the same input and settings, byte for byte; rank 0 publishes it.
PrepareResult prepare_dataset(const PrepareOptions& options, Ranks& ranks = single_rank());

}  // namespace forge::data
