// Near dedup on a planted corpus: removal rate per band of exact Jaccard similarity (recall at or above
// the threshold, false positives below it) for the automatic banding and for the former fixed 14 x 8, and
// the MinHash signature throughput of both. bench/near_dedup.sh runs it.
#include "forge/dataio/dedup.h"
#include "forge/dataio/text.h"
#include "support/planted_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>

using namespace forge::data;
using forge::test::append_letters;
using forge::test::random_text;

namespace {

std::set<uint64_t> shingle_set(const std::string& text) {
  const auto s = shingles(text, MinHashOptions().ngram);
  return {s.begin(), s.end()};
}

double exact_jaccard(const std::set<uint64_t>& x, const std::set<uint64_t>& y) {
  size_t both = 0;
  for (uint64_t v : x) both += y.count(v);
  return double(both) / double(x.size() + y.size() - both);
}

struct Planted {
  Corpus corpus;
  std::map<std::string, double> jaccard;  // copy -> highest exact Jaccard with an earlier family member
  std::set<std::string> bases;            // unrelated to every earlier document: removing one is wrong
};

Planted plant(int bases, int copies, int words, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> rate(0, 0.12);
  Planted p;
  p.corpus.domains = {"text"};
  for (int b = 0; b < bases; ++b) {
    const std::string base = random_text(rng, words);
    std::vector<std::set<uint64_t>> family = {shingle_set(base)};
    p.bases.insert("base" + std::to_string(b));
    p.corpus.docs.emplace_back().text = base;
    p.corpus.docs.back().source = "base" + std::to_string(b);
    for (int c = 0; c < copies; ++c) {
      std::string copy = append_letters(base, rate(rng), rng);
      const std::string name = fmt::format("copy{}.{}", b, c);
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `former`: a plan whose analytic removal rate is printed as an extra column (the old code's rule, which
// near_dedup no longer runs).
void report(const Planted& planted, const MinHashOptions& o, const std::string& label,
            const MinHashPlan* former = nullptr) {
  const MinHashPlan plan = plan_minhash(o);
  Planted p = planted;
  const auto t0 = std::chrono::steady_clock::now();
  const forge::Json st = near_dedup(p.corpus, o);
  const double stage_s = seconds_since(t0);
  std::set<std::string> kept;
  for (const auto& d : p.corpus.docs) kept.insert(d.source);
  fmt::print(
      "\n{}: bands {} rows {} ({} hashes), confirm at estimated J >= {:.4f}; near_dedup stage {:.2f} s\n",
      label, plan.bands, plan.rows, plan.hashes(), plan.confirm_threshold(), stage_s);
  fmt::print("{:<44} {:>7} {:>9} {:>9}{}\n", "exact J", "pairs", "removed", "expected",
             former ? fmt::format(" {:>9}", fmt::format("J>={:.3f}", former->confirm_threshold())) : "");
  struct Bin {
    int pairs = 0, removed = 0;
    double expected = 0, former = 0;
  };
  std::map<int, Bin> bins;
  Bin above, near_below, grey, far_below;  // >= t, [t-0.05, t), [t-0.1, t-0.05), < t-0.1
  for (const auto& [name, j] : planted.jaccard) {
    const bool removed = !kept.count(name);
    const double expected = removal_probability(plan, j);
    const double expected_former = former ? removal_probability(*former, j) : 0.0;
    for (Bin* b : {&bins[static_cast<int>(j * 20)], j >= o.threshold          ? &above
                                                    : j >= o.threshold - 0.05 ? &near_below
                                                    : j >= o.threshold - 0.1  ? &grey
                                                                              : &far_below}) {
      ++b->pairs;
      b->removed += removed;
      b->expected += expected;
      b->former += expected_former;
    }
  }
  const auto line = [&](const std::string& what, const Bin& b) {
    const double n = b.pairs ? b.pairs : 1;
    fmt::print("{:<44} {:7} {:9.4f} {:9.4f}{}\n", what, b.pairs, b.removed / n, b.expected / n,
               former ? fmt::format(" {:9.4f}", b.former / n) : "");
  };
  for (const auto& [bin, b] : bins) line(fmt::format("[{:.2f}, {:.2f})", bin / 20.0, bin / 20.0 + 0.05), b);
  line("recall, J >= threshold", above);
  line("false positives, J in [t - 0.05, t)", near_below);
  line("false positives, J in [t - 0.1, t - 0.05)", grey);
  line("false positives, J < t - 0.1", far_below);
  size_t bases_removed = 0;
  for (const auto& b : planted.bases) bases_removed += !kept.count(b);
  fmt::print("{:<44} {:7} {:9.4f}\n", "false positives, unrelated documents (J ~ 0)", planted.bases.size(),
             double(bases_removed) / planted.bases.size());
  fmt::print("expected recall at J = t: {:.4f} (report: {})\n", removal_probability(plan, o.threshold),
             st["expected_recall_at_threshold"].get<double>());
}

// MB/s of signature computation over the corpus (best of `rounds`).
double signature_mb_per_s(const Corpus& c, const MinHashOptions& o, int rounds) {
  const MinHasher h(o);
  size_t bytes = 0;
  for (const auto& d : c.docs) bytes += d.text.size();
  double best = 1e30;
  uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : c.docs) sink += h.signature(d.text)[0];
    best = std::min(best, seconds_since(t0));
  }
  if (sink == 1) fmt::print("");  // keeps the signatures from being optimized away
  return double(bytes) / 1e6 / best;
}

}  // namespace

int main(int argc, char** argv) {
  const int bases = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int copies = argc > 2 ? std::atoi(argv[2]) : 8;
  const int words = argc > 3 ? std::atoi(argv[3]) : 400;
  const Planted planted = plant(bases, copies, words, 2024);
  size_t bytes = 0;
  for (const auto& d : planted.corpus.docs) bytes += d.text.size();
  fmt::print(
      "planted corpus: {} unrelated documents of {} words, {} copies each with a letter appended to "
      "each word with probability U(0, 0.12); {} documents, {:.1f} MB\n",
      bases, words, copies, planted.corpus.docs.size(), bytes / 1e6);
  const MinHashOptions automatic;  // threshold 0.7
  MinHashOptions fixed = automatic;
  fixed.bands = 14;
  fixed.rows = 8;
  report(planted, automatic, "automatic");
  // The old code confirmed a 14 x 8 candidate at estimated J >= 0.7, i.e. 79 of the 112 positions.
  const MinHashPlan former{14, 8, 79, false};
  report(planted, fixed, "14 x 8 (with the confirmation margin)", &former);
  const double a = signature_mb_per_s(planted.corpus, automatic, 3);
  const double f = signature_mb_per_s(planted.corpus, fixed, 3);
  fmt::print(
      "\nsignature throughput (best of 3, one thread): automatic {:.1f} MB/s, 14 x 8 {:.1f} MB/s ({:.2f}x)\n",
      a, f, a / f);
}
