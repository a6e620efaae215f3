#include "forge/dataio/reader.h"
#include "dataset_fixture.h"
#include "forge/common/error.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <set>

using forge::Error;
using forge::ExitCode;
using forge::data::Batch;
using forge::data::Cursor;
using forge::data::Order;
using forge::data::Reader;
using forge::data::ReaderOptions;

namespace {

std::vector<forge::test::FixtureDomain> two_domains() {
  // Shard boundaries fall inside windows: documents of odd lengths, two per shard.
  return {{"prose", {301, 157, 999, 64, 513, 250, 77}, 2}, {"code", {120, 333, 210}, 1}};
}

// Blocks of 5 windows in groups of 3 (a default block, 64 KiB, would hold this whole fixture): the
// fixture's domains then have full and short blocks, tails, and several groups.
ReaderOptions options(uint32_t batch, int rank, int size, int prefetch = 2, Order order = Order::kBlock) {
  ReaderOptions o;
  o.order = order;
  o.block_windows = 5;
  o.group_blocks = 3;
  o.seq_len = 16;
  o.global_batch = batch;
  o.dp_rank = rank;
  o.dp_size = size;
  o.seed = 1234;
  o.prefetch = prefetch;
  return o;
}

// The global batches of `steps` steps, rank slices concatenated in rank order.
std::vector<Batch> read_global(const std::string& dir, uint32_t batch, int dp, int steps,
                               const Cursor* from = nullptr, Order order = Order::kBlock) {
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < dp; ++r) {
    readers.push_back(std::make_unique<Reader>(dir, options(batch, r, dp, 2, order)));
    if (from) readers.back()->seek(*from);
  }
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    Batch global;
    for (auto& reader : readers) {
      Batch b = reader->next();
      global.step = b.step;
      global.cols = b.cols;
      global.rows += b.rows;
      global.tokens.insert(global.tokens.end(), b.tokens.begin(), b.tokens.end());
      global.sample_ids.insert(global.sample_ids.end(), b.sample_ids.begin(), b.sample_ids.end());
    }
    out.push_back(std::move(global));
  }
  return out;
}

}  // namespace

TEST_CASE("reader windows match the token streams across shard boundaries") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  const auto domains = two_domains();
  forge::test::make_fixture_dataset(dir, domains);
  Reader reader(dir, options(4, 0, 1));
  // prose: 2361 tokens -> (2361-1)/16 = 147 windows; code: 663 -> 41.
  REQUIRE(reader.num_samples() == 147 + 41);
  REQUIRE(reader.samples_per_epoch() == 188);
  std::vector<int32_t> window(17);
  for (uint64_t id : {0ull, 1ull, 60ull, 146ull, 147ull, 187ull}) {
    reader.read_sample(id, window);
    const size_t d = id < 147 ? 0 : 1;
    const uint64_t start = (id < 147 ? id : id - 147) * 16;
    CHECK(reader.sample_domain(id) == domains[d].name);
    for (uint64_t k = 0; k < 17; ++k)
      REQUIRE(window[k] == int32_t(forge::test::fixture_token(d, start + k, 1000)));
  }
  const Batch b = reader.next();
  REQUIRE(b.rows == 4);
  REQUIRE(b.cols == 17);
  for (uint32_t i = 0; i < b.rows; ++i) {
    reader.read_sample(b.sample_ids[i], window);
    CHECK(std::equal(window.begin(), window.end(), b.row(i).begin()));
  }
}

TEST_CASE(
    "reader order is deterministic, covers each sample once per epoch, and changes with seed and epoch") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  Reader a(dir, options(4, 0, 1)), b(dir, options(4, 0, 1, 0));
  const uint64_t e = a.samples_per_epoch();
  std::set<uint64_t> epoch0, epoch1;
  std::vector<uint64_t> order0, order1;
  for (uint64_t p = 0; p < e; ++p) {
    epoch0.insert(a.sample_at(p));
    epoch1.insert(a.sample_at(e + p));
    order0.push_back(a.sample_at(p));
    order1.push_back(a.sample_at(e + p));
    REQUIRE(a.sample_at(p) == b.sample_at(p));
  }
  CHECK(epoch0.size() == e);
  CHECK(epoch1.size() == e);
  CHECK(*epoch0.rbegin() == e - 1);
  CHECK(order0 != order1);
  ReaderOptions other = options(4, 0, 1);
  other.seed = 99;
  Reader c(dir, other);
  std::vector<uint64_t> order_c;
  for (uint64_t p = 0; p < e; ++p) order_c.push_back(c.sample_at(p));
  CHECK(order_c != order0);
  // Prefetching and synchronous readers deliver the same batches.
  for (int s = 0; s < 60; ++s) {  // crosses an epoch boundary (188 samples / 4)
    const Batch x = a.next(), y = b.next();
    REQUIRE(x.sample_ids == y.sample_ids);
    REQUIRE(x.tokens == y.tokens);
    for (uint32_t i = 0; i < x.rows; ++i) REQUIRE(x.sample_ids[i] == a.sample_at(uint64_t(s) * 4 + i));
  }
}

TEST_CASE("reader DP ranks are disjoint and together read the global batch") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    const auto one = read_global(dir, 8, 1, 20, nullptr, order);
    for (int dp : {2, 4, 8}) {
      const auto many = read_global(dir, 8, dp, 20, nullptr, order);
      std::set<uint64_t> seen;
      for (int s = 0; s < 20; ++s) {
        REQUIRE(many[s].sample_ids == one[s].sample_ids);
        REQUIRE(many[s].tokens == one[s].tokens);
        // within one epoch (20 * 8 = 160 < 188) no sample repeats across ranks or steps
        for (uint64_t id : many[s].sample_ids) REQUIRE(seen.insert(id).second);
      }
    }
  }
}

TEST_CASE("reader resumes from a cursor exactly, also with another DP size") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    const auto uninterrupted = read_global(dir, 8, 2, 40, nullptr, order);
    for (int first_dp : {1, 2, 4}) {
      for (int second_dp : {1, 2, 4, 8}) {
        Reader r(dir, options(8, 0, first_dp, 2, order));
        for (int s = 0; s < 13; ++s) r.next();
        // The cursor travels through JSON, as it does in a checkpoint manifest.
        const Cursor cursor = Cursor::from_json(forge::Json::parse(r.cursor().to_json().dump()));
        CHECK(cursor.samples == 13 * 8);
        CHECK(cursor.order == order);
        const auto resumed = read_global(dir, 8, second_dp, 27, &cursor, order);
        for (int s = 0; s < 27; ++s) {
          REQUIRE(resumed[s].step == uninterrupted[13 + s].step);
          REQUIRE(resumed[s].sample_ids == uninterrupted[13 + s].sample_ids);
          REQUIRE(resumed[s].tokens == uninterrupted[13 + s].tokens);
        }
      }
    }
  }
}

TEST_CASE("reader refuses a cursor taken under another order") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  Reader r(dir, options(8, 0, 1));
  const auto refusal = [&](const Cursor& c) -> std::string {
    try {
      r.seek(c);
    } catch (const Error& e) {
      CHECK(e.code() == ExitCode::kUsage);
      return e.what();
    }
    FAIL("seek accepted a cursor of another order");
    return "";
  };
  Cursor c = r.cursor();
  c.seed = 7;
  CHECK(refusal(c).find("seed = 7") != std::string::npos);
  c = r.cursor();
  c.order = Order::kGlobal;
  CHECK(refusal(c).find("order = global, the reader has block") != std::string::npos);
  c = r.cursor();
  c.block_windows = 6;
  CHECK(refusal(c).find("block_windows = 6") != std::string::npos);
  c = r.cursor();
  c.group_blocks = 16;
  CHECK(refusal(c).find("group_blocks = 16") != std::string::npos);
  Reader global(dir, options(8, 0, 1, 2, Order::kGlobal));
  try {
    global.seek(r.cursor());
    FAIL("a global-order reader accepted a block-order cursor");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("order = block, the reader has global") != std::string::npos);
  }
  c = r.cursor();
  c.dataset_version = "0000";
  try {
    r.seek(c);
    FAIL("seek accepted a cursor of another dataset version");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kData);
  }
  const auto malformed = [](forge::Json j) {
    try {
      Cursor::from_json(j);
    } catch (const Error& e) {
      return e.code() == ExitCode::kData;
    }
    return false;
  };
  CHECK(malformed(forge::Json{{"samples", 3}}));
  forge::Json j = r.cursor().to_json();
  j["order"] = "shuffled";
  CHECK(malformed(j));
  j = r.cursor().to_json();
  j.erase("group_blocks");
  CHECK(malformed(j));
  CHECK(forge::data::parse_order("global") == Order::kGlobal);
  CHECK_THROWS_AS(forge::data::parse_order("shuffled"), Error);
}

TEST_CASE("reader cursor records the block order; a cursor from before it resumes the global order") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  ReaderOptions defaults = options(4, 0, 1);
  defaults.block_windows = 0;
  defaults.group_blocks = 16;
  defaults.order = ReaderOptions{}.order;
  Reader block(dir, defaults);
  const forge::Json j = block.cursor().to_json();
  CHECK(j.at("order") == "block");
  CHECK(j.at("block_windows") == (64u << 10) / (16 * 2));  // about 64 KiB of uint16 windows of 16 tokens
  CHECK(j.at("group_blocks") == 16);
  CHECK(Cursor::from_json(j).order == Order::kBlock);

  // A cursor as the reader wrote it before the block order existed.
  const forge::Json old = {{"samples", 40},
                           {"dataset_version", block.manifest().version},
                           {"split", "train"},
                           {"domain", ""},
                           {"seq_len", 16},
                           {"seed", 1234},
                           {"domain_weights", forge::Json::object()}};
  const Cursor c = Cursor::from_json(old);
  CHECK(c.order == Order::kGlobal);
  CHECK_THROWS_AS(block.seek(c), Error);
  Reader global(dir, options(4, 0, 1, 2, Order::kGlobal));
  global.seek(c);
  const Batch b = global.next();
  for (uint32_t i = 0; i < b.rows; ++i) CHECK(b.sample_ids[i] == global.sample_at(40 + i));
  CHECK(global.cursor().to_json().at("order") == "global");
  // The global order is the one of the release before the block order (values recorded from it), so
  // such a cursor resumes into exactly the samples the interrupted run would have read.
  const std::vector<uint64_t> positions = {0, 1, 2, 3, 50, 187, 188, 189, 400, 1000};
  const std::vector<uint64_t> natural = {66, 8, 154, 140, 150, 185, 4, 183, 72, 124};
  const std::vector<uint64_t> blended = {66, 8, 153, 157, 153, 166, 149, 173, 72, 124};
  ReaderOptions weighted = options(4, 0, 1, 2, Order::kGlobal);
  weighted.domain_weights = {{"prose", 1.0}, {"code", 1.0}};
  Reader global_weighted(dir, weighted);
  for (size_t i = 0; i < positions.size(); ++i) {
    CHECK(global.sample_at(positions[i]) == natural[i]);
    CHECK(global_weighted.sample_at(positions[i]) == blended[i]);
  }
}

TEST_CASE("reader blends domains by weight") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  ReaderOptions o = options(10, 0, 1);
  o.domain_weights = {{"prose", 1.0}, {"code", 1.0}};
  Reader r(dir, o);
  const uint64_t e = r.samples_per_epoch();
  uint64_t code = 0;
  std::map<uint64_t, int> code_counts;
  for (uint64_t p = 0; p < e; ++p) {
    const uint64_t id = r.sample_at(p);
    if (r.sample_domain(id) == "code") ++code, ++code_counts[id];
  }
  CHECK(code == e / 2);  // 94 of 188 positions, while code has only 41 windows: upsampled
  for (const auto& [id, n] : code_counts) CHECK(n >= 2);
  CHECK(code_counts.size() == 41);
  // Weight zero removes a domain.
  o.domain_weights = {{"prose", 1.0}, {"code", 0.0}};
  Reader only_prose(dir, o);
  for (uint64_t p = 0; p < 200; ++p) REQUIRE(only_prose.sample_domain(only_prose.sample_at(p)) == "prose");
  o.domain_weights = {{"poetry", 1.0}};
  CHECK_THROWS_AS(Reader(dir, o), Error);
}

TEST_CASE("reader gives the validation split of one domain to the gate") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  ReaderOptions o = options(1, 0, 1);
  o.split = "valid";
  o.domain = "code";
  Reader r(dir, o);
  CHECK(r.num_samples() == 2);  // one 40-token document: (40-1)/16
  std::vector<int32_t> w(17);
  r.read_sample(1, w);
  CHECK(w[0] == int32_t(forge::test::fixture_token(1, 1000000 + 16, 1000)));
}

TEST_CASE("reader checks options, tokenizer and shards") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  const auto m = forge::test::make_fixture_dataset(dir, two_domains());
  const auto code_of = [&](ReaderOptions o) {
    try {
      Reader r(dir, o);
      r.next();
    } catch (const Error& e) {
      return e.code();
    }
    return ExitCode::kOk;
  };
  CHECK(code_of(options(6, 0, 4)) == ExitCode::kUsage);  // batch not divisible by DP size
  CHECK(code_of(options(8, 4, 4)) == ExitCode::kUsage);  // rank out of range
  ReaderOptions no_groups = options(8, 0, 1);
  no_groups.group_blocks = 0;
  CHECK(code_of(no_groups) == ExitCode::kUsage);
  ReaderOptions tok = options(8, 0, 1);
  tok.expected_tokenizer_sha256 = "deadbeef";
  CHECK(code_of(tok) == ExitCode::kData);
  tok.expected_tokenizer_sha256 = m.tokenizer_sha256;
  CHECK(code_of(tok) == ExitCode::kOk);

  // A flipped byte inside the token data: the checksum names the shard.
  const std::string shard = dir + "/" + m.shards[1].file;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  try {
    Reader r(dir, options(8, 0, 1));
    FAIL("a corrupted shard was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kData);
    CHECK(std::string(e.what()).find(m.shards[1].file) != std::string::npos);
  }
  // Truncated.
  std::filesystem::resize_file(shard, m.shards[1].bytes / 2);
  CHECK(code_of(options(8, 0, 1)) == ExitCode::kData);
}

TEST_CASE("reader reports an out-of-vocabulary token from the prefetch thread, naming the shard") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  auto m = forge::test::make_fixture_dataset(dir, {{"only", {400}, 1}});
  // Rewrite the train shard with a bad token and a matching checksum: only the read-time check sees it.
  const std::string path = dir + "/" + m.shards[0].file;
  forge::data::ShardData data = forge::data::read_shard(path);
  for (auto& t : data.tokens) t = 5000;
  forge::data::write_shard(path, data,
                           {forge::data::kShardSchemaVersion, "train", "only", m.tokenizer_sha256, 1000}, 2);
  m.shards[0].xxh3 = forge::xxh3_file_hex(path);
  m.shards[0].bytes = std::filesystem::file_size(path);
  forge::data::write_manifest(dir, m);
  Reader r(dir, options(4, 0, 1, 2));
  for (int attempt = 0; attempt < 2; ++attempt) {  // a retry fails again instead of hanging
    try {
      r.next();
      FAIL("a token outside the vocabulary was delivered");
    } catch (const Error& e) {
      CHECK(e.code() == ExitCode::kData);
      CHECK(std::string(e.what()).find(m.shards[0].file) != std::string::npos);
    }
  }
}
