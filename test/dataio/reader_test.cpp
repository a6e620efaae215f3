#include "forge/dataio/reader.h"
#include "dataset_fixture.h"
#include "forge/common/error.h"
#include "support/temp_dir.h"

#include <hdf5.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

using forge::Error;
using forge::ExitCode;
using forge::MicroBatch;
using forge::data::Cursor;
using forge::data::Order;
using forge::data::Reader;
using forge::data::ReaderOptions;

namespace {

using forge::test::two_domains;

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

// The global batches of `steps` steps, rank slices concatenated in rank order. Each slice has
// global_batch / dp rows.
std::vector<MicroBatch> read_global(const std::string& dir, uint32_t batch, int dp, int steps,
                                    const Cursor* from = nullptr, Order order = Order::kBlock,
                                    bool document_mask = false) {
  std::vector<std::unique_ptr<Reader>> readers;
  for (int r = 0; r < dp; ++r) {
    ReaderOptions o = options(batch, r, dp, 2, order);
    o.document_mask = document_mask;
    readers.push_back(std::make_unique<Reader>(dir, o));
    if (from) readers.back()->seek(*from);
  }
  std::vector<MicroBatch> out;
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> slices;
    for (auto& reader : readers) {
      slices.push_back(reader->next());
      REQUIRE(slices.back().rows == int(batch) / dp);
      REQUIRE(slices.back().seq_len == 16);
    }
    out.push_back(MicroBatch::concat(slices));
  }
  return out;
}

// Everything a batch carries, field by field.
void require_same(const MicroBatch& a, const MicroBatch& b) {
  REQUIRE(a.rows == b.rows);
  REQUIRE(a.sample_ids == b.sample_ids);
  REQUIRE(a.epochs == b.epochs);
  REQUIRE(a.inputs == b.inputs);
  REQUIRE(a.form() == b.form());
  REQUIRE(a.targets == b.targets);
  REQUIRE(a.next_tokens == b.next_tokens);
  REQUIRE(a.weights == b.weights);
  REQUIRE(a.positions == b.positions);
  REQUIRE(a.segments == b.segments);
}

// Row r against the window read_sample gives for its sample id: inputs are the first seq_len tokens,
// targets the last seq_len.
void require_shifted_window(Reader& reader, const MicroBatch& b, int r) {
  const size_t T = size_t(b.seq_len);
  std::vector<int32_t> window(T + 1);
  reader.read_sample(b.sample_ids[size_t(r)], window);
  for (size_t t = 0; t < T; ++t) {
    REQUIRE(b.inputs[size_t(r) * T + t] == window[t]);
    REQUIRE(b.target(size_t(r) * T + t) == window[t + 1]);
  }
}

// /doc_offsets of a shard, read with HDF5 here rather than through the reader.
std::vector<uint64_t> doc_offsets_of(const std::string& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t ds = H5Dopen2(file, "doc_offsets", H5P_DEFAULT);
  REQUIRE(ds >= 0);
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<uint64_t> out(n);
  REQUIRE(H5Dread(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(file);
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
  // Batch rows are the windows, with the pretraining defaults left empty: the targets in next-token form
  // (each row's inputs and one next token, the window's seq_len + 1 tokens).
  const MicroBatch b = reader.next();
  REQUIRE(b.rows == 4);
  REQUIRE(b.seq_len == 16);
  REQUIRE(b.inputs.size() == 4 * 16);
  REQUIRE(b.form() == MicroBatch::Targets::kNextToken);
  REQUIRE(b.targets.empty());
  REQUIRE(b.next_tokens.size() == 4);
  CHECK(b.weights.empty());
  CHECK(b.positions.empty());
  CHECK(b.segments.empty());
  CHECK(b.epochs == std::vector<uint32_t>(4, 0));
  for (int i = 0; i < b.rows; ++i) require_shifted_window(reader, b, i);
  CHECK(b.problem(1000, 16) == std::nullopt);
  CHECK(b.weight_sum() == 4 * 16);
}

TEST_CASE("a batch in next-token form is the same batch as its explicit targets, field by field") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  Reader reader(dir, options(4, 0, 1));
  MicroBatch compact = reader.next();
  REQUIRE(compact.form() == MicroBatch::Targets::kNextToken);
  MicroBatch full = compact;
  full.materialize_targets();
  REQUIRE(full.form() == MicroBatch::Targets::kExplicit);
  REQUIRE(full.next_tokens.empty());
  REQUIRE(full.targets.size() == compact.size());
  for (size_t i = 0; i < compact.size(); ++i) REQUIRE(full.targets[i] == compact.target(i));
  std::vector<int32_t> written(compact.size());
  compact.copy_targets(written.data());
  CHECK(written == full.targets);
  CHECK(compact.weight_sum() == full.weight_sum());
  // The verification batch a checkpoint keeps: one format for both forms, read back explicit.
  CHECK(compact.serialize() == full.serialize());
  CHECK(MicroBatch::deserialize(compact.serialize()).targets == full.targets);
  // Rows sliced and stacked keep the form; a stack with one explicit part is explicit.
  const MicroBatch head = compact.slice_rows(0, 2), tail = compact.slice_rows(2, 2);
  CHECK(head.form() == MicroBatch::Targets::kNextToken);
  CHECK(head.next_tokens.size() == 2);
  const MicroBatch parts[] = {head, tail};
  const MicroBatch whole = MicroBatch::concat(parts);
  CHECK(whole.form() == MicroBatch::Targets::kNextToken);
  CHECK(whole.next_tokens == compact.next_tokens);
  const MicroBatch mixed_parts[] = {head, full.slice_rows(2, 2)};
  const MicroBatch mixed = MicroBatch::concat(mixed_parts);
  CHECK(mixed.form() == MicroBatch::Targets::kExplicit);
  CHECK(mixed.targets == full.targets);
  // A row written in either form predicts the window's next tokens.
  std::vector<int32_t> window(17);
  reader.read_sample(compact.sample_ids[3], window);
  for (MicroBatch* b : {&compact, &full}) {
    std::copy_n(window.begin(), 16, b->inputs.begin());
    b->set_next_token(0, window[16]);
    for (size_t t = 0; t < 16; ++t) REQUIRE(b->target(t) == window[t + 1]);
  }
  // A next token outside the vocabulary is found as a target would be.
  compact.next_tokens[1] = 5000;
  REQUIRE(compact.problem(1000, 16).has_value());
  CHECK(compact.problem(1000, 16)->find("(row 1, position 15): target id 5000") != std::string::npos);
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
    const MicroBatch x = a.next(), y = b.next();
    require_same(x, y);
    for (int i = 0; i < x.rows; ++i) {
      const uint64_t position = uint64_t(s) * 4 + uint64_t(i);
      REQUIRE(x.sample_ids[size_t(i)] == a.sample_at(position));
      REQUIRE(x.epochs[size_t(i)] == position / e);
      require_shifted_window(a, x, i);
    }
  }
}

TEST_CASE("reader DP ranks are disjoint and together read the global batch") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    // 30 steps of 8: step 23 holds positions 184..191 and so the boundary of the 188-sample epoch.
    const auto one = read_global(dir, 8, 1, 30, nullptr, order);
    for (int dp : {2, 4, 8}) {
      const auto many = read_global(dir, 8, dp, 30, nullptr, order);
      std::set<uint64_t> seen;
      std::set<std::pair<uint64_t, uint32_t>> seen_pairs;
      for (int s = 0; s < 30; ++s) {
        require_same(many[size_t(s)], one[size_t(s)]);
        for (int i = 0; i < 8; ++i) {
          const uint64_t id = many[size_t(s)].sample_ids[size_t(i)];
          const uint32_t epoch = many[size_t(s)].epochs[size_t(i)];
          REQUIRE(epoch == (uint64_t(s) * 8 + uint64_t(i)) / 188);
          // within one epoch no sample repeats across ranks or steps; across epochs the pair is unique
          if (epoch == 0) REQUIRE(seen.insert(id).second);
          REQUIRE(seen_pairs.insert({id, epoch}).second);
        }
      }
      CHECK(seen.size() == 188);
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
        for (int s = 0; s < 27; ++s) require_same(resumed[size_t(s)], uninterrupted[size_t(13 + s)]);
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
  const MicroBatch b = global.next();
  for (int i = 0; i < b.rows; ++i) CHECK(b.sample_ids[size_t(i)] == global.sample_at(40 + uint64_t(i)));
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

// Largest-remainder apportionment of `positions` by `weights`, computed here independently of the reader.
std::map<std::string, uint64_t> largest_remainder(const std::map<std::string, double>& weights,
                                                  uint64_t positions) {
  double sum = 0;
  for (const auto& [name, w] : weights) sum += w;
  std::map<std::string, uint64_t> out;
  std::vector<std::pair<double, std::string>> rest;
  uint64_t given = 0;
  for (const auto& [name, w] : weights) {
    const double exact = w / sum * double(positions);
    out[name] = uint64_t(exact);
    given += out[name];
    rest.emplace_back(exact - double(out[name]), name);
  }
  std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < positions; ++k, ++given) ++out[rest[k % rest.size()].second];
  return out;
}

TEST_CASE("reader batches carry each row's domain; an epoch's shares are the weights' largest remainders") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  const forge::data::Manifest m = forge::test::make_fixture_dataset(dir, two_domains());
  const std::map<std::string, double> weights = {{"prose", 0.3}, {"code", 0.7}};
  for (const Order order : {Order::kBlock, Order::kGlobal}) {
    // Two DP ranks, global batch 4: 188 positions per epoch are 47 whole steps.
    std::vector<std::unique_ptr<Reader>> ranks;
    for (int r = 0; r < 2; ++r) {
      ReaderOptions o = options(4, r, 2, 2, order);
      o.domain_weights = weights;
      ranks.push_back(std::make_unique<Reader>(dir, o));
    }
    const uint64_t epoch = ranks[0]->samples_per_epoch();
    REQUIRE(epoch % 4 == 0);
    std::map<std::string, uint64_t> seen;
    MicroBatch b;
    for (uint64_t step = 0; step < epoch / 4; ++step) {
      for (auto& reader : ranks) {
        reader->next(b);
        REQUIRE(b.domains.size() == size_t(b.rows));
        for (int r = 0; r < b.rows; ++r) {
          const std::string& name = m.domains.at(b.domains[size_t(r)]);
          REQUIRE(name == reader->sample_domain(b.sample_ids[size_t(r)]));
          ++seen[name];
        }
      }
    }
    const auto want = largest_remainder(weights, epoch);
    CHECK(seen == want);
    for (const auto& [name, w] : weights) CHECK(std::abs(double(seen[name]) - w * double(epoch)) < 1.0);
    // The cursor records the weights (the checkpoint keeps it) and refuses others.
    const Cursor c = Cursor::from_json(ranks[0]->cursor().to_json());
    CHECK(c.domain_weights == weights);
    ReaderOptions other = options(4, 0, 2, 2, order);
    other.domain_weights = {{"prose", 0.5}, {"code", 0.5}};
    Reader r(dir, other);
    CHECK_THROWS_WITH(r.seek(c), Catch::Contains("domain weights"));
  }
  // The domain survives the batch's own transformations (the checkpoint's verification batch).
  ReaderOptions o = options(4, 0, 1);
  Reader r(dir, o);
  const MicroBatch first = r.next(), second = r.next();
  const MicroBatch both = MicroBatch::concat(std::vector<MicroBatch>{first, second});
  CHECK(MicroBatch::deserialize(both.serialize()).domains == both.domains);
  CHECK(both.slice_rows(4, 4).domains == second.domains);
  MicroBatch unknown = first;
  unknown.domains.clear();  // a part without domains (the synthetic stream): the whole is unknown
  CHECK(MicroBatch::concat(std::vector<MicroBatch>{unknown, second}).domains.empty());
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

TEST_CASE("reader reports an out-of-vocabulary token from the prefetch thread, naming shard and sample") {
  // 400 tokens: 24 windows of 16 (+1) tokens. Token 100 lies inside window 6 only; token 0 is only the
  // first input of window 0; token 384 only the last target of window 23.
  for (const auto& [bad, sample] : {std::pair<size_t, uint64_t>{100, 6}, {0, 0}, {384, 23}}) {
    INFO("bad token " << bad);
    forge::test::TempDir tmp;
    const std::string dir = tmp / "ds";
    auto m = forge::test::make_fixture_dataset(dir, {{"only", {400}, 1}});
    // Rewrite the train shard with one bad token and a matching checksum: only the read-time check sees it.
    const std::string path = dir + "/" + m.shards[0].file;
    forge::data::ShardData data = forge::data::read_shard(path);
    data.tokens[bad] = 5000;
    forge::data::write_shard(
        path, data, {forge::data::kShardSchemaVersion, "train", "only", m.tokenizer_sha256, 1000}, 2);
    m.shards[0].xxh3 = forge::xxh3_file_hex(path);
    m.shards[0].bytes = std::filesystem::file_size(path);
    forge::data::write_manifest(dir, m);
    const auto names_shard_and_sample = [&](const Error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(e.code() == ExitCode::kData);
      CHECK(static_cast<int>(e.code()) == 65);
      CHECK(what.find(m.shards[0].file) != std::string::npos);
      CHECK(what.find(fmt::format("sample {}: token 5000 outside the vocabulary (1000)", sample)) !=
            std::string::npos);
    };
    for (int prefetch : {2, 0}) {
      Reader r(dir, options(4, 0, 1, prefetch));
      uint64_t position = 0;  // the batch holding the sample (6 batches per epoch)
      while (r.sample_at(position) != sample) ++position;
      for (uint64_t s = 0; s < position / 4; ++s) REQUIRE_NOTHROW(r.next());
      for (int attempt = 0; attempt < 2; ++attempt) {  // a retry fails again instead of hanging
        try {
          r.next();
          FAIL("a token outside the vocabulary was delivered");
        } catch (const Error& e) {
          names_shard_and_sample(e);
        }
      }
      std::vector<int32_t> window(17);
      try {
        r.read_sample(sample, window);
        FAIL("read_sample delivered a token outside the vocabulary");
      } catch (const Error& e) {
        names_shard_and_sample(e);
      }
      REQUIRE_NOTHROW(r.read_sample(sample == 0 ? 1 : sample - 1, window));
    }
  }
}

TEST_CASE("reader recycles the batch buffers") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  for (bool mask : {false, true}) {
    for (int prefetch : {0, 2}) {
      ReaderOptions o = options(8, 1, 2, prefetch);
      o.document_mask = mask;
      Reader r(dir, o);
      MicroBatch b;
      std::set<const void*> buffers;
      for (int s = 0; s < 40; ++s) {
        r.next(b);
        buffers.insert(b.inputs.data());
        buffers.insert(mask ? static_cast<const void*>(b.targets.data()) : b.next_tokens.data());
        if (mask) buffers.insert(b.segments.data());
      }
      // The caller's buffer and those cycling through the prefetch queue, nothing allocated afresh.
      CHECK(buffers.size() <= size_t(mask ? 3 : 2) * size_t(prefetch + 2));
    }
  }
}

TEST_CASE("reader epochs: (sample, epoch) is unique even when one global batch spans epochs") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  forge::test::make_fixture_dataset(dir, two_domains());
  // A global batch of 192 > 188 samples per epoch: every step spans an epoch boundary, so some sample id
  // necessarily occurs twice in a step, once per epoch.
  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    const auto one = read_global(dir, 192, 1, 3, nullptr, order);
    const auto four = read_global(dir, 192, 4, 3, nullptr, order);
    std::set<std::pair<uint64_t, uint32_t>> pairs;
    for (int s = 0; s < 3; ++s) {
      require_same(four[size_t(s)], one[size_t(s)]);
      std::set<uint64_t> ids;
      bool repeated = false;
      for (size_t i = 0; i < 192; ++i) {
        const uint64_t position = uint64_t(s) * 192 + i;
        REQUIRE(one[size_t(s)].epochs[i] == position / 188);
        repeated = !ids.insert(one[size_t(s)].sample_ids[i]).second || repeated;
        REQUIRE(pairs.insert({one[size_t(s)].sample_ids[i], one[size_t(s)].epochs[i]}).second);
      }
      CHECK(repeated);
    }
    // Epochs never decrease along the stream and step by one at each boundary.
    CHECK(one[0].epochs.front() == 0);
    CHECK(one[0].epochs.back() == 1);
    CHECK(one[2].epochs.back() == 575 / 188);
  }
}

TEST_CASE("reader document_mask marks the shards' document boundaries") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "ds";
  // Documents shorter and longer than a 16-token row, several per shard and shards cut inside windows,
  // and one document ending exactly where a window does.
  const std::vector<forge::test::FixtureDomain> domains = {
      {"prose", {5, 3, 40, 16, 1, 29, 7, 64, 2, 33, 17, 9}, 3}, {"code", {48, 11, 20, 6, 31}, 2}};
  const forge::data::Manifest m = forge::test::make_fixture_dataset(dir, domains, 64);
  // The document starts of each domain's stream, from the shards' /doc_offsets.
  std::vector<std::set<uint64_t>> starts(domains.size());
  for (size_t d = 0; d < domains.size(); ++d) {
    uint64_t base = 0;
    for (const auto* e : m.shards_of("train", domains[d].name)) {
      const std::vector<uint64_t> offsets = doc_offsets_of(dir + "/" + e->file);
      for (size_t k = 0; k + 1 < offsets.size(); ++k) starts[d].insert(base + offsets[k]);
      base += offsets.back();
    }
  }
  // This fixture's documents do not end with the EOS id; with a vocabulary of 64 the id (2) occurs inside
  // documents instead, so boundaries found from the EOS token would be wrong.
  bool eos_inside = false;

  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    ReaderOptions o = options(8, 0, 1, 2, order);
    o.document_mask = true;
    Reader masked(dir, o);
    o.document_mask = false;
    Reader plain(dir, o);
    const uint64_t prose_windows = (5 + 3 + 40 + 16 + 1 + 29 + 7 + 64 + 2 + 33 + 17 + 9 - 1) / 16;
    REQUIRE(masked.num_samples() == prose_windows + (48 + 11 + 20 + 6 + 31 - 1) / 16);
    const uint64_t steps = masked.samples_per_epoch() / 8 + 2;  // a whole epoch and a bit
    int boundaries = 0;
    for (uint64_t s = 0; s < steps; ++s) {
      const MicroBatch b = masked.next(), p = plain.next();
      REQUIRE(b.problem(64, 16) == std::nullopt);
      REQUIRE(b.sample_ids == p.sample_ids);
      REQUIRE(b.epochs == p.epochs);
      REQUIRE(b.inputs == p.inputs);
      REQUIRE(b.weights.size() == b.size());
      REQUIRE(b.positions.size() == b.size());
      REQUIRE(b.segments.size() == b.size());
      for (int r = 0; r < b.rows; ++r) {
        const uint64_t id = b.sample_ids[size_t(r)];
        const size_t d = id < prose_windows ? 0 : 1;
        const uint64_t first = (d == 0 ? id : id - prose_windows) * 16;  // the window's first stream token
        std::vector<int32_t> window(17);
        masked.read_sample(id, window);
        int32_t segment = 0, position = 0;
        for (size_t t = 0; t < 16; ++t) {
          const size_t i = size_t(r) * 16 + t;
          const bool opens = t > 0 && starts[d].count(first + t);  // a document starts at this input
          const bool next_opens = starts[d].count(first + t + 1);  // ... or at this position's target
          if (opens) segment += 1, position = 0, ++boundaries;
          INFO("sample " << id << " position " << t);
          REQUIRE(b.inputs[i] == window[t]);
          REQUIRE(b.segments[i] == segment);
          REQUIRE(b.positions[i] == position);
          // The attention-relevant fact: the segment changes exactly where a document starts.
          if (t > 0) REQUIRE((b.segments[i] != b.segments[i - 1]) == opens);
          REQUIRE(b.targets[i] == (next_opens ? MicroBatch::kIgnore : window[t + 1]));
          REQUIRE(b.weight(i) == (next_opens ? 0.0f : 1.0f));
          REQUIRE(p.target(i) == window[t + 1]);
          if (window[t] == 2 && !next_opens) eos_inside = true;  // an EOS id that ends no document
          ++position;
        }
      }
    }
    CHECK(boundaries >= 15);  // 17 documents, most starting inside a window
    // Random access (the gate's pass) gives the row next() gave, also into a reused one-row batch.
    const MicroBatch again = masked.next();
    MicroBatch one_row;
    one_row.resize(1, 16);
    for (int r = again.rows - 1; r >= 0; --r) {
      masked.read_sample(again.sample_ids[size_t(r)], one_row, 0);
      MicroBatch want = again.slice_rows(r, 1);
      want.epochs = {0};  // random access has no stream position
      require_same(one_row, want);
    }
    // The DP slices of masked readers concatenate to the same batches.
    const auto one = read_global(dir, 8, 1, 6, nullptr, order, true);
    const auto four = read_global(dir, 8, 4, 6, nullptr, order, true);
    for (size_t s = 0; s < one.size(); ++s) require_same(four[s], one[s]);
  }
  CHECK(eos_inside);
}

TEST_CASE("reader loss_mask trains every reply once per epoch, with its prompt, in whole conversations") {
  forge::test::TempDir tmp;
  const std::string dir = tmp / "chat", text = tmp / "text";
  // Conversations shorter and longer than a 16-token row (one exactly 17 tokens: a full window), shards cut
  // inside windows.
  const std::vector<forge::test::FixtureDomain> domains = {
      {"chat", {5, 3, 40, 16, 1, 29, 7, 64, 2, 33, 17, 9, 4, 12, 6, 8, 3}, 3}};
  const forge::data::Manifest m = forge::test::make_fixture_dataset(dir, domains, 64, /*chat=*/true);
  forge::test::make_fixture_dataset(text, domains, 64);
  std::vector<uint64_t> starts;  // of the conversations in the stream, and its end
  uint64_t base = 0;
  for (const auto* e : m.shards_of("train", "chat")) {
    const std::vector<uint64_t> offsets = doc_offsets_of(dir + "/" + e->file);
    for (size_t k = 0; k + 1 < offsets.size(); ++k) starts.push_back(base + offsets[k]);
    base += offsets.back();
  }
  const uint64_t stream = base;
  const auto conversation_of = [&](uint64_t token) {
    return size_t(std::upper_bound(starts.begin(), starts.end(), token) - starts.begin() - 1);
  };
  for (Order order : {Order::kBlock, Order::kGlobal}) {
    INFO("order " << forge::data::order_name(order));
    ReaderOptions o = options(4, 0, 1, 2, order);
    o.document_mask = o.loss_mask = true;
    Reader masked(dir, o);
    std::vector<int> scored(stream, 0);  // times each stream token was a scored target in one epoch
    std::set<uint64_t> ids;
    for (uint64_t s = 0; s < masked.samples_per_epoch() / 4; ++s) {
      const MicroBatch b = masked.next();
      REQUIRE(b.problem(64, 16) == std::nullopt);
      for (int r = 0; r < b.rows; ++r) {
        const uint64_t id = b.sample_ids[size_t(r)];
        ids.insert(id);
        std::vector<int32_t> window(17);
        masked.read_sample(id, window);
        // The row opens a conversation: find its stream offset from the tokens (fixture_token is unique
        // enough over 17 tokens at vocabulary 64 only by position, so match the whole window).
        uint64_t first = stream;
        for (uint64_t c : starts) {
          bool same = c + 17 <= stream;
          for (uint64_t t = 0; same && t < 17; ++t)
            same = window[t] == int32_t(forge::test::fixture_token(0, c + t, 64));
          if (same) first = c;
        }
        INFO("sample " << id);
        REQUIRE(first < stream);  // every sample starts where a conversation does
        REQUIRE(b.positions[size_t(r) * 16] == 0);
        for (size_t t = 0; t < 16; ++t) {
          const size_t i = size_t(r) * 16 + t;
          REQUIRE(b.inputs[i] == window[t]);
          if (b.targets[i] == MicroBatch::kIgnore) continue;
          REQUIRE(b.targets[i] == window[t + 1]);
          const uint64_t k = first + t + 1;  // the scored token
          REQUIRE(forge::test::fixture_scored(0, k));
          // The row's first conversation, or a later one whole in the window.
          const size_t c = conversation_of(k);
          const uint64_t end = c + 1 < starts.size() ? starts[c + 1] : stream;
          REQUIRE((starts[c] == first || (starts[c] > first && end <= first + 17)));
          ++scored[k];
        }
      }
    }
    REQUIRE(ids.size() == masked.num_samples());
    // Every marked token of a conversation whose first 17 tokens lie in the stream is scored exactly once,
    // unless it is the conversation's first token or beyond its first window.
    int once = 0;
    for (uint64_t k = 0; k < stream; ++k) {
      const uint64_t c = starts[conversation_of(k)];
      const bool want = forge::test::fixture_scored(0, k) && k != c && k - c <= 16;
      INFO("token " << k << " of the conversation at " << c);
      if (c + 17 <= stream)
        REQUIRE(scored[k] == (want ? 1 : 0));
      else
        REQUIRE(scored[k] <= 1);
      once += scored[k];
    }
    CHECK(once > 60);
    // Random access (the gate's held-out pass) gives the same rows.
    const MicroBatch again = masked.next();
    MicroBatch one_row;
    one_row.resize(1, 16);
    for (int r = 0; r < again.rows; ++r) {
      masked.read_sample(again.sample_ids[size_t(r)], one_row, 0);
      MicroBatch want = again.slice_rows(r, 1);
      want.epochs = {0};
      require_same(one_row, want);
    }
    // DP slices concatenate to the same batches, and a cursor of windows does not seek a reader of bins.
    std::vector<MicroBatch> one, four;
    for (int dp : {1, 4}) {
      std::vector<std::unique_ptr<Reader>> readers;
      for (int r = 0; r < dp; ++r) {
        ReaderOptions ro = options(4, r, dp, 2, order);
        ro.document_mask = ro.loss_mask = true;
        readers.push_back(std::make_unique<Reader>(dir, ro));
      }
      for (int st = 0; st < 5; ++st) {
        std::vector<MicroBatch> slices;
        for (auto& rd : readers) slices.push_back(rd->next());
        (dp == 1 ? one : four).push_back(MicroBatch::concat(slices));
      }
    }
    for (size_t st = 0; st < one.size(); ++st) require_same(four[st], one[st]);
    ReaderOptions windows = o;
    windows.loss_mask = false;
    Reader plain(dir, windows);
    CHECK_THROWS_AS(masked.seek(plain.cursor()), Error);
  }
  // A text dataset has no masks, and the mask follows the documents.
  ReaderOptions o = options(8, 0, 1);
  o.document_mask = o.loss_mask = true;
  const auto refusal = [](const std::string& at, const ReaderOptions& with) -> std::string {
    try {
      Reader r(at, with);
    } catch (const Error& e) {
      CHECK(e.code() == ExitCode::kUsage);
      return e.what();
    }
    FAIL("the reader opened " << at);
    return "";
  };
  CHECK_THAT(refusal(text, o), Catch::Contains("--format chat"));
  o.document_mask = false;
  CHECK_THAT(refusal(dir, o), Catch::Contains("needs document_mask"));
}
