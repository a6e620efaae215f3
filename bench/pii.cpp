// The PII and safety stages on one core: ~100 MB of generated prose and code with sparse planted PII and
// look-alikes (versions, dates, hashes, loopback addresses), held in memory so only the scanning is timed.
// Prints MB/s of PII alone, safety alone and both (the goal: >= 100 MB/s per core for both), then,
// as the peer in the same run, a loop of std::regex searches over the same PII patterns on a 1 MB slice.
//
// usage: bench_pii [MB] [SAFETY_LIST]   (default 100 MB and configs/safety.example.txt plus 300 generated
//                                        words, so the list has the size of a real one)
#include "forge/dataio/pii.h"
#include "forge/common/error.h"
#include "forge/common/json.h"

#include <time.h>

#include <cstdio>
#include <iterator>
#include <random>
#include <regex>
#include <string>
#include <vector>

using namespace forge::data;

namespace {

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Documents of about 4 KB: prose or code, one in four with a planted PII item, one in twenty with a term of
// the example safety list, and look-alikes throughout.
std::vector<std::string> make_corpus(size_t bytes, uint64_t* planted) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> words = {
      "the",     "river",   "model",   "data",    "quietly", "between", "system",  "people",  "number",
      "report",  "through", "history", "because", "example", "process", "general", "version", "weather",
      "against", "measure", "company", "network", "student", "science", "without", "morning", "library"};
  const std::vector<std::string> pii = {"jane.doe@example.com",
                                        "+44 20 7946 0958",
                                        "(555) 123-4567",
                                        "198.51.100.23",
                                        "4111 1111 1111 1111",
                                        "AKIAZ7Q4N2P9X3K5M8TB",
                                        "ghp_4mD9sK2LxQ7vR1tY8bN3wE6zU0aC5jH2fG7p",
                                        "2001:db8:85a3::8a2e:370:7334",
                                        "555-867-5309"};
  const std::vector<std::string> code = {"import numpy as np  # numpy 1.26.4, released 2024-02-05\n",
                                         "    commit = \"e83c5163316f89bfbd7d9ab23ca2e25604af290d\"\n",
                                         "    server.bind((\"127.0.0.1\", 8080))  # timeout 10:30:00\n",
                                         "    uid = uuid.UUID(\"550e8400-e29b-41d4-a716-446655440000\")\n",
                                         "    for i in range(1024):\n        total += values[i] * 3.14159\n",
                                         "static const int kTable[] = {10, 20, 30, 40, 50, 60, 70, 80};\n"};
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < bytes) {
    std::string d;
    const bool is_code = rng() % 3 == 0;
    while (d.size() < 4000) {
      if (is_code) {
        d += code[rng() % code.size()];
      } else {
        for (int w = 0; w < 12; ++w) d += words[rng() % words.size()] + ' ';
        d += rng() % 8 == 0 ? "See version 2.4.1 of 15/01/2024.\n" : ".\n";
      }
    }
    // At line starts, so that no figure of the text is cut in two.
    if (rng() % 20 == 0) d.insert(d.find('\n', d.size() / 3) + 1, "a credit card dump\n");
    if (rng() % 4 == 0) {
      d.insert(d.find('\n', d.size() / 2) + 1, "contact " + pii[rng() % pii.size()] + "\n");
      ++*planted;
    }
    total += d.size();
    docs.push_back(std::move(d));
  }
  return docs;
}

double mb(const std::vector<std::string>& docs) {
  double b = 0;
  for (const auto& d : docs) b += double(d.size());
  return b / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  return forge::run_cli("bench_pii", [&] {
    const size_t target_mb = argc > 1 ? std::stoul(argv[1]) : 100;
    const std::string list =
        argc > 2 ? argv[2] : std::string(FORGE_SOURCE_DIR) + "/configs/safety.example.txt";
    uint64_t planted = 0;
    const std::vector<std::string> docs = make_corpus(target_mb << 20, &planted);
    const double size_mb = mb(docs);

    std::vector<SafetyEntry> entries = parse_safety_list(forge::read_file(list), list);
    if (argc <= 2)
      for (int i = 0; i < 300; ++i)
        entries.push_back({"badterm" + std::to_string(i * 7919 % 100000), false, 1, 0});
    SafetyFilter safety(entries, list);
    PiiScanner scanner;
    constexpr std::array<bool, kPiiTypes> kAll = {true, true, true, true, true};

    // Each pass does what its stage does per document: find and rewrite the matches; score.
    std::vector<PiiMatch> matches;
    uint64_t found = 0, scored = 0, redacted_bytes = 0;
    const auto pii_pass = [&](const std::string& d) {
      scanner.find(d, kAll, matches);
      found += matches.size();
      if (!matches.empty()) redacted_bytes += redact_pii(d, matches).size();
    };
    const auto safety_pass = [&](const std::string& d) { scored += safety.score(d) > 0; };
    const auto rate = [&](const auto& pass) {
      const double t = thread_cpu_s();
      for (const auto& d : docs) pass(d);
      return size_mb / (thread_cpu_s() - t);
    };
    const double pii = rate(pii_pass);
    const uint64_t pii_found = found, pii_rewritten = redacted_bytes;
    const double safe = rate(safety_pass);
    const uint64_t safety_scored = scored;
    const double both = rate([&](const std::string& d) {
      pii_pass(d);
      safety_pass(d);
    });

    // The peer: one std::regex (ECMAScript) search loop per pattern, counting matches only (no checks).
    std::vector<std::string> slice;
    size_t slice_bytes = 0;
    for (size_t i = 0; i < docs.size() && slice_bytes < (1u << 20); ++i) {
      slice.push_back(docs[i]);
      slice_bytes += docs[i].size();
    }
    std::vector<std::regex> regexes;
    for (const auto& r : pii_pattern_regexes())
      regexes.emplace_back(r, std::regex::ECMAScript | std::regex::optimize);
    uint64_t peer_matches = 0;
    const double t = thread_cpu_s();
    for (const auto& d : slice)
      for (const auto& re : regexes)
        peer_matches += std::distance(std::sregex_iterator(d.begin(), d.end(), re), std::sregex_iterator());
    const double peer = mb(slice) / (thread_cpu_s() - t);

    std::printf("bench_pii: %.1f MB in %zu documents (%llu with planted PII), one thread, CPU time\n",
                size_mb, docs.size(), static_cast<unsigned long long>(planted));
    std::printf(
        "  pii     %8.1f MB/s   %llu matches (%zu patterns, one Hyperscan database; %.1f MB rewritten)\n",
        pii, static_cast<unsigned long long>(pii_found), pii_pattern_regexes().size(),
        double(pii_rewritten) / 1e6);
    std::printf("  safety  %8.1f MB/s   %llu documents with a match (%zu list entries)\n", safe,
                static_cast<unsigned long long>(safety_scored), entries.size());
    std::printf("  both    %8.1f MB/s   = %.2fx the goal of 100 MB/s per core\n", both, both / 100);
    std::printf(
        "  peer: std::regex loop over the same %zu patterns, %.1f MB slice: %.2f MB/s (%llu raw "
        "matches); Hyperscan PII is %.0fx faster\n",
        regexes.size(), mb(slice), peer, static_cast<unsigned long long>(peer_matches), pii / peer);
    return 0;
  });
}
