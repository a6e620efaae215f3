// Generation with the key/value cache (GPT::decode): batched, with greedy, temperature, top-k and top-p
// sampling, stop tokens and a token limit. A sample is a pure function of the model, its prompt, the
// settings, the seed and its key: the same whatever is generated beside it, in whichever batch, on
// however many ranks (docs/ARCHITECTURE.md, "Evaluation").
#pragma once

#include "forge/trainer/model.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace forge::gate {

struct Sampling {
  float temperature = 0;  // 0: greedy (the most likely token; the lowest id among equals)
  int top_k = 0;          // keep the k most likely tokens (0: all)
  float top_p = 1;        // then the fewest, most likely, whose probability reaches p (1: all)
  int max_new_tokens = 64;
  std::vector<int32_t> stop_tokens;  // ends a sample; not part of it
  uint64_t seed = 1;
  // Called with a sample's tokens after each one it gains (not a stop token); true ends the sample there,
  // the token kept (stop strings matched on the decoded text: StopStrings, prompt_format.h).
  std::function<bool(std::span<const int32_t> tokens)> stop_after;
};

// The token `logits` give under `s`, for a uniform draw `u` in [0, 1) (unused when greedy). Candidates
// are ordered by probability, then id, so a draw picks the same token on every machine.
int32_t pick_token(std::span<const float> logits, const Sampling& s, double u);

// The draw of step `step` of the sample keyed `key`: xxh3 of (seed, key, step) as a double in [0, 1).
double sample_draw(uint64_t seed, uint64_t key, int step);

// A picture of a vision-language model's prompt: its features fill the prompt's positions from `at` on
// (its placeholder run); `rgb` holds the tower's image_size^2 RGB bytes and outlives the run.
struct PromptPicture {
  size_t at = 0;
  const uint8_t* rgb = nullptr;
};

struct Request {
  std::vector<int32_t> prompt;  // at least one token
  uint64_t key = 0;             // what keys its draws (e.g. the hash of a task id and sample index)
  std::vector<PromptPicture> pictures = {};
};

struct Generation {
  std::vector<int32_t> tokens;
  // Each sampled token's log-probability under the model (its softmax at temperature 1, whatever the
  // sampling settings), the stop token's last when it ended the sample: what a rollout's trainer compares
  // its own recomputation with.
  std::vector<float> logps;
  bool stopped = false;           // ended at a stop token, or where stop_after said
  int32_t stop_token = -1;        // the stop token that ended it (not in `tokens`); -1 otherwise
  bool prompt_truncated = false;  // the prompt was cut from the left to leave room for one token
};

struct GenerationStats {
  int64_t sequences = 0, prompt_tokens = 0, new_tokens = 0;
  double seconds = 0;
  double tokens_per_second() const { return seconds > 0 ? double(new_tokens) / seconds : 0; }
};

// Generates on `model` (whole, on one rank; its rows() bounds one call: build it with batch = the
// sequences in flight and seq_len = max_positions), `batch` sequences at a time, each at most `max_len`
// positions long (0: the model's max_positions; the prompt and the sample are max_len + 1 tokens at most). A
// finished sequence's slot takes the next request at once: its prompt is prefilled in the same call as the
// others' next tokens. A sample ends at a stop token, where Sampling::stop_after says, after max_new_tokens,
// or at the model's last position. A prompt with pictures too long for max_len is refused
// (std::invalid_argument): cutting it from the left would cut a picture's run or drop it unseen. On the
// ranks of an expert-parallel group, each with its own requests, run() is collective: a rank that has
// finished decodes nothing until all have (GPT::decoding).
class Generator {
 public:
  Generator(trainer::GPT& model, int batch, int max_len = 0);
  // `on_done` (when given) is called with each request's index and its generation as soon as its sampling
  // ends, before the rest finish (a reward scorer works meanwhile: RewardStream).
  std::vector<Generation> run(std::span<const Request> requests, const Sampling& s,
                              const std::function<void(size_t, const Generation&)>& on_done = nullptr);
  // Everything run() generated so far.
  const GenerationStats& stats() const { return stats_; }

 private:
  trainer::GPT& model_;
  int batch_;
  trainer::KvCache cache_;
  GenerationStats stats_;
};

// Where `text` first holds one of `stop_strings` (the earliest start; the longest of those starting there),
// as {position, index of the string}; {npos, npos} when it holds none. Empty strings are never found.
std::pair<size_t, size_t> find_stop_string(std::string_view text, std::span<const std::string> stop_strings);

}  // namespace forge::gate
