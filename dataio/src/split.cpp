#include "forge/dataio/split.h"

#include "distributed.h"
#include "forge/common/hash.h"
#include "wire.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>

namespace forge::data {
namespace {

// What the split needs of a document: its domain, and its family's name or its text's hash.
struct Item {
  uint16_t domain = 0;
  uint64_t key = 0;    // xxh3 of the text, for a document without a family
  std::string family;  // "" = none
};

std::vector<uint8_t> split_items(const std::vector<Item>& items, size_t domains, double valid_fraction,
                                 uint64_t seed) {
  std::vector<uint8_t> valid(items.size(), 0);
  // A unit goes to one side whole: a document, or every file of a repository family.
  struct Unit {
    uint64_t key;
    size_t first;  // its first document: ties in key go by it, and its domain is the unit's home
    std::vector<size_t> docs;
  };
  std::vector<Unit> units;
  std::unordered_map<std::string, size_t> family_unit;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    if (it.family.empty()) {
      units.push_back({it.key, i, {i}});
      continue;
    }
    const auto [f, added] = family_unit.emplace(it.family, units.size());
    if (added) units.push_back({xxh3_64(it.family.data(), it.family.size(), seed), i, {}});
    units[f->second].docs.push_back(i);
  }
  std::vector<std::vector<const Unit*>> by_domain(domains);
  for (const Unit& u : units) by_domain[items[u.first].domain].push_back(&u);
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

}  // namespace

std::vector<uint8_t> assign_valid_split(const Corpus& corpus, double valid_fraction, uint64_t seed,
                                        Ranks& ranks) {
  if (valid_fraction <= 0) return std::vector<uint8_t>(corpus.docs.size(), 0);
  const Placement at = place(ranks, corpus.docs.size());
  // Rank 0 decides for every document (O(documents) small records, not their text) and sends each rank its
  // documents' sides.
  Packer mine;
  for (const auto& doc : corpus.docs) {
    mine.put(doc.domain).put(std::string_view(doc.repo_family));
    if (doc.repo_family.empty()) mine.put(xxh3_64(doc.text.data(), doc.text.size(), seed));
  }
  std::vector<std::string> to_root(static_cast<size_t>(ranks.size()));
  to_root[0] = std::move(mine.bytes());
  const auto gathered = ranks.exchange(std::move(to_root));
  std::vector<std::string> sides(static_cast<size_t>(ranks.size()));
  if (ranks.rank() == 0) {
    std::vector<Item> items;
    items.reserve(at.total);
    for (const auto& block : gathered)
      for (Unpacker in(block); !in.done();) {
        Item& it = items.emplace_back();
        it.domain = in.get<uint16_t>();
        it.family = in.str();
        if (it.family.empty()) it.key = in.get<uint64_t>();
      }
    const std::vector<uint8_t> valid = split_items(items, corpus.domains.size(), valid_fraction, seed);
    for (size_t r = 0; r < sides.size(); ++r)
      sides[r].assign(valid.begin() + static_cast<ptrdiff_t>(at.starts[r]),
                      valid.begin() + static_cast<ptrdiff_t>(at.starts[r + 1]));
  }
  const std::string mine_sides = ranks.exchange(std::move(sides))[0];
  return {mine_sides.begin(), mine_sides.end()};
}

}  // namespace forge::data
