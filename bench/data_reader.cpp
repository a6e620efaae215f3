// Reader throughput on one core against a raw sequential read() of the same shard bytes, both from the
// page cache, in the same run, for both sample orders (block, the default, and global).
// Usage: bench_data_reader [DIR] [MTOKENS] [SEQ_LEN] [ROUNDS] [BLOCK_WINDOWS GROUP_BLOCKS]
// DIR is scratch space (default /tmp/forge-bench-reader); the dataset is MTOKENS million uint16 tokens.
// The raw read and the readers' epochs are interleaved for ROUNDS rounds (default 5) and each keeps its
// best, so load from other processes skews neither side; both also report CPU time per token (which
// preemption does not inflate) and minor page faults per pass.
#include "forge/common/hash.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/synthetic.h"
#include "synthetic_dataset.h"
#include "timing.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <vector>

namespace fs = std::filesystem;
using namespace forge::data;

namespace {

long minor_faults() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// One measured pass: tokens delivered, wall and CPU seconds, minor faults; `best` keeps the fastest pass.
struct Pass {
  double tokens = 0, wall = 0, cpu = 0;
  long faults = 0;
};

struct Best {
  Pass wall, cpu;  // the pass with the least wall time, and the one with the least CPU time
  void add(const Pass& p) {
    if (wall.tokens == 0 || p.tokens / p.wall > wall.tokens / wall.wall) wall = p;
    if (cpu.tokens == 0 || p.tokens / p.cpu > cpu.tokens / cpu.cpu) cpu = p;
  }
  double tps() const { return wall.tokens / wall.wall; }
  double cpu_tps() const { return cpu.tokens / cpu.cpu; }
};

template <typename F>
Pass measure(double tokens, F&& body) {
  const long f0 = minor_faults();
  const double c0 = forge::bench::process_cpu_now(), t0 = forge::bench::wall_now();
  body();
  Pass p;
  p.wall = forge::bench::wall_now() - t0;
  p.cpu = forge::bench::process_cpu_now() - c0;
  p.faults = minor_faults() - f0;
  p.tokens = tokens;
  return p;
}

// A raw read() of every shard file in 1 MiB blocks; returns the bytes read.
uint64_t raw_read(const Manifest& m, const std::string& dir, std::vector<char>& buf) {
  uint64_t bytes = 0;
  for (const auto& s : m.shards) {
    const int fd = ::open((dir + "/" + s.file).c_str(), O_RDONLY);
    for (ssize_t got; (got = ::read(fd, buf.data(), buf.size())) > 0;) bytes += static_cast<uint64_t>(got);
    ::close(fd);
  }
  return bytes;
}

struct ReaderRun {
  std::string name;
  std::unique_ptr<Reader> reader;
  uint64_t steps = 0;
  uint32_t seq_len = 0;
  forge::MicroBatch batch;
  Pass open, first;  // construction (mapping) and the first epoch (cold page tables)
  Best best;         // later epochs
};

// One epoch of next(): tokens delivered are rows x seq_len per batch (inputs; the targets are the same
// tokens shifted by one).
Pass epoch(ReaderRun& r, uint64_t* checksum) {
  return measure(double(r.steps) * 16 * r.seq_len, [&] {
    for (uint64_t s = 0; s < r.steps; ++s) {
      r.reader->next(r.batch);
      *checksum += static_cast<uint64_t>(r.batch.inputs[s % r.batch.inputs.size()]) +
                   static_cast<uint64_t>(r.batch.target((s * 7) % r.batch.size()));
    }
  });
}

void start(ReaderRun& r, const std::string& dir, uint32_t seq_len, Order order, int prefetch,
           const ReaderOptions& block, uint64_t* checksum) {
  r.name = fmt::format("{} order, {}", order_name(order), prefetch ? "prefetch thread" : "one core");
  ReaderOptions o;
  o.order = order;
  o.block_windows = block.block_windows;
  o.group_blocks = block.group_blocks;
  o.seq_len = seq_len;
  o.global_batch = 16;
  o.prefetch = prefetch;
  o.verify_checksums = false;
  r.seq_len = seq_len;
  r.open = measure(0, [&] { r.reader = std::make_unique<Reader>(dir, o); });
  r.steps = r.reader->samples_per_epoch() / o.global_batch;
  r.first = epoch(r, checksum);
}

void print_row(const char* name, const Best& b, double raw_tps, double raw_cpu_tps) {
  fmt::print("{:<34} {:8.1f} Mtok/s  ratio {:.2f} | {:8.1f} Mtok/CPU-s  ratio {:.2f} | {:6} faults\n", name,
             b.tps() / 1e6, b.tps() / raw_tps, b.cpu_tps() / 1e6, b.cpu_tps() / raw_cpu_tps, b.wall.faults);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/forge-bench-reader";
  const uint64_t tokens = (argc > 2 ? std::stoull(argv[2]) : 128) * 1000000ull;
  const uint32_t seq_len = argc > 3 ? static_cast<uint32_t>(std::stoul(argv[3])) : 2048;
  const int rounds = argc > 4 ? std::stoi(argv[4]) : 5;
  ReaderOptions block;  // the block order's sizes: the reader's defaults unless given
  if (argc > 6) {
    block.block_windows = static_cast<uint32_t>(std::stoul(argv[5]));
    block.group_blocks = static_cast<uint32_t>(std::stoul(argv[6]));
  }
  if (!fs::exists(dir + "/manifest.json") || load_manifest(dir).tokens("train") != tokens) {
    fs::remove_all(dir);
    forge::bench::write_synthetic_dataset(dir, tokens, 32000, 32ull << 20);
  }
  const Manifest m = load_manifest(dir);
  std::vector<char> buf(1 << 20);
  uint64_t file_bytes = raw_read(m, dir, buf), sink = 0;  // warms the page cache
  // One core (no prefetch thread) for each order, then the prefetch thread's consumer side.
  ReaderRun runs[4];
  start(runs[0], dir, seq_len, Order::kBlock, 0, block, &sink);
  start(runs[1], dir, seq_len, Order::kGlobal, 0, block, &sink);
  start(runs[2], dir, seq_len, Order::kBlock, 2, block, &sink);
  start(runs[3], dir, seq_len, Order::kGlobal, 2, block, &sink);
  Best raw;
  for (int round = 0; round < rounds; ++round) {
    raw.add(measure(double(file_bytes) / m.token_bytes, [&] { file_bytes = raw_read(m, dir, buf); }));
    for (ReaderRun& r : runs) r.best.add(epoch(r, &sink));
  }
  const double raw_tps = raw.tps(), raw_cpu_tps = raw.cpu_tps();
  fmt::print("dataset: {} tokens (uint16) in {} shards, {:.0f} MB; seq_len {}, global batch 16; best of {}\n",
             m.tokens("train"), m.shards.size(), file_bytes / 1e6, seq_len, rounds);
  fmt::print("{:<34} {:8.1f} Mtok/s  ({:.2f} GB/s)  | {:8.1f} Mtok/CPU-s             | {:6} faults\n",
             "raw sequential read() (page cache)", raw_tps / 1e6, raw_tps * m.token_bytes / 1e9,
             raw_cpu_tps / 1e6, raw.wall.faults);
  for (const ReaderRun& r : runs) print_row(r.name.c_str(), r.best, raw_tps, raw_cpu_tps);
  const Cursor c = runs[0].reader->cursor();
  fmt::print("block order: {} windows per block, {} blocks per group\n", c.block_windows, c.group_blocks);
  for (const ReaderRun& r : runs)
    fmt::print("{}: open {:.3f} s ({} faults); first epoch {:.1f} Mtok/s ({} faults)\n", r.name, r.open.wall,
               r.open.faults, r.first.tokens / r.first.wall / 1e6, r.first.faults);
  fmt::print("(checksum {})\n", sink);
  return 0;
}
