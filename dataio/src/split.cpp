#include "forge/dataio/split.h"

#include "forge/common/hash.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace forge::data {

std::vector<uint8_t> assign_valid_split(const Corpus& corpus, double valid_fraction, uint64_t seed) {
  std::vector<uint8_t> valid(corpus.docs.size(), 0);
  if (valid_fraction <= 0) return valid;
  // A unit goes to one side whole: a document, or every file of a repository family.
  struct Unit {
    uint64_t key;
    size_t first;  // its first document: ties in key go by it, and its domain is the unit's home
    std::vector<size_t> docs;
  };
  std::vector<Unit> units;
  std::unordered_map<std::string, size_t> family_unit;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const auto& doc = corpus.docs[i];
    if (doc.repo_family.empty()) {
      units.push_back({xxh3_64(doc.text.data(), doc.text.size(), seed), i, {i}});
      continue;
    }
    const auto [it, added] = family_unit.emplace(doc.repo_family, units.size());
    if (added) units.push_back({xxh3_64(doc.repo_family.data(), doc.repo_family.size(), seed), i, {}});
    units[it->second].docs.push_back(i);
  }
  std::vector<std::vector<const Unit*>> by_domain(corpus.domains.size());
  for (const Unit& u : units) by_domain[corpus.docs[u.first].domain].push_back(&u);
  for (auto& list : by_domain) {
    if (list.size() < 2) continue;
    std::sort(list.begin(), list.end(), [](const Unit* a, const Unit* b) {
      return std::tie(a->key, a->first) < std::tie(b->key, b->first);
    });
    size_t docs = 0;
    for (const Unit* u : list) docs += u->docs.size();
    const auto target = static_cast<size_t>(std::ceil(valid_fraction * static_cast<double>(docs)));
    size_t taken = 0;
    for (size_t k = 0; k + 1 < list.size() && (k == 0 || taken < target); ++k) {
      for (size_t i : list[k]->docs) valid[i] = 1;
      taken += list[k]->docs.size();
    }
  }
  return valid;
}

}  // namespace forge::data
