// Near dedup's recall and false-positive rate on planted near duplicates, binned by their exact Jaccard
// similarity, and the automatic choice of bands and rows (docs/DATA.md, Dedup).
#include "forge/common/error.h"
#include "forge/dataio/dedup.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/text.h"
#include "support/planted_text.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

using namespace forge::data;
using forge::test::append_letters;
using forge::test::random_text;

namespace {

double exact_jaccard(const std::set<uint64_t>& x, const std::set<uint64_t>& y) {
  size_t both = 0;
  for (uint64_t v : x) both += y.count(v);
  return double(both) / double(x.size() + y.size() - both);
}

std::set<uint64_t> shingle_set(const std::string& text) {
  const auto s = shingles(text, MinHashOptions().ngram);
  return {s.begin(), s.end()};
}

struct Planted {
  Corpus corpus;
  // Per planted copy (by source name): its highest exact Jaccard with an earlier document of its family
  // (the base or an earlier copy), the similarity that decides whether removing it is right.
  std::map<std::string, double> jaccard;
};

// `bases` documents of 300 words, each followed by `copies` copies edited at rates drawn from [0, 0.1]
// (exact Jaccard from 1 down to about 0.45).
Planted plant(int bases, int copies, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> rate(0, 0.1);
  Planted p;
  p.corpus.domains = {"text"};
  for (int b = 0; b < bases; ++b) {
    const std::string base = random_text(rng, 300);
    std::vector<std::set<uint64_t>> family = {shingle_set(base)};
    p.corpus.docs.emplace_back().text = base;
    p.corpus.docs.back().source = "base" + std::to_string(b);
    for (int c = 0; c < copies; ++c) {
      std::string copy = append_letters(base, rate(rng), rng);
      const std::string name = "copy" + std::to_string(b) + "." + std::to_string(c);
      const std::set<uint64_t> s = shingle_set(copy);
      double best = 0;
      for (const auto& earlier : family) best = std::max(best, exact_jaccard(s, earlier));
      p.jaccard[name] = best;
      family.push_back(s);
      p.corpus.docs.emplace_back().text = std::move(copy);
      p.corpus.docs.back().source = name;
    }
  }
  return p;
}

struct Bin {
  int pairs = 0, removed = 0;
  double expected = 0;  // sum of the analytic P(removed) over the bin's pairs
  double rate() const { return pairs ? double(removed) / pairs : 0.0; }
};

// Runs near_dedup and bins the planted copies by exact Jaccard, in steps of 0.05.
std::map<int, Bin> removal_by_jaccard(Planted p, const MinHashOptions& o, forge::Json* report = nullptr) {
  const MinHashPlan plan = plan_minhash(o);
  const forge::Json st = near_dedup(p.corpus, o);
  if (report) *report = st;
  std::set<std::string> kept;
  for (const auto& d : p.corpus.docs) kept.insert(d.source);
  std::map<int, Bin> bins;
  for (const auto& [name, j] : p.jaccard) {
    Bin& b = bins[static_cast<int>(j * 20)];
    ++b.pairs;
    b.removed += !kept.count(name);
    b.expected += removal_probability(plan, j);
  }
  return bins;
}

}  // namespace

TEST_CASE("near dedup finds >= 98% of planted near duplicates at or above the threshold") {
  const MinHashOptions o;  // automatic bands and rows, threshold 0.7
  forge::Json st;
  const auto bins = removal_by_jaccard(plant(200, 8, 7), o, &st);
  Bin above, grey, below;  // J >= t, t - 0.1 <= J < t, J < t - 0.1
  Bin far_below;           // J < t - 0.15
  for (const auto& [bin, b] : bins) {
    const double lo = bin / 20.0;
    INFO("exact Jaccard [" << lo << ", " << lo + 0.05 << "): " << b.removed << " of " << b.pairs
                           << " removed, expected " << b.expected / b.pairs);
    Bin& group = lo >= o.threshold - 1e-9 ? above : lo >= o.threshold - 0.1 - 1e-9 ? grey : below;
    group.pairs += b.pairs, group.removed += b.removed, group.expected += b.expected;
    if (lo < o.threshold - 0.15 - 1e-9) far_below.pairs += b.pairs, far_below.removed += b.removed;
    if (lo >= o.threshold - 1e-9) {
      REQUIRE(b.pairs >= 40);  // enough pairs for a per-bin rate to mean something
      CHECK(b.rate() >= 0.98);
    }
    // The measured rate follows the analytic S-curve (a binomial sum over the bin's pairs): the hash
    // family behaves like independent random permutations on these sets.
    CHECK(std::abs(b.removed - b.expected) <= 4 * std::sqrt(b.expected) + 2);
  }
  REQUIRE(above.pairs >= 400);
  CHECK(above.rate() >= 0.98);
  // The plan removes a pair at t - 0.1 with probability <= 5%, and less further down; at t - 0.15 the
  // S-curve is below 0.1%, so one removal in a hundred pairs would already be far off the curve.
  REQUIRE(below.pairs >= 100);
  CHECK(below.rate() <= 0.05);
  REQUIRE(far_below.pairs >= 100);
  CHECK(far_below.rate() <= 0.01);
  // Pairs just below the threshold are what the confirmation margin trades for recall: most are removed.
  CHECK(grey.rate() > 0.3);

  // The report carries the plan and its S-curve.
  const MinHashPlan plan = plan_minhash(o);
  CHECK(st["bands"] == plan.bands);
  CHECK(st["rows"] == plan.rows);
  CHECK(st["banding"] == "automatic");
  CHECK(st["confirm_threshold"].get<double>() == Approx(plan.confirm_threshold()));
  CHECK(st["confirm_threshold"].get<double>() < o.threshold);
  CHECK(st["expected_recall_at_threshold"].get<double>() >= 0.98);
  const forge::Json& curve = st["s_curve"];
  REQUIRE(curve.size() == 6);  // 0.5, 0.6, ..., 1.0 (the threshold 0.7 is one of them)
  CHECK(curve[0]["jaccard"] == 0.5);
  CHECK(curve[5]["p_removed"].get<double>() == Approx(1.0));
  for (size_t i = 1; i < curve.size(); ++i) {
    CHECK(curve[i]["p_removed"].get<double>() >= curve[i - 1]["p_removed"].get<double>());
    CHECK(curve[i]["p_removed"].get<double>() <= curve[i]["p_candidate"].get<double>());
  }
}

TEST_CASE("the automatic banding is the most selective of the near-smallest that meet the targets") {
  for (double t : {0.7, 0.8, 0.9}) {
    INFO("threshold " << t);
    MinHashOptions o;
    o.threshold = t;
    const MinHashPlan plan = plan_minhash(o);
    CHECK(plan.automatic);
    CHECK(plan.hashes() <= kMaxMinHashes);
    CHECK(candidate_probability(plan.bands, plan.rows, t) >= kCandidateRecall);
    CHECK(removal_probability(plan, t) >= 0.98);
    CHECK(removal_probability(plan, t + 0.02) > removal_probability(plan, t));
    CHECK(removal_probability(plan, t - kGreyZone) <= kGreyZoneRemoval);
    // Every explicit plan (same confirmation rule) up to the size window: the smallest that meets the
    // targets sets the window, and none in it has more rows than the automatic one.
    const int window = static_cast<int>(plan.hashes() * (1 + kRowsSlack));
    int smallest = kMaxMinHashes, most_rows = 0;
    std::vector<std::pair<int, int>> meeting;  // (hashes, rows)
    for (int rows = 1; rows <= window; ++rows)
      for (int bands = 1; bands * rows <= window; ++bands) {
        if (candidate_probability(bands, rows, t) < kCandidateRecall) continue;
        o.bands = bands, o.rows = rows;
        if (removal_probability(plan_minhash(o), t - kGreyZone) > kGreyZoneRemoval) continue;
        meeting.emplace_back(bands * rows, rows);
        smallest = std::min(smallest, bands * rows);
      }
    for (const auto& [hashes, rows] : meeting)
      if (hashes <= smallest * (1 + kRowsSlack)) most_rows = std::max(most_rows, rows);
    CHECK(plan.hashes() <= smallest * (1 + kRowsSlack));
    CHECK(plan.rows == most_rows);
  }
  // Every threshold gets a plan that meets the targets (a grid; the hardest are near 0.5, where the
  // estimate is noisiest).
  for (int i = 1; i <= 100; ++i) {
    MinHashOptions o;
    o.threshold = i / 100.0;
    INFO("threshold " << o.threshold);
    const MinHashPlan plan = plan_minhash(o);
    CHECK(removal_probability(plan, o.threshold) >= 0.98);
    if (o.threshold > kGreyZone)
      CHECK(removal_probability(plan, o.threshold - kGreyZone) <= kGreyZoneRemoval);
  }
}

TEST_CASE("explicit bands and rows are used as given, and their lower recall is reported") {
  MinHashOptions o;
  o.bands = 14;  // the old fixed setting: its S-curve is centred near 0.72
  o.rows = 8;
  const MinHashPlan plan = plan_minhash(o);
  CHECK_FALSE(plan.automatic);
  CHECK(plan.hashes() == 112);
  CHECK(removal_probability(plan, 0.7) < 0.8);
  forge::Json st;
  const auto bins = removal_by_jaccard(plant(60, 8, 11), o, &st);
  CHECK(st["banding"] == "configured");
  CHECK(st["bands"] == 14);
  CHECK(st["rows"] == 8);
  CHECK(st["expected_recall_at_threshold"].get<double>() == Approx(removal_probability(plan, 0.7)));
  Bin at;  // [0.7, 0.8): where 14 x 8 loses pairs
  for (int bin : {14, 15})
    if (bins.count(bin)) at.pairs += bins.at(bin).pairs, at.removed += bins.at(bin).removed;
  REQUIRE(at.pairs >= 20);
  CHECK(at.rate() < 0.98);

  for (auto [bands, rows] : {std::pair{-1, 0}, {0, 5}, {5, 0}, {0, -2}})
    CHECK_THROWS_AS(plan_minhash({5, bands, rows, 0.7, 1}), forge::Error);
  CHECK_THROWS_AS(plan_minhash({5, 64, 9, 0.7, 1}), forge::Error);  // 576 hashes, over the cap
}

TEST_CASE("near_dedup.bands and near_dedup.rows are checked by name in the config") {
  const auto load = [](std::vector<std::string> overrides) {
    PrepareOptions o;
    apply_config(forge::load_config(prepare_schema(), "", overrides), o);
    return o.minhash;
  };
  const MinHashOptions defaults = load({});
  CHECK(defaults.bands == 0);
  CHECK(defaults.rows == 0);
  const MinHashOptions given = load({"--near_dedup.bands=20", "--near_dedup.rows=5"});
  CHECK(given.bands == 20);
  CHECK(given.rows == 5);
  const auto rejected = [&](std::vector<std::string> overrides) {
    try {
      load(overrides);
    } catch (const forge::Error& e) {
      CHECK(e.code() == forge::ExitCode::kUsage);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(rejected({"--near_dedup.bands=0", "--near_dedup.rows=4"}), Catch::Contains("near_dedup.bands"));
  CHECK_THAT(rejected({"--near_dedup.bands=4"}), Catch::Contains("near_dedup.rows"));
  CHECK_THAT(rejected({"--near_dedup.bands=-1", "--near_dedup.rows=4"}), Catch::Contains("near_dedup.bands"));
  CHECK_THAT(rejected({"--near_dedup.bands=100", "--near_dedup.rows=10"}),
             Catch::Contains("near_dedup.rows"));
}
