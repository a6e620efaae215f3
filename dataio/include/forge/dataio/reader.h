// The dataset reader used by the trainer and the eval gate.
//
// Samples are windows of seq_len+1 tokens (inputs and shifted targets) cut from each domain's token
// stream (its shards of the split, concatenated) at multiples of seq_len (chat data under loss_mask: at
// the starts of bins of whole conversations). The global order of samples is a
// pure function of (dataset, split, domain selection, seq_len, seed, domain weights, order): position p of
// the stream lies in epoch p / E (E = samples per epoch) and maps to a sample through seeded permutations,
// so it needs no table and no state beyond p. The block order (default) shuffles windows within groups of
// G blocks of W consecutive windows, so that reads stay in about 1 MiB at a time; the global order
// shuffles the whole epoch at once. Step s of the run reads positions [s*B, (s+1)*B) for a global
// batch B; DP rank r gets the r-th of the dp_size equal slices, as a forge::MicroBatch (inputs, targets
// in next-token form unless documents are masked, and per row the sample id and epoch). The cursor is
// the number of global samples consumed, so a run resumed from it reads exactly what an uninterrupted run
// would have read, with any DP size (and any global batch) — see docs/DATA.md.
#pragma once

#include "forge/common/batch.h"
#include "forge/common/json.h"
#include "forge/dataio/cache.h"
#include "forge/dataio/manifest.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

enum class Order { kBlock, kGlobal };
const char* order_name(Order order);  // "block", "global"
// "block" or "global"; anything else: forge::Error(kUsage) naming the value.
Order parse_order(std::string_view name);

struct ReaderOptions {
  uint32_t seq_len = 0;
  uint32_t global_batch = 0;  // samples per step over all DP ranks; a multiple of dp_size
  int dp_rank = 0;
  int dp_size = 1;
  uint64_t seed = 0;
  std::string split = "train";                   // "train" or "valid"
  std::string domain;                            // only this domain ("" = all)
  std::map<std::string, double> domain_weights;  // blending; empty = natural token proportions
  int prefetch = 2;                              // batches read ahead in a background thread (0 = none)
  bool verify_checksums = true;                  // xxh3 of every shard at open
  std::string expected_tokenizer_sha256;         // "" = accept any
  Order order = Order::kBlock;
  uint32_t block_windows = 0;  // block order: W, windows per block (0 = about 64 KiB of tokens)
  uint32_t group_blocks = 16;  // block order: G, blocks shuffled together
  // Packed documents with explicit boundaries: from each shard's /doc_offsets, positions restart and
  // segments count at every document start inside a row, and the target that opens the next document is
  // not scored (MicroBatch::set_documents). Off: a row is one document (the pretraining default).
  bool document_mask = false;
  // Chat datasets (manifest format "chat", shards with /loss_mask): a sample is a bin of whole
  // conversations packed in stream order (one longer than the window is cut at its end), so every reply is
  // trained once per epoch with its prompt; a target is scored only where the mask marks its token (an
  // assistant's reply and its end of turn). Preference datasets: a sample is one pair, its chosen
  // conversation as document 0 and its rejected one as document 1 (a pair longer than the window is left
  // out, pairs_left_out()). Image-text datasets: as chat, a conversation cut at the window's end is cut
  // before a picture's run it would split, and each row carries the pictures whose runs lie whole in its
  // bin (MicroBatch::image_starts, image_pixels); they need loss_mask. Needs document_mask. Off: windows at
  // multiples of seq_len, every target scored (pretraining on the same data).
  bool loss_mask = false;
  // Node-local copies of the shards read (cache.h; docs/DATA.md, "Node-local cache"): staged at open,
  // read from there; the dataset directory on a miss the cache cannot serve. Empty dir: off.
  CacheOptions cache;
};

struct Cursor {
  uint64_t samples = 0;  // global samples consumed
  // What the order depends on; seek() refuses a cursor taken under different values.
  std::string dataset_version, split, domain;
  uint32_t seq_len = 0;
  uint64_t seed = 0;
  std::map<std::string, double> domain_weights;
  Order order = Order::kBlock;
  uint32_t block_windows = 0, group_blocks = 0;  // the block order's resolved W and G (0 for global)
  bool conversations = false;                    // samples are conversation bins (ReaderOptions::loss_mask)

  Json to_json() const;
  // forge::Error(kData) on a malformed cursor. A cursor without "order" was written before the block
  // order existed: it is a global-order cursor.
  static Cursor from_json(const Json& j);
};

class Reader {
 public:
  // Opens and checks the dataset (manifest version, shard structure and checksums, tokenizer). Bad data:
  // forge::Error(kData) naming the shard; bad options: forge::Error(kUsage).
  Reader(const std::string& dataset_dir, const ReaderOptions& options);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The next global batch's slice of this DP rank: global_batch / dp_size rows of seq_len positions, row
  // i from the window at stream position (consumed + dp_rank * rows + i), with its sample id, epoch and
  // domain (index into manifest().domains).
  // Bad data (a token outside the vocabulary): forge::Error(kData) naming the shard and the sample.
  MicroBatch next();
  // The same, refilling `batch` in place: its buffers are recycled, so a steady loop allocates nothing.
  void next(MicroBatch& batch);
  Cursor cursor() const;
  void seek(const Cursor& cursor);

  const Manifest& manifest() const;
  const std::string& dataset_dir() const;
  std::string tokenizer_path() const;
  uint64_t samples_per_epoch() const;
  // Token bytes of the windows next() has delivered: this rank's slice only, the I/O a DP rank does.
  uint64_t bytes_read() const;
  // Distinct windows in the selection; sample ids are [0, num_samples()).
  uint64_t num_samples() const;
  // Preference pairs (loss_mask) left out of the selection because they do not fit seq_len + 1 tokens.
  uint64_t pairs_left_out() const;
  // The sample id at a global stream position.
  uint64_t sample_at(uint64_t position) const;
  // The seq_len+1 tokens of one sample (random access, e.g. the gate's full pass over a split).
  void read_sample(uint64_t sample_id, std::span<int32_t> out) const;
  // The same sample as row `row` of `batch` (seq_len positions), as next() would deliver it (documents
  // marked when document_mask is on); its epoch is 0, its domain set when batch.domains has a row each.
  void read_sample(uint64_t sample_id, MicroBatch& batch, int row) const;
  // Domain name of a sample.
  const std::string& sample_domain(uint64_t sample_id) const;
  // What the node-local cache did at open (all zero without one).
  CacheStats cache_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge::data
