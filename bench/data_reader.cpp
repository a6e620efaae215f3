// Reader throughput on one core against a raw sequential read() of the same shard bytes, both from the
// page cache, in the same run. Usage: bench_data_reader [DIR] [MTOKENS] [SEQ_LEN]
// DIR is scratch space (default /tmp/forge-bench-reader); the dataset is MTOKENS million uint16 tokens.
#include "forge/common/hash.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/synthetic.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <vector>

namespace fs = std::filesystem;
using namespace forge::data;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void build(const std::string& dir, uint64_t tokens, uint32_t vocab) {
  fs::create_directories(fs::path(dir) / "shards");
  forge::write_file_atomic(dir + "/tokenizer.model", "bench");
  Manifest m;
  m.tokenizer_file = "tokenizer.model";
  m.tokenizer_sha256 = forge::sha256_hex("bench");
  m.vocab_size = vocab;
  m.eos_id = 2;
  m.token_bytes = 2;
  m.domains = {"bench"};
  m.licenses = {"unknown"};
  const SyntheticStream stream(vocab, 1);
  const uint64_t per_shard = 32ull << 20, doc = 4096;
  std::vector<int32_t> buf(doc);
  for (uint64_t first = 0, seq = 0; first < tokens; first += per_shard, ++seq) {
    ShardData d;
    const uint64_t n = std::min(per_shard, tokens - first);
    for (uint64_t t = 0; t < n; t += doc) {
      stream.sample(first + t, buf);
      d.tokens.insert(d.tokens.end(), buf.begin(), buf.begin() + std::min<uint64_t>(doc, n - t));
      d.doc_offsets.push_back(d.tokens.size());
      d.doc_domains.push_back(0);
      d.doc_licenses.push_back(0);
    }
    const std::string rel = fmt::format("shards/train-bench-{:05d}.h5", seq);
    write_shard(dir + "/" + rel, d, {kShardSchemaVersion, "train", "bench", m.tokenizer_sha256, vocab}, 2);
    m.shards.push_back({rel, "train", "bench", forge::xxh3_file_hex(dir + "/" + rel),
                        fs::file_size(dir + "/" + rel), d.tokens.size(), d.documents()});
  }
  write_manifest(dir, m);
}

// Best of three: raw read() of every shard in 1 MiB blocks; returns token bytes per second.
double raw_read_bytes_per_s(const Manifest& m, const std::string& dir, uint64_t* bytes_out) {
  std::vector<char> buf(1 << 20);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    uint64_t bytes = 0;
    const double t0 = now();
    for (const auto& s : m.shards) {
      const int fd = ::open((dir + "/" + s.file).c_str(), O_RDONLY);
      for (ssize_t got; (got = ::read(fd, buf.data(), buf.size())) > 0;) bytes += static_cast<uint64_t>(got);
      ::close(fd);
    }
    best = std::max(best, bytes / (now() - t0));
    *bytes_out = bytes;
  }
  return best;
}

// Tokens per second delivered by next() over one epoch (seq_len new tokens per sample).
double reader_tokens_per_s(const std::string& dir, uint32_t seq_len, int prefetch, uint64_t* checksum) {
  ReaderOptions o;
  o.seq_len = seq_len;
  o.global_batch = 16;
  o.prefetch = prefetch;
  o.verify_checksums = false;
  Reader r(dir, o);
  const uint64_t steps = r.samples_per_epoch() / o.global_batch;
  // One pass to map the pages (first touch of an mmap page costs a minor fault), then the measured pass.
  Batch b;
  for (int pass = 0; pass < 2; ++pass) {
    const double t0 = now();
    for (uint64_t s = 0; s < steps; ++s) {
      r.next(b);
      *checksum += static_cast<uint64_t>(b.tokens[s % b.tokens.size()]);
    }
    const double dt = now() - t0;
    if (pass == 1) return double(steps) * o.global_batch * seq_len / dt;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/forge-bench-reader";
  const uint64_t tokens = (argc > 2 ? std::stoull(argv[2]) : 128) * 1000000ull;
  const uint32_t seq_len = argc > 3 ? static_cast<uint32_t>(std::stoul(argv[3])) : 2048;
  if (!fs::exists(dir + "/manifest.json") || load_manifest(dir).tokens("train") != tokens) {
    fs::remove_all(dir);
    build(dir, tokens, 32000);
  }
  const Manifest m = load_manifest(dir);
  uint64_t file_bytes = 0, sink = 0;
  const double raw_bps = raw_read_bytes_per_s(m, dir, &file_bytes);
  const double raw_tps = raw_bps / m.token_bytes;
  const double sync_tps = reader_tokens_per_s(dir, seq_len, 0, &sink);
  const double pre_tps = reader_tokens_per_s(dir, seq_len, 2, &sink);
  fmt::print("dataset: {} tokens (uint16) in {} shards, {:.0f} MB; seq_len {}, global batch 16\n",
             m.tokens("train"), m.shards.size(), file_bytes / 1e6, seq_len);
  fmt::print("raw sequential read() (page cache):  {:8.1f} Mtokens/s ({:.2f} GB/s)\n", raw_tps / 1e6,
             raw_bps / 1e9);
  fmt::print("reader, one core (no prefetch):      {:8.1f} Mtokens/s  ratio {:.2f}\n", sync_tps / 1e6,
             sync_tps / raw_tps);
  fmt::print("reader, prefetch thread (consumer):  {:8.1f} Mtokens/s  ratio {:.2f}\n", pre_tps / 1e6,
             pre_tps / raw_tps);
  fmt::print("(checksum {})\n", sink);
  return 0;
}
