#include "forge/dataio/reader.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/image_text.h"
#include "forge/dataio/verify.h"
#include "sample_order.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

// A read-only mapping of one shard. Token bytes are read straight from it: no HDF5 call (and so no wait
// on HDF5's global lock, which a checkpoint writer may hold) after the reader is constructed.
struct Mapping {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  uint64_t token_offset = 0, tokens = 0;
  uint64_t loss_mask_offset = 0;  // of /loss_mask, when the reader applies it
  uint64_t images_offset = 0;     // of /images, in an image-text shard

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept { *this = std::move(o); }
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(path, o.path);
    std::swap(base, o.base);
    std::swap(size, o.size);
    token_offset = o.token_offset;
    tokens = o.tokens;
    loss_mask_offset = o.loss_mask_offset;
    images_offset = o.images_offset;
    return *this;
  }
  ~Mapping() {
    if (base) ::munmap(const_cast<uint8_t*>(base), size);
  }
};

struct DomainStream {
  std::string name;
  uint16_t index = 0;            // in the manifest's domain list (MicroBatch::domains)
  std::vector<size_t> shards;    // indexes into Impl::maps, in stream order
  std::vector<uint64_t> starts;  // first stream token of each shard
  uint64_t tokens = 0, windows = 0, first_id = 0;
  // With ReaderOptions::document_mask: the stream token where each document starts, ascending, distinct.
  std::vector<uint64_t> doc_starts;
  // With ReaderOptions::loss_mask: the samples are bins of whole conversations, not windows at multiples
  // of seq_len: where each bin starts in the stream and how many of its window's tokens it holds.
  std::vector<uint64_t> bin_starts;
  std::vector<uint32_t> bin_tokens;
  // Image-text: the stream token where each picture's run starts, ascending, and where its pixels are.
  struct Picture {
    size_t map = 0;  // index into Impl::maps
    uint64_t index = 0;
  };
  std::vector<uint64_t> image_starts;
  std::vector<Picture> pictures;
};

// Widens stored tokens to int32 in one pass over the mapped bytes; returns their maximum (for the
// vocabulary check). Written so the compiler vectorizes it; the AVX2 clone is picked at load time where
// the CPU has it.
template <typename T>
__attribute__((target_clones("avx2", "default"))) uint32_t widen(const T* __restrict src,
                                                                 int32_t* __restrict out, size_t n) {
  T max = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<int32_t>(src[i]);
    max = src[i] > max ? src[i] : max;
  }
  return max;
}

// Window tokens [done, done + n) at `src`: token k < seq_len is input k, token seq_len the row's next
// token. Returns the largest token.
template <typename T>
uint32_t widen_row(const T* src, uint32_t done, uint32_t n, uint32_t seq_len, int32_t* inputs,
                   int32_t* next) {
  const uint32_t hi = std::min(done + n, seq_len);
  uint32_t max = hi > done ? widen(src, inputs + done, hi - done) : 0;
  if (done + n == seq_len + 1) {
    *next = static_cast<int32_t>(src[n - 1]);
    max = std::max<uint32_t>(max, src[n - 1]);
  }
  return max;
}

// Where a window starts: its domain stream, the shard (index into the stream's shards) and the token in it.
struct WindowAt {
  const DomainStream* domain = nullptr;
  size_t shard = 0;
  uint64_t local = 0;
  uint32_t bin_tokens = 0;  // a conversation bin's tokens (loss_mask), the rest of the window unscored
};

// Windows are fetched kAhead ahead of the one being copied: enough to cover DRAM latency and the page
// walks of a random 4-8 KB window, few enough that the prefetched lines are still in L1/L2 when used.
constexpr uint32_t kAhead = 4;

// The block order's default block size, in token bytes.
constexpr uint64_t kBlockBytes = 64 << 10;

// Conversations packed whole into windows of seq_len + 1 tokens, in stream order: a bin starts at a
// conversation and takes the ones after it while they fit; one longer than the window fills a bin alone,
// cut at its end (the rest is never scored). The window reads on past the bin's last conversation (the
// first tokens of the next bin, unscored there), and a bin whose window would run past the stream's end is
// left out, as the last partial window of a text stream is.
// A conversation cut at the window's end is cut before a picture's run the end would split (image_tokens:
// the run's length; 0 without pictures).
void pack_conversations(DomainStream& d, uint32_t seq_len, uint32_t image_tokens) {
  const std::vector<uint64_t>& starts = d.doc_starts;
  const auto end_of = [&](size_t i) { return i + 1 < starts.size() ? starts[i + 1] : d.tokens; };
  for (size_t i = 0; i < starts.size();) {
    const uint64_t first = starts[i], limit = first + seq_len + 1;
    if (limit > d.tokens) break;
    size_t j = i + 1;
    while (j < starts.size() && end_of(j) <= limit) ++j;
    uint64_t end = std::min(end_of(j - 1), limit);
    const auto run = std::upper_bound(d.image_starts.begin(), d.image_starts.end(), end);
    if (run != d.image_starts.begin() && run[-1] >= first && run[-1] + image_tokens > end) end = run[-1];
    d.bin_starts.push_back(first);
    d.bin_tokens.push_back(static_cast<uint32_t>(end - first));
    i = j;
  }
}

// Preference pairs, one to a window: documents 2k (chosen) and 2k + 1 (rejected) of the stream, whole. A
// pair longer than the window is left out (never cut: DPO compares whole replies); returns how many.
uint64_t pack_pairs(DomainStream& d, uint32_t seq_len) {
  const std::vector<uint64_t>& starts = d.doc_starts;
  uint64_t left_out = 0;
  for (size_t i = 0; i + 1 < starts.size(); i += 2) {
    const uint64_t first = starts[i], end = i + 2 < starts.size() ? starts[i + 2] : d.tokens;
    if (end - first > seq_len + 1 || first + seq_len + 1 > d.tokens) {
      ++left_out;
      continue;
    }
    d.bin_starts.push_back(first);
    d.bin_tokens.push_back(static_cast<uint32_t>(end - first));
  }
  return left_out;
}

}  // namespace

struct Reader::Impl {
  std::string dir;
  ReaderOptions opt;
  Manifest manifest;
  std::vector<Mapping> maps;
  std::vector<DomainStream> domains;
  std::unique_ptr<SampleOrder> order;
  uint32_t block_windows = 0;         // the block order's W (0 under the global order)
  uint64_t pairs_left_out = 0;        // preference pairs longer than a window
  uint64_t consumed = 0;              // global samples handed out by next()
  uint64_t bytes_read = 0;            // token bytes of the windows handed out by next() (this rank's slice)
  std::unique_ptr<ShardCache> cache;  // holds the cached shards it mapped (ReaderOptions::cache)

  // The first windows of the batch after the last one built, already located and prefetched, so the
  // prefetch pipeline runs across batch boundaries; and the order's memos of the sample stream and of the
  // stream prefetched into cache one group ahead. Touched only by the thread that builds batches (the
  // worker, or the caller of next() without one); a seek stops the worker before it changes anything.
  struct Pipeline {
    uint64_t position = UINT64_MAX;  // global position of the batch they start; UINT64_MAX = none
    uint32_t count = 0;
    WindowAt at[kAhead];
    OrderMemo memo, ahead_memo;
    std::vector<uint64_t> ahead_ids;
    std::vector<int32_t> doc_starts;  // one row's document starts (document_mask)
  } pipe;

  // Prefetch: a thread fills `ready` with the batches that follow `consumed`.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<MicroBatch> ready;
  std::vector<MicroBatch> spare;  // buffers handed back by next(MicroBatch&), reused by the worker
  uint64_t produce_at = 0;        // global position of the next batch the worker builds
  bool stop = false;
  bool consumer_waiting = false, worker_waiting = false;  // who sleeps on `cv` (only they need a notify)
  std::exception_ptr error;

  WindowAt locate(uint64_t sample_id) const;
  template <int kLocality>
  void prefetch(const WindowAt& w) const;
  // The seq_len + 1 tokens of a window, widened to int32 and checked against the vocabulary: its first
  // seq_len to `inputs`, the last to *next (a batch row in next-token form, or read_sample's window).
  void copy_row(const WindowAt& w, uint64_t sample_id, int32_t* inputs, int32_t* next) const;
  // The window offsets in (0, seq_len] where a document starts, for the window at `w`.
  void document_starts(const WindowAt& w, std::vector<int32_t>& out) const;
  // What document_mask and loss_mask add to row `row` of `b` (copied from the window at `w`): segments and
  // positions, and the targets not scored. `starts` is scratch.
  void mark_row(const WindowAt& w, MicroBatch& b, int row, std::vector<int32_t>& starts) const;
  // The pictures whose runs lie whole in the inputs of the window at `w` and inside its bin, into row `row`.
  void add_pictures(const WindowAt& w, MicroBatch& b, int row) const;
  uint32_t image_size = 0, image_tokens = 0;  // image-text datasets
  [[noreturn]] void bad_token(const Mapping& m, uint64_t sample_id, uint32_t token, uint64_t local) const;
  void build(uint64_t position, MicroBatch& b);
  void start_worker();
  void stop_worker();
  void work();
};

WindowAt Reader::Impl::locate(uint64_t sample_id) const {
  const auto d_it = std::upper_bound(domains.begin(), domains.end(), sample_id,
                                     [](uint64_t id, const DomainStream& d) { return id < d.first_id; });
  const DomainStream& d = *(d_it - 1);
  const uint64_t k = sample_id - d.first_id;
  const uint64_t pos = d.bin_starts.empty() ? k * opt.seq_len : d.bin_starts[k];
  const size_t s =
      static_cast<size_t>(std::upper_bound(d.starts.begin(), d.starts.end(), pos) - d.starts.begin() - 1);
  return {&d, s, pos - d.starts[s], d.bin_starts.empty() ? 0 : d.bin_tokens[k]};
}

// noipa: the function has no visible side effect, so GCC's pure/const analysis would otherwise drop the
// calls to it (and with them every prefetch).
template <int kLocality>
__attribute__((noipa)) void Reader::Impl::prefetch(const WindowAt& w) const {
  // Only the first shard's part: a window spanning two shards is rare enough to take the misses.
  const Mapping& m = maps[w.domain->shards[w.shard]];
  const uint64_t take = std::min<uint64_t>(opt.seq_len + 1, m.tokens - w.local);
  const uintptr_t first =
      reinterpret_cast<uintptr_t>(m.base + m.token_offset + w.local * manifest.token_bytes);
  const uintptr_t end = first + take * manifest.token_bytes;
  for (uintptr_t line = first & ~uintptr_t{63}; line < end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, kLocality);
}

void Reader::Impl::bad_token(const Mapping& m, uint64_t sample_id, uint32_t token, uint64_t local) const {
  fail(ExitCode::kData, "shard {}: sample {}: token {} outside the vocabulary ({}) near token {} (corrupted)",
       m.path, sample_id, token, manifest.vocab_size, local);
}

void Reader::Impl::copy_row(const WindowAt& w, uint64_t sample_id, int32_t* inputs, int32_t* next) const {
  const uint32_t len = opt.seq_len + 1;
  uint32_t done = 0;
  uint64_t local = w.local;
  for (size_t s = w.shard; done < len; ++s, local = 0) {
    const Mapping& m = maps[w.domain->shards[s]];
    const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(len - done, m.tokens - local));
    const uint8_t* src = m.base + m.token_offset;
    const uint32_t max_token =
        manifest.token_bytes == 2
            ? widen_row(reinterpret_cast<const uint16_t*>(src) + local, done, take, opt.seq_len, inputs, next)
            : widen_row(reinterpret_cast<const uint32_t*>(src) + local, done, take, opt.seq_len, inputs,
                        next);
    if (max_token >= manifest.vocab_size) bad_token(m, sample_id, max_token, local);
    done += take;
  }
}

void Reader::Impl::document_starts(const WindowAt& w, std::vector<int32_t>& out) const {
  out.clear();
  const std::vector<uint64_t>& starts = w.domain->doc_starts;
  const uint64_t first = w.domain->starts[w.shard] + w.local;  // the window's first stream token
  for (auto it = std::upper_bound(starts.begin(), starts.end(), first);
       it != starts.end() && *it <= first + opt.seq_len; ++it)
    out.push_back(static_cast<int32_t>(*it - first));
}

void Reader::Impl::mark_row(const WindowAt& w, MicroBatch& b, int row, std::vector<int32_t>& starts) const {
  if (!opt.document_mask) return;
  document_starts(w, starts);
  b.set_documents(row, starts);
  if (!opt.loss_mask) return;
  // Target t is window token t + 1: scored only where the shard's mask marks that token.
  const uint32_t T = opt.seq_len;
  int32_t* targets = b.targets.data() + size_t(row) * T;
  uint32_t done = 0;  // window tokens 1..T, read shard by shard like copy_row
  uint64_t local = w.local + 1;
  for (size_t s = w.shard; done < T; ++s, local = 0) {
    const Mapping& m = maps[w.domain->shards[s]];
    if (local == m.tokens) continue;  // the window's first token was this shard's last
    const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(T - done, m.tokens - local));
    const uint8_t* mask = m.base + m.loss_mask_offset + local;
    for (uint32_t k = 0; k < take; ++k)
      if (mask[k] == 0) targets[done + k] = MicroBatch::kIgnore;
    done += take;
  }
  // The window's tokens after its bin belong to the conversation that opens the next bin: unscored here.
  if (w.bin_tokens > 0 && w.bin_tokens <= T)
    std::fill(targets + w.bin_tokens - 1, targets + T, MicroBatch::kIgnore);
}

void Reader::Impl::add_pictures(const WindowAt& w, MicroBatch& b, int row) const {
  if (image_tokens == 0) return;
  const DomainStream& d = *w.domain;
  const uint64_t first = d.starts[w.shard] + w.local;
  const uint64_t end = first + std::min<uint64_t>(w.bin_tokens, opt.seq_len);
  const size_t bytes = size_t(image_size) * image_size * 3;
  for (auto it = std::lower_bound(d.image_starts.begin(), d.image_starts.end(), first);
       it != d.image_starts.end() && *it + image_tokens <= end; ++it) {
    const DomainStream::Picture& p = d.pictures[size_t(it - d.image_starts.begin())];
    const Mapping& m = maps[p.map];
    b.add_image(row, static_cast<int>(*it - first), m.base + m.images_offset + p.index * bytes);
  }
}

void Reader::Impl::build(uint64_t position, MicroBatch& b) {
  const uint32_t rows = opt.global_batch / opt.dp_size;
  // Next-token form unless documents are marked (their boundaries unscore targets).
  b.resize(static_cast<int>(rows), static_cast<int>(opt.seq_len),
           opt.document_mask ? MicroBatch::Targets::kExplicit : MicroBatch::Targets::kNextToken);
  b.domains.resize(rows);
  b.image_size = static_cast<int>(image_size);
  b.image_tokens = static_cast<int>(image_tokens);
  const uint64_t first = position + uint64_t(opt.dp_rank) * rows;
  const uint64_t next_position = position + opt.global_batch;
  const uint64_t next_first = next_position + uint64_t(opt.dp_rank) * rows;
  // Window j of the sequence "this batch's rows, then the next batch's": its id is computed, located and
  // prefetched kAhead windows before it is copied, so the order's arithmetic overlaps the memory reads.
  const uint32_t lookahead = std::min(kAhead, rows);
  uint64_t next_ids[kAhead];
  order->fill(first, rows, b.sample_ids.data(), pipe.memo);
  order->fill(next_first, lookahead, next_ids, pipe.memo);
  // The block order also streams the group after the current one into cache, in memory order, one window
  // per window copied, so the shuffled reads inside a group find their lines there. Only when this reader
  // reads every position (DP size 1): another rank's windows would be fetched for nothing.
  const uint64_t ahead = opt.dp_size == 1 ? order->prefetch_distance() : 0;
  if (ahead) {
    pipe.ahead_ids.resize(rows);
    order->prefetch_fill(first + ahead, rows, pipe.ahead_ids.data(), pipe.ahead_memo);
  }
  WindowAt ring[kAhead];
  const auto id_of = [&](uint32_t j) { return j < rows ? b.sample_ids[j] : next_ids[j - rows]; };
  const auto fetch = [&](uint32_t j) {
    ring[j % kAhead] = locate(id_of(j));
    prefetch<3>(ring[j % kAhead]);
  };
  if (pipe.position == position && pipe.count == lookahead) {
    for (uint32_t j = 0; j < lookahead; ++j) ring[j] = pipe.at[j];
  } else {
    for (uint32_t j = 0; j < lookahead; ++j) fetch(j);
  }
  pipe.position = UINT64_MAX;  // stale if a copy below throws
  const size_t T = opt.seq_len;
  for (uint32_t i = 0; i < rows; ++i) {
    const WindowAt w = ring[i % kAhead];
    fetch(i + lookahead);
    if (ahead) prefetch<2>(locate(pipe.ahead_ids[i]));
    int32_t next = 0;
    copy_row(w, b.sample_ids[i], b.inputs.data() + i * T, &next);
    b.set_next_token(static_cast<int>(i), next);
    mark_row(w, b, static_cast<int>(i), pipe.doc_starts);
    add_pictures(w, b, static_cast<int>(i));
    b.domains[i] = w.domain->index;
  }
  // The pass over the data each row was drawn in: its global position's epoch.
  const uint64_t epoch_length = order->epoch_length();
  for (uint32_t i = 0; i < rows; ++i) b.epochs[i] = static_cast<uint32_t>((first + i) / epoch_length);
  // The ring now holds the next batch's first `lookahead` windows.
  for (uint32_t j = 0; j < lookahead; ++j) pipe.at[j] = ring[(rows + j) % kAhead];
  pipe.count = lookahead;
  pipe.position = next_position;
}

void Reader::Impl::work() {
  std::unique_lock lock(mu);
  while (!stop) {
    if (ready.size() >= static_cast<size_t>(opt.prefetch) || error) {
      worker_waiting = true;
      cv.wait(lock);
      worker_waiting = false;
      continue;
    }
    const uint64_t at = produce_at;
    MicroBatch b;
    if (!spare.empty()) {
      b = std::move(spare.back());
      spare.pop_back();
    }
    lock.unlock();
    std::exception_ptr e;
    try {
      build(at, b);
    } catch (...) {
      e = std::current_exception();
    }
    lock.lock();
    if (stop || at != produce_at) continue;  // a seek happened meanwhile
    if (e) {
      error = e;
    } else {
      ready.push_back(std::move(b));
      produce_at += opt.global_batch;
    }
    if (consumer_waiting) cv.notify_all();
  }
}

void Reader::Impl::start_worker() {
  if (opt.prefetch <= 0) return;
  stop = false;
  produce_at = consumed;
  worker = std::thread([this] { work(); });
}

void Reader::Impl::stop_worker() {
  if (!worker.joinable()) return;
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_all();
  worker.join();
  ready.clear();
  error = nullptr;
}

Reader::Reader(const std::string& dataset_dir, const ReaderOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.dir = dataset_dir;
  s.opt = options;
  if (options.seq_len == 0) fail(ExitCode::kUsage, "reader: seq_len must be positive");
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size)
    fail(ExitCode::kUsage, "reader: dp_rank {} is not in [0, dp_size {})", options.dp_rank, options.dp_size);
  if (options.global_batch == 0 || options.global_batch % options.dp_size != 0)
    fail(ExitCode::kUsage, "reader: global batch {} must be a positive multiple of the DP size {}",
         options.global_batch, options.dp_size);
  if (options.order == Order::kBlock && options.group_blocks == 0)
    fail(ExitCode::kUsage, "reader: group_blocks must be at least 1 for the block order");
  if (options.split != "train" && options.split != "valid")
    fail(ExitCode::kUsage, "reader: split '{}' must be train or valid", options.split);
  if (options.loss_mask && !options.document_mask)
    fail(ExitCode::kUsage, "reader: loss_mask needs document_mask (the mask follows the conversations)");
  s.manifest = load_manifest(dataset_dir);
  if (options.loss_mask && s.manifest.format == "text")
    fail(ExitCode::kUsage,
         "dataset {} is format text, without loss masks: prepare the data with `forge-data prepare --format "
         "chat` (or preference), or train every token (run.objective = lm)",
         dataset_dir);
  const bool pairs = options.loss_mask && s.manifest.format == "preference";
  // A picture's run must not straddle two samples: image-text data is read in conversation bins.
  if (s.manifest.format == kImageTextFormat) {
    if (!options.loss_mask)
      fail(ExitCode::kUsage,
           "dataset {} is format image-text: its samples are whole conversations with their pictures, read "
           "with loss_mask (a picture's run must not straddle two samples)",
           dataset_dir);
    s.image_size = s.manifest.settings.at("image").at("size").get<uint32_t>();
    s.image_tokens = s.manifest.settings.at("image").at("tokens").get<uint32_t>();
  }
  if (!options.expected_tokenizer_sha256.empty() &&
      options.expected_tokenizer_sha256 != s.manifest.tokenizer_sha256)
    fail(ExitCode::kData, "{}: dataset {} was tokenized with tokenizer {}, the job expects {}", dataset_dir,
         s.manifest.version, s.manifest.tokenizer_sha256, options.expected_tokenizer_sha256);
  if (!options.domain.empty() && std::find(s.manifest.domains.begin(), s.manifest.domains.end(),
                                           options.domain) == s.manifest.domains.end())
    fail(ExitCode::kUsage, "reader: domain '{}' is not in dataset {} (domains: {})", options.domain,
         dataset_dir, fmt::join(s.manifest.domains, ", "));
  for (const auto& [name, w] : options.domain_weights) {
    if (std::find(s.manifest.domains.begin(), s.manifest.domains.end(), name) == s.manifest.domains.end())
      fail(ExitCode::kUsage, "reader: domain weight for '{}', which is not in the dataset (domains: {})",
           name, fmt::join(s.manifest.domains, ", "));
    if (!(w >= 0)) fail(ExitCode::kUsage, "reader: domain weight for '{}' must be >= 0, got {}", name, w);
  }

  // Map every shard of the selection, grouped into one stream per domain (manifest order). When the
  // selection fits in half the RAM its page tables are filled at open (MAP_POPULATE): the first epoch then
  // takes no page fault per 64 KB of random windows (each one a hypervisor exit on this VM). A larger
  // selection is left to fault in: populating it would read it all from disk before the first batch.
  uint64_t selection_bytes = 0;
  for (const auto& domain : s.manifest.domains)
    if (options.domain.empty() || domain == options.domain)
      for (const ShardEntry* e : s.manifest.shards_of(options.split, domain)) selection_bytes += e->bytes;
  const uint64_t ram = uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGE_SIZE));
  const int map_flags = MAP_SHARED | (selection_bytes <= ram / 2 ? MAP_POPULATE : 0);
  // The node-local cache stages the shards this reader will read (a domain weighted 0 is never read) and
  // says, per shard, which directory to read it from.
  std::map<const ShardEntry*, std::string> shard_dirs;
  if (!options.cache.dir.empty()) {
    std::vector<const ShardEntry*> wanted;
    for (const auto& domain : s.manifest.domains) {
      if (!options.domain.empty() && domain != options.domain) continue;
      const auto w = options.domain_weights.find(domain);
      if (!options.domain_weights.empty() && (w == options.domain_weights.end() || !(w->second > 0)))
        continue;
      for (const ShardEntry* e : s.manifest.shards_of(options.split, domain)) wanted.push_back(e);
    }
    s.cache = std::make_unique<ShardCache>(options.cache, s.manifest, dataset_dir);
    const std::vector<std::string> dirs = s.cache->open(wanted);
    for (size_t i = 0; i < wanted.size(); ++i) shard_dirs[wanted[i]] = dirs[i];
  }
  std::vector<uint64_t> window_counts;
  std::vector<double> weights;
  for (const auto& domain : s.manifest.domains) {
    if (!options.domain.empty() && domain != options.domain) continue;
    DomainStream d;
    d.name = domain;
    d.index = static_cast<uint16_t>(std::find(s.manifest.domains.begin(), s.manifest.domains.end(), domain) -
                                    s.manifest.domains.begin());
    for (const ShardEntry* e : s.manifest.shards_of(options.split, domain)) {
      const auto cached = shard_dirs.find(e);
      std::string dir = cached == shard_dirs.end() ? dataset_dir : cached->second;
      ShardLayout layout;
      try {
        layout = check_shard(dir, s.manifest, *e, options.verify_checksums);
      } catch (const Error& bad) {
        // A damaged cached copy is the cache's problem, not the job's: read the shared one (whose own
        // damage, if any, is the error to report).
        if (dir == dataset_dir) throw;
        dir = s.cache->reject(*e, bad.what());
        layout = check_shard(dir, s.manifest, *e, options.verify_checksums);
      }
      Mapping m;
      m.path = (fs::path(dir) / e->file).string();
      const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail(ExitCode::kData, "shard {}: cannot open: {}", m.path, std::strerror(errno));
      m.size = layout.file_bytes;
      void* p = ::mmap(nullptr, m.size, PROT_READ, map_flags, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) fail(ExitCode::kIo, "shard {}: mmap failed: {}", m.path, std::strerror(errno));
      m.base = static_cast<const uint8_t*>(p);
      m.token_offset = layout.token_offset;
      m.tokens = layout.tokens;
      if (options.loss_mask) {
        if (!layout.has_loss_mask)
          fail(ExitCode::kData, "shard {}: a {} dataset's shard without /loss_mask (corrupted?)", m.path,
               s.manifest.format);
        m.loss_mask_offset = layout.loss_mask_offset;
      }
      if (s.image_tokens > 0 && layout.has_images) {
        if (layout.attrs.image_size != s.image_size || layout.attrs.image_tokens != s.image_tokens)
          fail(ExitCode::kData,
               "shard {}: pictures of {}x{} in runs of {}, the manifest says {}x{} in runs of {}", m.path,
               layout.attrs.image_size, layout.attrs.image_size, layout.attrs.image_tokens, s.image_size,
               s.image_size, s.image_tokens);
        m.images_offset = layout.images_offset;
        const std::vector<uint64_t> positions = read_image_positions(m.path, layout);
        for (size_t k = 0; k < positions.size(); ++k) {
          d.image_starts.push_back(d.tokens + positions[k]);
          d.pictures.push_back({s.maps.size(), k});
        }
      }
      if (options.document_mask) {
        // Shards are cut at document boundaries, so a shard's first document starts where it does.
        const std::vector<uint64_t> offsets = read_doc_offsets(m.path, layout);
        if (pairs &&
            (offsets.size() % 2 == 0 || std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end()))
          fail(ExitCode::kData,
               "shard {}: a preference shard must hold whole pairs of non-empty documents "
               "(corrupted? forge-data verify names the problem)",
               m.path);
        for (size_t k = 0; k + 1 < offsets.size(); ++k)
          if (d.doc_starts.empty() || d.doc_starts.back() != d.tokens + offsets[k])
            d.doc_starts.push_back(d.tokens + offsets[k]);  // an empty document adds no boundary
      }
      d.starts.push_back(d.tokens);
      d.tokens += layout.tokens;
      d.shards.push_back(s.maps.size());
      s.maps.push_back(std::move(m));
    }
    if (pairs) {
      s.pairs_left_out += pack_pairs(d, options.seq_len);
      d.windows = d.bin_starts.size();
    } else if (options.loss_mask) {
      pack_conversations(d, options.seq_len, s.image_tokens);
      d.windows = d.bin_starts.size();
    } else {
      d.windows = d.tokens > options.seq_len ? (d.tokens - 1) / options.seq_len : 0;
    }
    double w = static_cast<double>(d.windows);
    if (!options.domain_weights.empty()) {
      const auto it = options.domain_weights.find(domain);
      w = it == options.domain_weights.end() ? 0.0 : it->second;
      if (w > 0 && d.windows == 0)
        fail(ExitCode::kData, "{}: domain '{}' has weight {} but no window of {} tokens in split {}",
             dataset_dir, domain, w, options.seq_len + 1, options.split);
    }
    d.first_id = s.domains.empty() ? 0 : s.domains.back().first_id + s.domains.back().windows;
    window_counts.push_back(d.windows);
    weights.push_back(w);
    s.domains.push_back(std::move(d));
  }
  uint64_t total = 0;
  for (uint64_t n : window_counts) total += n;
  if (total == 0)
    fail(ExitCode::kData, "{}: split '{}'{} has no window of {} tokens", dataset_dir, options.split,
         options.domain.empty() ? "" : " domain " + options.domain, options.seq_len + 1);
  if (options.order == Order::kGlobal) {
    s.order = std::make_unique<GlobalOrder>(window_counts, weights, options.seed);
  } else {
    // Blocks of about 64 KiB of token bytes in groups of 16: a group (about 1 MiB) and the next one, which
    // is streamed into cache while the group is read, fit in this VM's caches; a smaller block puts fewer
    // windows of one place in a batch (docs/DATA.md compares the sizes).
    const uint64_t window_bytes = uint64_t(options.seq_len) * s.manifest.token_bytes;
    s.block_windows = options.block_windows
                          ? options.block_windows
                          : static_cast<uint32_t>(std::max<uint64_t>(1, kBlockBytes / window_bytes));
    s.order = std::make_unique<BlockOrder>(window_counts, weights, options.seed, s.block_windows,
                                           options.group_blocks);
  }
  s.start_worker();
}

Reader::~Reader() {
  impl_->stop_worker();
}

MicroBatch Reader::next() {
  MicroBatch b;
  next(b);
  return b;
}

void Reader::next(MicroBatch& out) {
  Impl& s = *impl_;
  if (s.opt.prefetch <= 0) {
    s.build(s.consumed, out);
    s.consumed += s.opt.global_batch;
    s.bytes_read += uint64_t(out.rows) * (s.opt.seq_len + 1) * s.manifest.token_bytes;
    return;
  }
  std::unique_lock lock(s.mu);
  if (s.ready.empty() && !s.error) {
    s.consumer_waiting = true;
    s.cv.wait(lock, [&] { return !s.ready.empty() || s.error; });
    s.consumer_waiting = false;
  }
  if (s.ready.empty() && s.error) {
    const auto e = s.error;
    s.error = nullptr;
    s.produce_at = s.consumed;  // a retry rebuilds the failed batch
    s.cv.notify_all();
    std::rethrow_exception(e);
  }
  std::swap(out, s.ready.front());
  if (s.spare.size() < static_cast<size_t>(s.opt.prefetch)) s.spare.push_back(std::move(s.ready.front()));
  s.ready.pop_front();
  s.consumed += s.opt.global_batch;
  s.bytes_read += uint64_t(out.rows) * (s.opt.seq_len + 1) * s.manifest.token_bytes;
  if (s.worker_waiting) s.cv.notify_all();
}

Cursor Reader::cursor() const {
  const Impl& s = *impl_;
  Cursor c;
  c.samples = s.consumed;
  c.dataset_version = s.manifest.version;
  c.split = s.opt.split;
  c.domain = s.opt.domain;
  c.seq_len = s.opt.seq_len;
  c.seed = s.opt.seed;
  c.domain_weights = s.opt.domain_weights;
  c.order = s.opt.order;
  c.conversations = s.opt.loss_mask;
  if (c.order == Order::kBlock) {
    c.block_windows = s.block_windows;
    c.group_blocks = s.opt.group_blocks;
  }
  return c;
}

void Reader::seek(const Cursor& c) {
  Impl& s = *impl_;
  if (c.dataset_version != s.manifest.version)
    fail(ExitCode::kData, "data cursor is for dataset version {}, but {} has version {}", c.dataset_version,
         s.dir, s.manifest.version);
  const auto mismatch = [](const char* what, const std::string& cur, const std::string& mine) {
    fail(ExitCode::kUsage,
         "data cursor was taken with {0} = {1}, the reader has {2}: the sample order would differ (resume "
         "with {0} = {1}, or start the data stream afresh)",
         what, cur, mine);
  };
  if (c.order != s.opt.order) mismatch("order", order_name(c.order), order_name(s.opt.order));
  if (c.order == Order::kBlock && c.block_windows != s.block_windows)
    mismatch("block_windows", std::to_string(c.block_windows), std::to_string(s.block_windows));
  if (c.order == Order::kBlock && c.group_blocks != s.opt.group_blocks)
    mismatch("group_blocks", std::to_string(c.group_blocks), std::to_string(s.opt.group_blocks));
  if (c.split != s.opt.split) mismatch("split", c.split, s.opt.split);
  if (c.domain != s.opt.domain) mismatch("domain", c.domain, s.opt.domain);
  if (c.seq_len != s.opt.seq_len)
    mismatch("seq_len", std::to_string(c.seq_len), std::to_string(s.opt.seq_len));
  if (c.conversations != s.opt.loss_mask)
    mismatch("loss_mask (samples are conversation bins)", c.conversations ? "true" : "false",
             s.opt.loss_mask ? "true" : "false");
  if (c.seed != s.opt.seed) mismatch("seed", std::to_string(c.seed), std::to_string(s.opt.seed));
  if (c.domain_weights != s.opt.domain_weights)
    mismatch("domain weights", Json(c.domain_weights).dump(), Json(s.opt.domain_weights).dump());
  s.stop_worker();
  s.consumed = c.samples;
  s.start_worker();
}

const Manifest& Reader::manifest() const {
  return impl_->manifest;
}
const std::string& Reader::dataset_dir() const {
  return impl_->dir;
}
std::string Reader::tokenizer_path() const {
  return (fs::path(impl_->dir) / impl_->manifest.tokenizer_file).string();
}
uint64_t Reader::samples_per_epoch() const {
  return impl_->order->epoch_length();
}
uint64_t Reader::bytes_read() const {
  return impl_->bytes_read;
}
uint64_t Reader::pairs_left_out() const {
  return impl_->pairs_left_out;
}

uint64_t Reader::num_samples() const {
  return impl_->order->windows();
}
uint64_t Reader::sample_at(uint64_t position) const {
  return impl_->order->sample_at(position);
}

void Reader::read_sample(uint64_t sample_id, std::span<int32_t> out) const {
  if (sample_id >= num_samples())
    fail(ExitCode::kUsage, "reader: sample {} out of range (the selection has {})", sample_id, num_samples());
  if (out.size() != impl_->opt.seq_len + 1)
    fail(ExitCode::kUsage, "reader: read_sample needs a buffer of seq_len+1 = {} tokens",
         impl_->opt.seq_len + 1);
  impl_->copy_row(impl_->locate(sample_id), sample_id, out.data(), &out[impl_->opt.seq_len]);
}

void Reader::read_sample(uint64_t sample_id, MicroBatch& batch, int row) const {
  const Impl& s = *impl_;
  if (sample_id >= num_samples())
    fail(ExitCode::kUsage, "reader: sample {} out of range (the selection has {})", sample_id, num_samples());
  if (batch.seq_len != int(s.opt.seq_len) || row < 0 || row >= batch.rows)
    fail(ExitCode::kUsage, "reader: read_sample needs row {} of a micro-batch of seq_len {}", row,
         s.opt.seq_len);
  const WindowAt w = s.locate(sample_id);
  const size_t at = size_t(row) * s.opt.seq_len;
  int32_t next = 0;
  s.copy_row(w, sample_id, batch.inputs.data() + at, &next);
  batch.set_next_token(row, next);
  batch.sample_ids[size_t(row)] = sample_id;
  batch.epochs[size_t(row)] = 0;
  if (batch.domains.size() == size_t(batch.rows)) batch.domains[size_t(row)] = w.domain->index;
  // A row read before may have left unscored positions behind: this sample's weights start at 1.
  if (!batch.weights.empty()) std::fill_n(batch.weights.begin() + int64_t(at), s.opt.seq_len, 1.0f);
  std::vector<int32_t> starts;
  s.mark_row(w, batch, row, starts);
  // The row's pictures replace any it held, in their place among the other rows'.
  if (s.image_tokens > 0) {
    batch.image_size = int(s.image_size);
    batch.image_tokens = int(s.image_tokens);
    MicroBatch mine;
    mine.seq_len = batch.seq_len;
    mine.image_size = batch.image_size;
    s.add_pictures(w, mine, row);
    auto& starts_of = batch.image_starts;
    const int64_t lo = int64_t(at), hi = lo + batch.seq_len;
    const auto from = std::lower_bound(starts_of.begin(), starts_of.end(), lo) - starts_of.begin();
    const auto to = std::lower_bound(starts_of.begin(), starts_of.end(), hi) - starts_of.begin();
    const auto bytes = int64_t(batch.image_bytes());
    starts_of.erase(starts_of.begin() + from, starts_of.begin() + to);
    starts_of.insert(starts_of.begin() + from, mine.image_starts.begin(), mine.image_starts.end());
    auto& pixels = batch.image_pixels;
    pixels.erase(pixels.begin() + from * bytes, pixels.begin() + to * bytes);
    pixels.insert(pixels.begin() + from * bytes, mine.image_pixels.begin(), mine.image_pixels.end());
  }
}

const std::string& Reader::sample_domain(uint64_t sample_id) const {
  const auto& d = impl_->domains;
  const auto it = std::upper_bound(d.begin(), d.end(), sample_id,
                                   [](uint64_t id, const DomainStream& x) { return id < x.first_id; });
  return (it - 1)->name;
}

CacheStats Reader::cache_stats() const {
  return impl_->cache ? impl_->cache->stats() : CacheStats{};
}

const char* order_name(Order order) {
  return order == Order::kBlock ? "block" : "global";
}

Order parse_order(std::string_view name) {
  if (name == "block") return Order::kBlock;
  if (name == "global") return Order::kGlobal;
  fail(ExitCode::kUsage, "reader: order '{}' must be block or global", name);
}

Json Cursor::to_json() const {
  Json j = {{"samples", samples},
            {"dataset_version", dataset_version},
            {"split", split},
            {"domain", domain},
            {"seq_len", seq_len},
            {"seed", seed},
            {"domain_weights", domain_weights},
            {"order", order_name(order)}};
  if (conversations) j["conversations"] = true;
  if (order == Order::kBlock) {
    j["block_windows"] = block_windows;
    j["group_blocks"] = group_blocks;
  }
  return j;
}

Cursor Cursor::from_json(const Json& j) {
  Cursor c;
  try {
    c.samples = j.at("samples").get<uint64_t>();
    c.dataset_version = j.at("dataset_version").get<std::string>();
    c.split = j.at("split").get<std::string>();
    c.domain = j.at("domain").get<std::string>();
    c.seq_len = j.at("seq_len").get<uint32_t>();
    c.seed = j.at("seed").get<uint64_t>();
    c.domain_weights = j.at("domain_weights").get<std::map<std::string, double>>();
    c.conversations = j.value("conversations", false);
    c.order = Order::kGlobal;
    c.block_windows = c.group_blocks = 0;
    if (j.contains("order")) {
      const auto name = j.at("order").get<std::string>();
      if (name != "block" && name != "global")
        fail(ExitCode::kData, "malformed data cursor: order '{}' is neither block nor global", name);
      c.order = parse_order(name);
    }
    if (c.order == Order::kBlock) {
      c.block_windows = j.at("block_windows").get<uint32_t>();
      c.group_blocks = j.at("group_blocks").get<uint32_t>();
    }
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "malformed data cursor: {}", e.what());
  }
  return c;
}

}  // namespace forge::data
