#include "distributed.h"

#include "wire.h"

#include <algorithm>
#include <map>
#include <set>

namespace forge::data {
namespace {

// Keys whose values are settings or plans, the same on every rank: taken once, never added up.
const std::set<std::string>& setting_keys() {
  static const std::set<std::string> keys = {
      "ngram",     "bands", "rows",       "hashes",  "eval_ngrams",   "entries",        "vocab_size",
      "threshold", "rules", "method",     "banding", "hash",          "fork_threshold", "token_dtype",
      "list",      "score", "identifier", "action",  "encode_threads"};
  return keys;
}

Json merge_values(const std::string& key, const std::vector<const Json*>& v) {
  const Json& first = *v.front();
  if (first.is_object()) {
    std::vector<std::string> keys;  // in first-seen order, as one process would have written them
    for (const Json* j : v)
      if (j->is_object())
        for (const auto& [k, _] : j->items())
          if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    Json out = Json::object();
    for (const auto& k : keys) {
      std::vector<const Json*> sub;
      for (const Json* j : v)
        if (j->is_object() && j->contains(k)) sub.push_back(&j->at(k));
      out[k] = merge_values(k, sub);
    }
    return out;
  }
  const bool same = std::all_of(v.begin(), v.end(), [&](const Json* j) { return *j == first; });
  if (setting_keys().count(key) || first.is_boolean()) return first;
  if (first.is_string()) {
    for (const Json* j : v)
      if (j->is_string() && !j->get<std::string>().empty()) return *j;  // the first rank that has one
    return first;
  }
  if (first.is_array()) {
    if (same) return first;
    if (key == "top_entries") {  // safety: matches per list entry, added up, most first
      std::map<std::pair<int64_t, std::string>, uint64_t> hits;
      for (const Json* j : v)
        for (const auto& e : *j)
          hits[{e.at("line").get<int64_t>(), e.at("entry")}] += e.at("matches").get<uint64_t>();
      std::vector<std::pair<uint64_t, std::pair<int64_t, std::string>>> order;
      for (const auto& [entry, n] : hits) order.emplace_back(n, entry);
      std::stable_sort(order.begin(), order.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      Json out = Json::array();
      for (size_t k = 0; k < std::min<size_t>(10, order.size()); ++k)
        out.push_back({{"entry", order[k].second.second},
                       {"line", order[k].second.first},
                       {"matches", order[k].first}});
      return out;
    }
    Json out = Json::array();  // examples: each rank's first ones, in rank (= input) order
    for (const Json* j : v)
      for (const auto& e : *j)
        if (out.size() < 5) out.push_back(e);
    return out;
  }
  if (!first.is_number()) return first;
  const bool largest = key.starts_with("max_") || key.starts_with("largest") || key == "seconds" ||
                       (key.find("seconds") != std::string::npos && key.find("cpu") == std::string::npos);
  if (first.is_number_float() || largest) {
    if (largest) {
      double m = first.get<double>();
      for (const Json* j : v) m = std::max(m, j->get<double>());
      return first.is_number_float() ? Json(m) : Json(static_cast<uint64_t>(m));
    }
    if (key.find("cpu_seconds") != std::string::npos) {
      double s = 0;
      for (const Json* j : v) s += j->get<double>();
      return s;
    }
    return first;  // a ratio: recomputed from the merged counts below where it matters
  }
  if (first.is_number_unsigned()) {
    uint64_t s = 0;
    for (const Json* j : v) s += j->get<uint64_t>();
    return s;
  }
  int64_t s = 0;
  for (const Json* j : v) s += j->get<int64_t>();
  return s;
}

// The ratios of a merged report that depend on its counts.
void recompute_rates(Json& j) {
  if (!j.is_object()) return;
  for (auto& [_, v] : j.items()) recompute_rates(v);
  if (j.contains("rate") && j.contains("removed") && j.contains("documents") && j["removed"].is_number())
    j["rate"] =
        j["documents"].get<double>() > 0 ? j["removed"].get<double>() / j["documents"].get<double>() : 0.0;
  if (j.contains("duplicate_rate") && j.contains("documents_in") && j.contains("removed")) {
    double removed = 0;
    for (const auto& [_, n] : j["removed"].items()) removed += n.get<double>();
    j["duplicate_rate"] =
        j["documents_in"].get<double>() > 0 ? removed / j["documents_in"].get<double>() : 0.0;
  }
}

}  // namespace

int Placement::rank_of(uint64_t global) const {
  const auto it = std::upper_bound(starts.begin(), starts.end(), global);
  return static_cast<int>(it - starts.begin()) - 1;
}

Placement place(Ranks& ranks, uint64_t local) {
  Placement p;
  const auto all = ranks.all_gather(std::string(reinterpret_cast<const char*>(&local), sizeof local));
  p.starts.push_back(0);
  for (const auto& b : all) p.starts.push_back(p.starts.back() + Unpacker(b).get<uint64_t>());
  p.first = p.starts[static_cast<size_t>(ranks.rank())];
  p.total = p.starts.back();
  return p;
}

std::vector<std::string> sources_of(Ranks& ranks, const Corpus& corpus, const Placement& at,
                                    const std::vector<uint64_t>& wanted) {
  Outbox ask(ranks.size());
  for (uint64_t g : wanted) ask.to[static_cast<size_t>(at.rank_of(g))].put(g);
  const auto asked = ranks.exchange(ask.blocks());
  Outbox answer(ranks.size());
  for (size_t r = 0; r < asked.size(); ++r)
    for (Unpacker in(asked[r]); !in.done();)
      answer.to[r].put(std::string_view(corpus.docs.at(in.get<uint64_t>() - at.first).source));
  const auto answered = ranks.exchange(answer.blocks());
  std::vector<Unpacker> from(answered.begin(), answered.end());
  std::vector<std::string> out;
  for (uint64_t g : wanted) out.push_back(from[static_cast<size_t>(at.rank_of(g))].str());
  return out;
}

Json merge_reports(const std::vector<Json>& parts) {
  std::vector<const Json*> v;
  for (const auto& p : parts) v.push_back(&p);
  Json out = merge_values("", v);
  recompute_rates(out);
  return out;
}

Json merged(Ranks& ranks, const Json& local) {
  if (ranks.size() == 1) return local;
  std::vector<Json> parts;
  for (const auto& b : ranks.all_gather(local.dump())) parts.push_back(Json::parse(b));
  return merge_reports(parts);
}

}  // namespace forge::data
