#include "forge/dataio/compare.h"

#include "forge/dataio/manifest.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"

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
  const auto sa = domain_shares(ma), sb = domain_shares(mb);
  std::set<std::string> domains;
  for (const auto& [d, _] : sa) domains.insert(d);
  for (const auto& [d, _] : sb) domains.insert(d);
  Json mix = Json::object();
  double tv = 0;
  for (const auto& d : domains) {
    const double x = sa.count(d) ? sa.at(d) : 0, y = sb.count(d) ? sb.at(d) : 0;
    mix[d] = {{"a", x}, {"b", y}, {"change", y - x}};
    tv += 0.5 * std::abs(y - x);
  }
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
          {"domain_mix", mix},
          {"domain_mix_total_variation", tv},
          {"token_js_divergence", js},
          {"token_js_over", same_tokenizer ? "token ids" : "token pieces"},
          {"threshold", threshold},
          {"drift", js > threshold || tv > threshold}};
}

}  // namespace forge::data
