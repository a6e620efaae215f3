#include "report.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

namespace forge::data {

Json token_distribution(const std::vector<uint64_t>& unigram, const Tokenizer* tokenizer, size_t top) {
  const double total = static_cast<double>(std::accumulate(unigram.begin(), unigram.end(), uint64_t{0}));
  double entropy = 0;
  size_t used = 0;
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t id = 0; id < unigram.size(); ++id) {
    if (unigram[id] == 0) continue;
    ++used;
    const double p = unigram[id] / total;
    entropy -= p * std::log2(p);
    order.emplace_back(unigram[id], id);
  }
  std::sort(order.begin(), order.end(),
            [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  Json tops = Json::array();
  for (size_t i = 0; i < std::min(top, order.size()); ++i) {
    Json t = {{"id", order[i].second}, {"count", order[i].first}, {"share", order[i].first / total}};
    if (tokenizer) t["piece"] = tokenizer->piece(static_cast<int>(order[i].second));
    tops.push_back(t);
  }
  return {{"tokens", static_cast<uint64_t>(total)},
          {"unigram_entropy_bits", entropy},
          {"distinct_tokens", used},
          {"top_tokens", tops}};
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

std::string quality_summary(const Json& q) {
  std::string out;
  const auto line = [&](const std::string& s) { out += s + "\n"; };
  const Json& s = q.at("summary");
  line(fmt::format("dataset {}  version {}", q.value("dataset", ""), s.value("version", "")));
  line(fmt::format("documents: {} in -> {} out;  bytes in {:.1f} MB;  tokens out {}",
                   s.at("documents_in").get<uint64_t>(), s.at("documents_out").get<uint64_t>(),
                   s.at("bytes_in").get<uint64_t>() / 1e6, s.at("tokens_out").get<uint64_t>()));
  line("removed per stage:");
  for (const auto& stage :
       {"ingest", "normalize", "pii", "safety", "language", "repository", "exact_dedup", "near_dedup",
        "image_dedup", "filters", "license", "decontam", "image_decontam"}) {
    if (!q.at("stages").contains(stage)) continue;
    const Json& st = q.at("stages").at(stage);
    std::string parts;
    const Json removed = st.value("removed", Json::object());
    for (const auto& [name, n] : removed.items())
      if (n.get<uint64_t>() > 0) parts += fmt::format(" {}={}", name, n.get<uint64_t>());
    const double secs = st.value("seconds", 0.0);
    line(fmt::format("  {:<14}{}{}", stage, parts.empty() ? " -" : parts,
                     secs > 0 ? fmt::format("  ({:.2f}s)", secs) : std::string()));
  }
  if (q.at("stages").contains("pii")) {
    const Json& pii = q["stages"]["pii"];
    std::string found;
    for (const auto& [type, n] : pii.at("found").items())
      found += fmt::format(" {}={}", type, n.get<uint64_t>());
    line(fmt::format("pii ({}):{}; documents {} {}", pii.value("action", ""), found,
                     pii.value("action", "") == "drop" ? "removed" : "redacted",
                     pii.value("action", "") == "drop" ? pii["removed"].value("pii_drop", uint64_t{0})
                                                       : pii.value("documents_redacted", uint64_t{0})));
  }
  if (q.at("stages").contains("exact_dedup") && !q["stages"]["exact_dedup"].contains("skipped"))
    line(fmt::format(
        "duplicate rate: exact {:.1f}%, near {:.1f}%",
        100 * q["stages"]["exact_dedup"].value("duplicate_rate", 0.0),
        100 * (q["stages"].contains("near_dedup") ? q["stages"]["near_dedup"].value("duplicate_rate", 0.0)
                                                  : 0.0)));
  if (const Json r = q.at("stages").value("repository", Json::object()); r.contains("repositories"))
    line(fmt::format(
        "repositories: {} ({} files): {} whole duplicates, {} forks, {} families; {} files licensed "
        "from a license file",
        r.at("repositories").get<uint64_t>(), r.at("files_with_repository").get<uint64_t>(),
        r.at("duplicate_repositories").get<uint64_t>(), r.at("forks").get<uint64_t>(),
        r.at("families").get<uint64_t>(), r.at("licensed_from_repository_file").get<uint64_t>()));
  if (s.contains("languages") && !s.at("languages").empty()) {
    std::vector<std::pair<double, std::string>> shares;
    for (const auto& [code, l] : s.at("languages").items()) shares.emplace_back(l.at("token_share"), code);
    std::sort(shares.rbegin(), shares.rend());
    std::string parts;
    for (size_t i = 0; i < shares.size() && i < 8; ++i)
      parts += fmt::format(" {} {:.1f}%", shares[i].second, 100 * shares[i].first);
    line(fmt::format("languages (token share):{}{}", parts, shares.size() > 8 ? " ..." : ""));
  }
  line("domain mix (train+valid):");
  for (const auto& [name, d] : s.at("domains").items())
    line(fmt::format("  {:<12} {:>8} docs ({:5.1f}%)  {:>10} tokens ({:5.1f}%)  valid {} docs", name,
                     d.at("documents").get<uint64_t>(), 100 * d.at("document_share").get<double>(),
                     d.at("tokens").get<uint64_t>(), 100 * d.at("token_share").get<double>(),
                     d.at("valid_documents").get<uint64_t>()));
  if (const Json d = q.at("stages").value("image_dedup", Json::object()); d.contains("removed")) {
    const Json& im = q.at("image-text").at("images");
    std::string bad, dropped;
    for (const auto& [reason, n] : im.at("bad").items())
      if (n.get<uint64_t>() > 0) bad += fmt::format(" {}={}", reason, n.get<uint64_t>());
    for (const auto& [reason, n] : im.at("dropped").items())
      if (n.get<uint64_t>() > 0) dropped += fmt::format(" {}={}", reason, n.get<uint64_t>());
    line(fmt::format(
        "pictures: {} decoded ({:.0f} per CPU-second); bad:{}; dropped:{}; duplicate rate (text with "
        "pictures) {:.1f}%, {} repeated pictures",
        im.at("images").get<uint64_t>(), im.at("images_per_cpu_s").get<double>(), bad.empty() ? " none" : bad,
        dropped.empty() ? " none" : dropped, 100 * d.value("duplicate_rate", 0.0),
        d.value("repeated_pictures", uint64_t{0})));
  }
  // Chat, preference and image-text share the ingest and truncation lines; their token figures differ.
  for (const char* format : {"chat", "preference", "image-text"}) {
    if (!q.contains(format)) continue;
    const bool pairs = std::string_view(format) == "preference";
    const Json& c = q[format];
    const Json& bad = c.at("malformed_lines");
    const Json& tr = c.at("truncation");
    std::string degenerate;
    for (const auto& [reason, n] : c.at("degenerate").items())
      degenerate += fmt::format(" {}={}", reason, n.get<uint64_t>());
    line(fmt::format(
        "{} ({}): {} {} from {} lines; malformed {} ({:.2f}%); degenerate{}; markers neutralized {}", format,
        c.value("template", ""), c.at(pairs ? "pairs" : "conversations").get<uint64_t>(),
        pairs ? "pairs" : "conversations", c.at("lines").get<uint64_t>(), bad.at("count").get<uint64_t>(),
        100 * bad.at("fraction").get<double>(), degenerate, c.at("markers_neutralized").get<uint64_t>()));
    if (!bad.at("first").empty()) line("  first malformed: " + bad["first"][0].get<std::string>());
    line(
        fmt::format("  truncation ({}, max {} tokens{}, 0 = none): {} {}cut, {} {}dropped as too long, {} {}"
                    "dropped with no scored token left",
                    tr.at("policy").get<std::string>(), tr.at("max_tokens").get<uint64_t>(),
                    pairs ? " per half" : "", tr.at("truncated").get<uint64_t>(), pairs ? "halves " : "",
                    tr.at("dropped_too_long").get<uint64_t>(), pairs ? "pairs " : "",
                    tr.at("dropped_no_scored_token_after_cut").get<uint64_t>(), pairs ? "pairs " : ""));
    if (pairs) {
      const Json& bias = c.at("length_bias");
      line(fmt::format(
          "  per pair: {:.1f} prompt tokens, {:.1f} chosen and {:.1f} rejected response tokens; "
          "chosen longer in {:.1f}%, rejected longer in {:.1f}%; {:.1f}% of tokens scored; quality "
          "filters not run",
          c.at("mean_prompt_tokens").get<double>(), c.at("mean_chosen_response_tokens").get<double>(),
          c.at("mean_rejected_response_tokens").get<double>(),
          100 * bias.at("chosen_longer_share").get<double>(),
          100 * bias.at("rejected_longer_share").get<double>(),
          100 * c.at("scored_token_share").get<double>()));
    } else {
      line(fmt::format(
          "  per conversation: {:.1f} tokens, {:.1f} prompt, {:.1f} response; {:.1f}% of tokens "
          "scored; quality filters not run on chat",
          c.at("mean_tokens_per_conversation").get<double>(), c.at("mean_prompt_tokens").get<double>(),
          c.at("mean_response_tokens").get<double>(), 100 * c.at("scored_token_share").get<double>()));
    }
  }
  const Json& dist = s.at("token_distribution");
  std::string tops;
  for (size_t i = 0; i < std::min<size_t>(8, dist.at("top_tokens").size()); ++i) {
    const Json& t = dist["top_tokens"][i];
    tops += fmt::format(" {}({:.1f}%)", Json(t.value("piece", std::to_string(t.at("id").get<int>()))).dump(),
                        100 * t.at("share").get<double>());
  }
  line(fmt::format("tokens: unigram entropy {:.2f} bits, {} distinct; top:{}",
                   dist.at("unigram_entropy_bits").get<double>(), dist.at("distinct_tokens").get<uint64_t>(),
                   tops));
  line(fmt::format(
      "throughput: {:.1f} MB/s end to end excluding tokenizer training ({:.1f} MB per CPU-second); peak "
      "memory {:.0f} MB",
      s.value("mb_per_s_excluding_tokenizer_training", 0.0),
      s.value("mb_per_cpu_s_excluding_tokenizer_training", 0.0), s.value("peak_rss_bytes", 0) / 1e6));
  return out;
}

}  // namespace forge::data
