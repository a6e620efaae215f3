// The batch contract between the data layer and the trainer (docs/ARCHITECTURE.md, "The batch"): what one
// data-parallel rank trains on in one micro-batch. `rows` sequences of `seq_len` positions, row-major.
//
// Pretraining is the special case: targets are the next tokens, every one scored with weight 1, positions
// count from 0 and each row is one document. The optional fields are then left empty, and every consumer
// reads an empty field as that default, so the common case costs nothing to build or to ship. That holds
// for the targets too: a batch in next-token form stores each row as the window of seq_len + 1 tokens it
// came from (the inputs and one next token), half the bytes of inputs and targets.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge {

struct MicroBatch {
  static constexpr int32_t kIgnore = -1;  // the target of a position that is not scored

  // How a batch holds its targets: explicitly (`targets`), or in next-token form (`next_tokens`).
  enum class Targets { kExplicit, kNextToken };

  int rows = 0, seq_len = 0;
  std::vector<int32_t> inputs;  // token ids the model reads
  // The token each position must predict, or kIgnore. Empty in next-token form: position t's target is
  // the row's input t + 1, the last position's is next_tokens[row] (one per row). A batch is in one form
  // at a time; target(i) reads either, materialize_targets() turns the second into the first.
  std::vector<int32_t> targets;
  std::vector<int32_t> next_tokens;
  // Optional, one value per position; empty = the default.
  std::vector<float> weights;      // loss weight (default 1; a kIgnore target always weighs 0)
  std::vector<int32_t> positions;  // position-embedding row (default: the index in the row)
  // The document each position belongs to, numbered from 0 in each row and never decreasing; attention
  // never crosses a change (default: the row is one document).
  std::vector<int32_t> segments;
  // One per row: the dataset-global sample the row came from, and the pass over the data it was drawn in
  // (a sample recurs once per epoch; the duplicate-sample guard compares (sample, epoch)).
  std::vector<uint64_t> sample_ids;
  std::vector<uint32_t> epochs;
  // Optional, one per row: the row's domain, as an index into the dataset manifest's domain list (what a
  // run reports as the realised domain mix). Empty: not known (the synthetic stream).
  std::vector<uint16_t> domains;
  // Preference pairs (DPO): row r holds pair r, its chosen conversation as document 0 and its rejected
  // one as document 1; reference_logps[2r] and [2r + 1] are the reference model's summed log-probabilities
  // of their scored tokens. Empty: not a batch of pairs.
  std::vector<double> reference_logps;
  // Sampled replies (reinforcement learning: GrpoLoss): `advantages`, one per row, the reply's advantage
  // from its group's rewards; `old_logps`, one per position, the log-probability of the target under the
  // policy that sampled it (0 where not scored); `ref_logps`, the same under the frozen reference (empty:
  // no KL term). Empty advantages: not a batch of rollouts. PPO (PpoLoss) instead: `rewards`, one per row,
  // the reply's reward; `old_values`, one per position, the value head's estimates under the policy that
  // sampled it (empty at one update per rollout: the training forward's own).
  std::vector<float> advantages, old_logps, ref_logps, rewards, old_values;

  // Pictures (image-text data, docs/DATA.md "Image-text data"): picture k is image_size x image_size RGB
  // bytes at image_pixels[k * image_bytes()], and fills the image_tokens positions of one row from flat
  // position image_starts[k] (row * seq_len + t); starts increase and runs do not overlap. Empty: none.
  int image_size = 0, image_tokens = 0;
  std::vector<uint8_t> image_pixels;
  std::vector<int64_t> image_starts;
  size_t image_bytes() const { return size_t(image_size) * size_t(image_size) * 3; }
  size_t images() const { return image_starts.size(); }
  // Appends a picture whose run starts at position t of row r (after every picture added before it).
  void add_image(int r, int t, const uint8_t* rgb);

  size_t size() const { return size_t(rows) * size_t(seq_len); }
  // Sizes inputs, the targets of the given form, sample_ids and epochs for `rows` x `seq_len`; clears the
  // optional fields (domains, reference_logps, the rollout fields and the pictures included).
  void resize(int rows, int seq_len, Targets form = Targets::kExplicit);
  Targets form() const {
    return targets.empty() && !next_tokens.empty() ? Targets::kNextToken : Targets::kExplicit;
  }
  int32_t target(size_t i) const {
    if (!targets.empty()) return targets[i];
    const size_t t = i % size_t(seq_len);
    return t + 1 < size_t(seq_len) ? inputs[i + 1] : next_tokens[i / size_t(seq_len)];
  }
  // Every position's target, in either form, to out[0, size()).
  void copy_targets(int32_t* out) const;
  // Next-token form to explicit targets (for a consumer that edits them); a no-op on an explicit batch.
  void materialize_targets();
  // Row r predicts its next tokens: its inputs shifted by one, then `next` (in either form).
  void set_next_token(int r, int32_t next);
  float weight(size_t i) const {
    return !targets.empty() && targets[i] == kIgnore ? 0.0f : weights.empty() ? 1.0f : weights[i];
  }
  // The sum of the weights: how many scored tokens this batch adds to the loss's normaliser.
  double weight_sum() const;

  // Row r from a window of seq_len + 1 tokens: its first seq_len are the inputs, the last seq_len the
  // targets (the pretraining sample).
  void set_window(int r, const int32_t* window, uint64_t sample_id, uint32_t epoch);
  // Packed documents in row r: `starts` are the window offsets in (0, seq_len] where a new document
  // begins, ascending. Positions restart at each document and segments count them; a target that is the
  // first token of the next document is not scored (its context is another document). Materializes the
  // optional fields and the targets for the whole batch.
  void set_documents(int r, std::span<const int32_t> starts);

  // The first thing wrong with the batch for a model of `vocab` tokens and `max_positions` positions, as
  // "sample S (row R, position P): ..."; nullopt when it can be trained on.
  std::optional<std::string> problem(int vocab, int max_positions) const;

  // Rows [first, first + count) as a batch of their own; and batches of one seq_len stacked.
  MicroBatch slice_rows(int first, int count) const;
  static MicroBatch concat(std::span<const MicroBatch> parts);

  // Self-describing bytes (the verification batch a checkpoint keeps; targets always explicit, so the
  // format is the same in both forms), and back: forge::Error(kData) on bytes that are not a serialized
  // batch.
  std::string serialize() const;
  static MicroBatch deserialize(std::string_view bytes);
};

}  // namespace forge
