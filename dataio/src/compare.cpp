#include "forge/dataio/compare.h"

#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

std::vector<uint64_t> unigram(const std::string& dir, const Manifest& m) {
  std::vector<uint64_t> counts(m.vocab_size);
  for (const auto& s : m.shards) {
    const ShardData data = read_shard((fs::path(dir) / s.file).string());
    for (uint32_t t : data.tokens)
      if (t < counts.size()) ++counts[t];
  }
  return counts;
}

std::map<std::string, double> domain_shares(const Manifest& m) {
  std::map<std::string, double> shares;
  double total = 0;
  for (const auto& s : m.shards) {
    shares[s.domain] += static_cast<double>(s.tokens);
    total += static_cast<double>(s.tokens);
  }
  for (auto& [_, v] : shares) v = total > 0 ? v / total : 0;
  return shares;
}

// Token shares per language, from the shards' /doc_languages (empty for datasets without them).
std::map<std::string, double> language_shares(const std::string& dir, const Manifest& m) {
  std::map<std::string, double> shares;
  if (m.languages.empty()) return shares;
  double total = 0;
  for (const auto& s : m.shards) {
    const ShardData data = read_shard((fs::path(dir) / s.file).string());
    for (size_t i = 0; i < data.doc_languages.size(); ++i) {
      const auto n = static_cast<double>(data.doc_offsets[i + 1] - data.doc_offsets[i]);
      shares[m.languages.at(data.doc_languages[i])] += n;
      total += n;
    }
  }
  for (auto& [_, v] : shares) v = total > 0 ? v / total : 0;
  return shares;
}

// The keys of two maps, together, sorted.
template <typename Map>
std::set<std::string> keys_of(const Map& a, const Map& b) {
  std::set<std::string> keys;
  for (const auto& [k, _] : a) keys.insert(k);
  for (const auto& [k, _] : b) keys.insert(k);
  return keys;
}

// {key: {a, b, change}} over the union of keys, and the total variation distance.
std::pair<Json, double> share_shift(const std::map<std::string, double>& a,
                                    const std::map<std::string, double>& b) {
  Json out = Json::object();
  double tv = 0;
  for (const auto& k : keys_of(a, b)) {
    const double x = a.count(k) ? a.at(k) : 0, y = b.count(k) ? b.at(k) : 0;
    out[k] = {{"a", x}, {"b", y}, {"change", y - x}};
    tv += 0.5 * std::abs(y - x);
  }
  return {out, tv};
}

// Settings as dotted keys ("filters.min_words"); arrays are values, objects are descended into.
void flatten(const Json& j, const std::string& prefix, std::map<std::string, Json>& out) {
  if (!j.is_object()) {
    out[prefix] = j;
    return;
  }
  for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
}

// The prepare stage a settings section belongs to (quality.json's stage names).
std::string stage_of(const std::string& key) {
  const std::string section = key.substr(0, key.find('.'));
  if (section == "normalize_rules") return "normalize";
  if (section == "decontam" || section == "near_dedup" || section == "exact_dedup" || section == "filters" ||
      section == "pii" || section == "safety" || section == "language" || section == "repository" ||
      section == "license" || section == "ingest" || section == "tokenizer")
    return section;
  return "";  // split, shards, chat: no removal counts to attribute
}

Json load_quality(const std::string& dir) {
  const fs::path path = fs::path(dir) / "quality.json";
  if (!fs::exists(path)) return Json::object();
  try {
    return Json::parse(read_file(path.string()));
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: not valid JSON ({}); rerun prepare or remove it", path.string(), e.what());
  }
}

// Documents a stage removed, in total and per domain (from its documents_by_domain, else its counters).
struct Removals {
  uint64_t total = 0, in = 0;  // in: documents the stage was given
  std::map<std::string, int64_t> by_domain;
  std::map<std::string, uint64_t> by_reason;
};

Removals removals(const Json& stage) {
  Removals r;
  const Json removed = stage.value("removed", Json::object());
  const Json by_domain = stage.value("documents_by_domain", Json::object());
  for (const auto& [reason, n] : removed.items())
    if (n.is_number_unsigned()) {
      r.by_reason[reason] = n.get<uint64_t>();
      r.total += n.get<uint64_t>();
    }
  for (const auto& [domain, io] : by_domain.items()) {
    r.by_domain[domain] = io.at("in").get<int64_t>() - io.at("out").get<int64_t>();
    r.in += io.at("in").get<uint64_t>();
  }
  return r;
}

// Per stage: the settings that changed, what it removed in A and in B, and a sentence naming both.
Json stage_changes(const Json& qa, const Json& qb, const Json& changed, std::vector<std::string>& why) {
  const Json sa = qa.value("stages", Json::object()), sb = qb.value("stages", Json::object());
  // Pipeline order, then any stage this build does not know.
  std::vector<std::string> names = {"ingest",   "normalize",  "pii",         "safety",
                                    "language", "repository", "exact_dedup", "near_dedup",
                                    "filters",  "license",    "decontam"};
  for (const Json* q : {&sa, &sb})
    for (const auto& [k, _] : q->items())
      if (std::find(names.begin(), names.end(), k) == names.end()) names.push_back(k);
  Json out = Json::object();
  for (const auto& name : names) {
    const Removals ra = removals(sa.value(name, Json::object())),
                   rb = removals(sb.value(name, Json::object()));
    std::vector<std::string> settings;
    for (const auto& c : changed)
      if (c.at("stage") == name) settings.push_back(c.at("key"));
    if (ra.total == rb.total && ra.by_domain == rb.by_domain && ra.by_reason == rb.by_reason &&
        settings.empty())
      continue;
    Json st = {
        {"settings_changed", settings},
        {"removed", {{"a", ra.total}, {"b", rb.total}, {"change", int64_t(rb.total) - int64_t(ra.total)}}}};
    std::string per_domain;
    for (const auto& d : keys_of(ra.by_domain, rb.by_domain)) {
      const int64_t x = ra.by_domain.count(d) ? ra.by_domain.at(d) : 0,
                    y = rb.by_domain.count(d) ? rb.by_domain.at(d) : 0;
      st["removed_per_domain"][d] = {{"a", x}, {"b", y}, {"change", y - x}};
      if (y != x) per_domain += fmt::format("{}{} {:+}", per_domain.empty() ? "" : ", ", d, y - x);
    }
    std::string per_reason;
    for (const auto& k : keys_of(ra.by_reason, rb.by_reason)) {
      const uint64_t x = ra.by_reason.count(k) ? ra.by_reason.at(k) : 0,
                     y = rb.by_reason.count(k) ? rb.by_reason.at(k) : 0;
      if (x == y) continue;
      st["removed_by_reason"][k] = {{"a", x}, {"b", y}, {"change", int64_t(y) - int64_t(x)}};
      per_reason += fmt::format("{}{} {:+}", per_reason.empty() ? "" : ", ", k, int64_t(y) - int64_t(x));
    }
    st["documents_in"] = {{"a", ra.in}, {"b", rb.in}};
    out[name] = st;
    const int64_t delta = int64_t(rb.total) - int64_t(ra.total);
    // The causes: this stage's settings, and whatever earlier change altered what it was given.
    std::string cause;
    for (const auto& key : settings) cause += fmt::format("{}{}", cause.empty() ? "" : ", ", key);
    if (!cause.empty()) cause += " changed";
    if (ra.in != rb.in)
      cause +=
          fmt::format("{}its input changed ({} -> {} documents in)", cause.empty() ? "" : "; ", ra.in, rb.in);
    if (cause.empty()) cause = "no setting of this stage changed";
    why.push_back(fmt::format("{}: {}; removed {} -> {} documents ({}){}{}", name, cause, ra.total, rb.total,
                              delta == 0  ? "same"
                              : delta > 0 ? fmt::format("{} more", delta)
                                          : fmt::format("{} fewer", -delta),
                              per_reason.empty() ? "" : fmt::format(" by reason: {};", per_reason),
                              per_domain.empty() ? "" : fmt::format(" by domain: {}", per_domain)));
  }
  return out;
}

}  // namespace

double jensen_shannon(const std::vector<double>& p, const std::vector<double>& q) {
  double sp = 0, sq = 0;
  for (double v : p) sp += v;
  for (double v : q) sq += v;
  if (sp <= 0 || sq <= 0) return sp == sq ? 0.0 : 1.0;
  double js = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double a = p[i] / sp, b = q[i] / sq, mid = 0.5 * (a + b);
    if (a > 0) js += 0.5 * a * std::log2(a / mid);
    if (b > 0) js += 0.5 * b * std::log2(b / mid);
  }
  return std::max(0.0, std::min(1.0, js));
}

Json compare_datasets(const std::string& a, const std::string& b, double threshold) {
  const Manifest ma = load_manifest(a), mb = load_manifest(b);
  const auto [mix, tv] = share_shift(domain_shares(ma), domain_shares(mb));
  const auto [language_mix, language_tv] = share_shift(language_shares(a, ma), language_shares(b, mb));
  // What changed in the pipeline: every differing setting, named with its stage.
  std::map<std::string, Json> fa, fb;
  flatten(ma.settings, "", fa);
  flatten(mb.settings, "", fb);
  Json changed = Json::array();
  for (const auto& k : keys_of(fa, fb)) {
    const Json x = fa.count(k) ? fa.at(k) : Json(), y = fb.count(k) ? fb.at(k) : Json();
    if (x != y) changed.push_back({{"key", k}, {"a", x}, {"b", y}, {"stage", stage_of(k)}});
  }
  std::vector<std::string> why;
  const Json stages = stage_changes(load_quality(a), load_quality(b), changed, why);
  const auto ua = unigram(a, ma), ub = unigram(b, mb);
  std::vector<double> p, q;
  const bool same_tokenizer = ma.tokenizer_sha256 == mb.tokenizer_sha256;
  if (same_tokenizer) {
    p.assign(ua.begin(), ua.end());
    q.assign(ub.begin(), ub.end());
  } else {
    // Different vocabularies: compare distributions over piece strings instead of ids.
    const Tokenizer ta = Tokenizer::load((fs::path(a) / ma.tokenizer_file).string());
    const Tokenizer tb = Tokenizer::load((fs::path(b) / mb.tokenizer_file).string());
    std::map<std::string, std::pair<double, double>> by_piece;
    for (size_t i = 0; i < ua.size(); ++i)
      if (ua[i]) by_piece[ta.piece(static_cast<int>(i))].first += static_cast<double>(ua[i]);
    for (size_t i = 0; i < ub.size(); ++i)
      if (ub[i]) by_piece[tb.piece(static_cast<int>(i))].second += static_cast<double>(ub[i]);
    for (const auto& [_, v] : by_piece) {
      p.push_back(v.first);
      q.push_back(v.second);
    }
  }
  const double js = jensen_shannon(p, q);
  return {{"a", {{"dir", a}, {"version", ma.version}}},
          {"b", {{"dir", b}, {"version", mb.version}}},
          {"same_tokenizer", same_tokenizer},
          {"tokenizer",
           {{"a", {{"sha256", ma.tokenizer_sha256}, {"vocab_size", ma.vocab_size}}},
            {"b", {{"sha256", mb.tokenizer_sha256}, {"vocab_size", mb.vocab_size}}}}},
          {"settings_changed", changed},
          {"stages", stages},
          {"explanation", why},
          {"domain_mix", mix},
          {"domain_mix_total_variation", tv},
          {"language_mix", language_mix},
          {"language_mix_total_variation", language_tv},
          {"token_js_divergence", js},
          {"token_js_over", same_tokenizer ? "token ids" : "token pieces"},
          {"threshold", threshold},
          {"drift", js > threshold || tv > threshold || language_tv > threshold}};
}

std::string compare_summary(const Json& r) {
  std::string out;
  const auto line = [&](const std::string& s) { out += s + "\n"; };
  line(fmt::format("A {} ({})", r["a"]["dir"].get<std::string>(), r["a"]["version"].get<std::string>()));
  line(fmt::format("B {} ({})", r["b"]["dir"].get<std::string>(), r["b"]["version"].get<std::string>()));
  const auto& tok = r["tokenizer"];
  line(r["same_tokenizer"].get<bool>()
           ? fmt::format("tokenizer: same ({}, vocabulary {})",
                         tok["a"]["sha256"].get<std::string>().substr(0, 12),
                         tok["a"]["vocab_size"].get<uint32_t>())
           : fmt::format("tokenizer: CHANGED {} (vocabulary {}) -> {} (vocabulary {})",
                         tok["a"]["sha256"].get<std::string>().substr(0, 12),
                         tok["a"]["vocab_size"].get<uint32_t>(),
                         tok["b"]["sha256"].get<std::string>().substr(0, 12),
                         tok["b"]["vocab_size"].get<uint32_t>()));
  if (r["settings_changed"].empty()) line("settings: the same");
  for (const auto& c : r["settings_changed"])
    line(fmt::format(
        "setting {}{}: {} -> {}", c["key"].get<std::string>(),
        c["stage"].get<std::string>().empty() ? ""
                                              : fmt::format(" (stage {})", c["stage"].get<std::string>()),
        c["a"].is_null() ? "(absent)" : c["a"].dump(), c["b"].is_null() ? "(absent)" : c["b"].dump()));
  for (const auto& w : r["explanation"]) line("  " + w.get<std::string>());
  const auto shares = [&](const char* what, const Json& mix) {
    if (mix.empty()) return;
    line(fmt::format("{} (token share A -> B):", what));
    for (const auto& [k, v] : mix.items())
      line(fmt::format("  {:<12} {:6.2f}% -> {:6.2f}%  ({:+.2f} points)", k, 100 * v["a"].get<double>(),
                       100 * v["b"].get<double>(), 100 * v["change"].get<double>()));
  };
  shares("domain mix", r["domain_mix"]);
  shares("language mix", r["language_mix"]);
  line(fmt::format("domain mix total variation {:.4f}", r["domain_mix_total_variation"].get<double>()));
  if (!r["language_mix"].empty())
    line(fmt::format("language mix total variation {:.4f}", r["language_mix_total_variation"].get<double>()));
  line(fmt::format("token Jensen-Shannon divergence {:.4f} (over {})", r["token_js_divergence"].get<double>(),
                   r["token_js_over"].get<std::string>()));
  line(fmt::format("drift: {} (threshold {})", r["drift"].get<bool>() ? "YES" : "no",
                   r["threshold"].get<double>()));
  return out;
}

}  // namespace forge::data
