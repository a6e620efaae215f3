// The preference format: parsing every record shape, degenerate pairs, the pair text and its split, the
// final-reply mask, and `prepare --format preference` end to end on a small generated JSONL (pairs kept
// whole through dedup, decontamination, the split and the shards; truncation; bad input).
#include "chat_test_support.h"
#include "forge/common/error.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/ingest.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/normalize.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>

using namespace forge::data;
using namespace forge::test::chat;
namespace fs = std::filesystem;

namespace {

struct Pair {
  std::vector<ChatMessage> prompt;
  std::string chosen, rejected;
};

// Varied pairs: a system prompt, a multi-turn prompt holding an assistant turn, a plain string prompt, a
// long prompt with short replies (a cut at the median leaves it no reply), replies of all lengths.
std::vector<Pair> make_pairs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Pair> out;
  for (int i = 0; i < n; ++i) {
    Pair p;
    const int question = i % 7 == 3 ? 90 : 5 + static_cast<int>(rng() % 12);
    if (i % 4 == 0) p.prompt.push_back(msg(ChatRole::kSystem, "Be kind. " + words(rng, 4)));
    if (i % 4 == 1) {
      p.prompt.push_back(msg(ChatRole::kUser, words(rng, 6)));
      p.prompt.push_back(msg(ChatRole::kAssistant, "earlier answer " + words(rng, 8)));
    }
    p.prompt.push_back(msg(ChatRole::kUser, words(rng, question)));
    p.chosen = words(rng, 4 + static_cast<int>(rng() % (i % 7 == 3 ? 4 : 30)));
    p.rejected = words(rng, 4 + static_cast<int>(rng() % (i % 7 == 3 ? 4 : 30)));
    out.push_back(std::move(p));
  }
  return out;
}

const char* role_name(ChatRole r) {
  return r == ChatRole::kSystem ? "system" : r == ChatRole::kUser ? "user" : "assistant";
}

// One JSONL line, using every shape: a string prompt when the prompt is one user message (every other
// time), replies as a string, an assistant message or a list of one, by `shape`.
std::string pair_line(const Pair& p, int shape) {
  forge::Json rec;
  if (p.prompt.size() == 1 && p.prompt[0].role == ChatRole::kUser && shape % 2 == 0) {
    rec["prompt"] = p.prompt[0].content;
  } else {
    rec["prompt"] = forge::Json::array();
    for (const auto& m : p.prompt)
      rec["prompt"].push_back({{"role", role_name(m.role)}, {"content", m.content}});
  }
  const auto reply = [](const std::string& content, int s) -> forge::Json {
    const forge::Json m = {{"role", "assistant"}, {"content", content}};
    return s % 3 == 0 ? forge::Json(content) : s % 3 == 1 ? m : forge::Json::array({m});
  };
  rec["chosen"] = reply(p.chosen, shape);
  rec["rejected"] = reply(p.rejected, shape + 1);
  return rec.dump();
}

Pair cleaned(Pair p) {
  for (auto& m : p.prompt) {
    m.content = normalize_text(m.content);
    neutralize_markers(m.content);
  }
  for (std::string* r : {&p.chosen, &p.rejected}) {
    *r = normalize_text(*r);
    neutralize_markers(*r);
  }
  return p;
}

std::string render_half(const Pair& p, bool chosen) {
  std::vector<ChatMessage> conv = p.prompt;
  conv.push_back(msg(ChatRole::kAssistant, chosen ? p.chosen : p.rejected));
  return render_chat(conv);
}

struct PairCorpus {
  std::string path;
  std::vector<Pair> good;  // as written, distinct
  std::vector<int> bad_lines;
  size_t lines = 0;
  int contaminated = 5;  // the pair whose rejected reply the eval set holds
};

// 36 distinct pairs, 2 duplicates of them (one differing only in whitespace the cleaning removes), 4
// malformed lines, 7 degenerate pairs.
PairCorpus write_pair_corpus(const forge::test::TempDir& tmp) {
  PairCorpus c;
  c.good = make_pairs(36, 21);
  std::mt19937 rng(4);
  c.good[c.contaminated].rejected = words(rng, 30);
  c.good[9].chosen += " <|end|><|end|><|user|>fake turn";  // cannot fake the separator or a turn
  std::vector<std::string> lines;
  for (size_t i = 0; i < c.good.size(); ++i) lines.push_back(pair_line(c.good[i], static_cast<int>(i)));
  Pair dup8 = c.good[8];
  dup8.chosen += "  \n\n";
  lines.insert(lines.begin() + 20, pair_line(c.good[3], 3));  // exact duplicate
  lines.insert(lines.begin() + 30, pair_line(dup8, 1));       // the same after cleaning, another shape
  const std::vector<std::string> degenerate = {
      R"({"prompt": "q1", "chosen": "same", "rejected": "same"})",
      R"({"prompt": "q2", "chosen": "same  ", "rejected": {"role": "assistant", "content": "same"}})",
      R"({"prompt": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "a"}], "chosen": "x", "rejected": "y"})",
      R"({"prompt": "", "chosen": "x", "rejected": "y"})",
      R"({"prompt": [], "chosen": "x", "rejected": "y"})",
      R"({"prompt": "q4", "chosen": "x", "rejected": " \n "})",
      R"({"prompt": "q5", "chosen": [{"role": "assistant", "content": ""}], "rejected": "y"})",
  };
  const std::vector<std::string> bad = {
      R"({"prompt": "q", "chosen": "x")",
      R"({"prompt": "q", "chosen": "x"})",
      R"({"prompt": "q", "chosen": {"role": "user", "content": "x"}, "rejected": "y"})",
      R"({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "chosen": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "rejected": "y"})",
  };
  for (size_t k = 0; k < degenerate.size(); ++k) lines.insert(lines.begin() + 3 + 5 * k, degenerate[k]);
  std::string text;
  size_t b = 0;
  int line_no = 0;  // physical, as error messages count
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i % 11 == 6 && b < bad.size()) {
      text += bad[b++] + "\n";
      c.bad_lines.push_back(++line_no);
      ++c.lines;
    }
    if (i == 15) {
      text += "  \n";  // blank: not a record
      ++line_no;
    }
    text += lines[i] + "\n";
    ++line_no;
    ++c.lines;
  }
  REQUIRE(b == bad.size());
  c.path = tmp.write("pairs.jsonl", text);
  return c;
}

PrepareOptions pair_options(const std::string& input, const std::string& out) {
  PrepareOptions o;
  o.inputs = {{input, "pref"}};
  o.out = out;
  o.ingest.format = "preference";
  o.ingest.max_bad_lines = 0.2;
  o.tokenizer.vocab = 400;
  o.valid_fraction = 0.1;
  o.shard_tokens = 300;  // many shards, so the cut-after-a-rejected-half rule is exercised
  o.threads = 1;
  return o;
}

// The prompt side of a half: its tokens up to and including the final assistant marker.
std::vector<uint32_t> prompt_tokens(const Doc& d, uint32_t assistant) {
  const auto last = std::find(d.ids.rbegin(), d.ids.rend(), assistant);
  return {d.ids.begin(), last.base()};
}

uint64_t scored(const Doc& d) {
  return static_cast<uint64_t>(std::count(d.mask.begin(), d.mask.end(), 1));
}

}  // namespace

TEST_CASE("parse_preference_line reads every record shape") {
  PreferenceRecord r;
  REQUIRE(parse_preference_line(R"({"prompt": "Why?", "chosen": "Because.", "rejected": "No.",
      "domain": "qa", "license": "MIT", "source": "s1"})",
                                r) == "");
  REQUIRE(r.prompt.size() == 1);
  CHECK(r.prompt[0].role == ChatRole::kUser);
  CHECK(r.prompt[0].content == "Why?");
  CHECK(r.chosen == "Because.");
  CHECK(r.rejected == "No.");
  CHECK(r.domain == "qa");
  CHECK(r.license == "MIT");
  CHECK(r.source == "s1");

  REQUIRE(parse_preference_line(
              R"({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
      {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}],
      "chosen": {"role": "assistant", "content": "c"}, "rejected": [{"role": "assistant", "content": "r"}]})",
              r) == "");
  REQUIRE(r.prompt.size() == 4);
  CHECK(r.prompt[0].role == ChatRole::kSystem);
  CHECK(r.prompt[2].role == ChatRole::kAssistant);
  CHECK(r.prompt[3].content == "u2");
  CHECK(r.chosen == "c");
  CHECK(r.rejected == "r");
  CHECK(r.domain.empty());
  // Empty values parse: they are degenerate, not malformed.
  CHECK(parse_preference_line(
            R"({"prompt": [], "chosen": "", "rejected": [{"role": "assistant", "content": ""}]})", r) == "");
  CHECK(r.prompt.empty());
}

TEST_CASE("parse_preference_line names every malformed case") {
  PreferenceRecord r;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "q", "chosen": "x")", "not valid JSON"},
      {"", "not valid JSON"},
      {R"(["q", "x", "y"])", "not a JSON object"},
      {R"({"chosen": "x", "rejected": "y"})", "no \"prompt\""},
      {R"({"prompt": 7, "chosen": "x", "rejected": "y"})",
       "\"prompt\" is not a string or a list of messages"},
      {R"({"prompt": {"role": "user", "content": "q"}, "chosen": "x", "rejected": "y"})",
       "\"prompt\" is not a string or a list of messages"},
      {R"({"prompt": [{"role": "user", "content": "q"}, "x"], "chosen": "x", "rejected": "y"})",
       "prompt[1] is not an object"},
      {R"({"prompt": [{"content": "q"}], "chosen": "x", "rejected": "y"})",
       "prompt[0] has no string \"role\""},
      {R"({"prompt": [{"role": "user"}], "chosen": "x", "rejected": "y"})",
       "prompt[0] has no string \"content\""},
      {R"({"prompt": [{"role": "tool", "content": "q"}], "chosen": "x", "rejected": "y"})",
       "prompt[0] has unknown role \"tool\" (system, user or assistant)"},
      {R"({"prompt": "q", "rejected": "y"})", "no \"chosen\" reply"},
      {R"({"prompt": "q", "chosen": "x"})", "no \"rejected\" reply"},
      {R"({"prompt": "q", "chosen": 3, "rejected": "y"})",
       "\"chosen\" is not a string, an assistant message or a list of one"},
      {R"({"prompt": "q", "chosen": null, "rejected": "y"})",
       "\"chosen\" is not a string, an assistant message or a list of one"},
      {R"({"prompt": "q", "chosen": [], "rejected": "y"})",
       "\"chosen\" is a list of 0 messages (give only the assistant reply; the prompt goes in \"prompt\")"},
      {R"({"prompt": "q", "chosen": "x", "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "y"}]})",
       "\"rejected\" is a list of 2 messages (give only the assistant reply; the prompt goes in \"prompt\")"},
      {R"({"prompt": "q", "chosen": {"role": "user", "content": "x"}, "rejected": "y"})",
       "chosen has role \"user\" (a reply is an assistant message)"},
      {R"({"prompt": "q", "chosen": "x", "rejected": [{"role": "assistant"}]})",
       "rejected[0] has no string \"content\""},
      {R"({"prompt": "q", "chosen": "x", "rejected": ["y"]})", "rejected[0] is not an object"},
      {R"({"prompt": "q", "chosen": {"role": "critic", "content": "x"}, "rejected": "y"})",
       "chosen has unknown role \"critic\" (system, user or assistant)"},
  };
  for (const auto& [line, why] : cases) {
    INFO(line);
    CHECK(parse_preference_line(line, r) == why);
  }
}

TEST_CASE("degenerate pairs are named, in order") {
  const auto rec = [](std::vector<ChatMessage> prompt, std::string c, std::string r) {
    PreferenceRecord p;
    p.prompt = std::move(prompt);
    p.chosen = std::move(c);
    p.rejected = std::move(r);
    return p;
  };
  const auto q = msg(ChatRole::kUser, "q");
  CHECK(preference_degenerate_reason(rec({q}, "a", "b")) == "");
  CHECK(preference_degenerate_reason(rec({}, "a", "b")) == "empty_prompt");
  CHECK(preference_degenerate_reason(rec({msg(ChatRole::kSystem, ""), msg(ChatRole::kUser, "")}, "a", "b")) ==
        "empty_prompt");
  CHECK(preference_degenerate_reason(rec({q, msg(ChatRole::kAssistant, "a")}, "a", "b")) ==
        "prompt_ends_with_assistant");
  CHECK(preference_degenerate_reason(rec({q}, "", "b")) == "empty_chosen_reply");
  CHECK(preference_degenerate_reason(rec({q}, "a", "")) == "empty_rejected_reply");
  CHECK(preference_degenerate_reason(rec({q}, "", "")) == "empty_chosen_reply");
  CHECK(preference_degenerate_reason(rec({q}, "same", "same")) == "identical_replies");
  // An assistant turn inside the prompt, an empty one even, is context.
  CHECK(preference_degenerate_reason(rec({q, msg(ChatRole::kAssistant, ""), q}, "a", "b")) == "");
}

TEST_CASE("a pair is one text that cleaning keeps and that splits back into its two halves") {
  PreferenceRecord p;
  p.prompt = {msg(ChatRole::kSystem, "s"), msg(ChatRole::kUser, "u"), msg(ChatRole::kAssistant, "a"),
              msg(ChatRole::kUser, "u2")};
  p.chosen = "good";
  p.rejected = "bad";
  const std::string text = render_preference_pair(p);
  const std::string prompt = "<|system|>s<|end|><|user|>u<|end|><|assistant|>a<|end|><|user|>u2<|end|>";
  CHECK(text == prompt + "<|assistant|>good<|end|><|end|>" + prompt + "<|assistant|>bad<|end|>");
  CHECK(normalize_text(text) == text);
  const auto [chosen, rejected] = split_preference_pair(text, "t");
  CHECK(chosen == prompt + "<|assistant|>good<|end|>");
  CHECK(rejected == prompt + "<|assistant|>bad<|end|>");

  // Content trying to end the half early is neutralized first (as ingest does), so the split still finds
  // the real junction.
  p.chosen = "good<|end|><|end|><|user|>x";
  p.prompt[1].content = "u <|end|><|end|>";
  neutralize_markers(p.chosen);
  neutralize_markers(p.prompt[1].content);
  const std::string hostile = render_preference_pair(p);
  const auto [c2, r2] = split_preference_pair(hostile, "t");
  CHECK(c2.size() + r2.size() + kPairSeparator.size() == hostile.size());
  CHECK(c2.ends_with("<|assistant|>good<| end|><| end|><| user|>x<|end|>"));
  CHECK(r2.ends_with("<|assistant|>bad<|end|>"));

  expect_error(forge::ExitCode::kData, [] { split_preference_pair("<|user|>q<|end|>", "src.jsonl:3"); },
               {"src.jsonl:3", "separator"});
}

TEST_CASE("the final-reply mask scores only the last assistant reply and its end of turn") {
  const ChatMarkerIds k{10, 11, 12, 13};
  const uint32_t eos = 2;
  // <|system|> s <|end|> <|user|> u <|end|> <|assistant|> a a <|end|> <|user|> u <|end|>
  // <|assistant|> r r <|end|> </s>
  const std::vector<uint32_t> ids = {10, 50, 13, 11, 52, 13, 12, 53, 54, 13, 11, 55, 13, 12, 56, 57, 13, eos};
  std::vector<uint8_t> mask;
  final_reply_loss_mask(ids, k, mask);
  CHECK(mask == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0});
  chat_loss_mask(ids, k, mask);  // the chat rule would score the earlier turn too
  CHECK(mask == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0});
  final_reply_loss_mask(std::vector<uint32_t>{11, 52, 13, 12, 56}, k, mask);  // cut inside the reply
  CHECK(mask == std::vector<uint8_t>{0, 0, 0, 0, 1});
  final_reply_loss_mask(std::vector<uint32_t>{11, 52, 13}, k, mask);  // no assistant marker at all
  CHECK(mask == std::vector<uint8_t>{0, 0, 0});
}

TEST_CASE("prepare --format preference keeps pairs whole and scores each half's final reply") {
  forge::test::TempDir tmp;
  const PairCorpus pc = write_pair_corpus(tmp);
  // The eval set holds the contaminated pair's rejected reply: the whole pair must go.
  const std::string eval = tmp.write("eval.txt", pc.good[pc.contaminated].rejected + "\n");
  PrepareOptions o = pair_options(pc.path, tmp / "ds");
  o.eval_sets = {eval};
  const PrepareResult r = prepare_dataset(o);
  INFO(r.summary);
  const Manifest m = load_manifest(o.out);
  CHECK(m.format == "preference");
  CHECK(m.settings["ingest"]["format"] == "preference");
  CHECK(m.settings["chat"]["template_sha256"] == chat_template_sha256());
  CHECK(m.settings["preference"] == preference_rules_json());
  CHECK(m.settings["filters"]["applied"] == false);
  verify_chat_masks(o.out);

  const forge::Json& q = r.quality.at("preference");
  const uint64_t want_pairs = pc.good.size() - 1;  // less the contaminated one; the 2 duplicates gone
  CHECK(q["pairs"] == want_pairs);
  CHECK(q["pairs_ingested"] == pc.good.size() + 2);
  CHECK(q["lines"] == pc.lines);
  CHECK(q["malformed_lines"]["count"] == 4);
  REQUIRE(q["malformed_lines"]["first"].size() == 4);
  for (size_t i = 0; i < 4; ++i)
    CHECK(q["malformed_lines"]["first"][i].get<std::string>().find(
              pc.path + ":" + std::to_string(pc.bad_lines[i]) + ": ") == 0);
  CHECK(q["degenerate"]["identical_replies"] == 2);
  CHECK(q["degenerate"]["prompt_ends_with_assistant"] == 1);
  CHECK(q["degenerate"]["empty_prompt"] == 2);
  CHECK(q["degenerate"]["empty_chosen_reply"] == 1);
  CHECK(q["degenerate"]["empty_rejected_reply"] == 1);
  CHECK(q["markers_neutralized"] == 3);
  CHECK(r.quality["stages"]["exact_dedup"]["removed"]["exact_duplicate"] == 2);
  CHECK(r.quality["stages"]["decontam"]["removed"]["contaminated"] == 1);
  CHECK(r.quality["stages"]["filters"].contains("skipped"));
  CHECK(r.summary.find("preference (forge-chat-1): " + std::to_string(want_pairs) + " pairs") !=
        std::string::npos);

  // Every shard holds whole pairs; there are several shards per split, so the cut rule was exercised.
  size_t train_shards = 0;
  for (const auto& e : m.shards) {
    CHECK(e.documents % 2 == 0);
    train_shards += e.split == "train";
  }
  CHECK(train_shards > 3);

  const Tokenizer tok = Tokenizer::load(o.out + "/tokenizer.model");
  const ChatMarkerIds markers = chat_marker_ids(tok, "t");
  std::map<std::string, std::pair<size_t, bool>> halves;  // rendered half -> (pair, chosen?)
  for (size_t i = 0; i < pc.good.size(); ++i) {
    const Pair p = cleaned(pc.good[i]);
    halves[render_half(p, true)] = {i, true};
    halves[render_half(p, false)] = {i, false};
  }
  const std::vector<Doc> docs = read_docs(o.out);
  REQUIRE(docs.size() == 2 * want_pairs);
  std::set<size_t> seen;
  uint64_t chosen_tokens = 0, rejected_tokens = 0, prompt = 0, chosen_longer = 0, all = 0, all_scored = 0;
  for (size_t k = 0; k < docs.size(); k += 2) {
    std::pair<size_t, bool> who[2];
    for (size_t h = 0; h < 2; ++h) {
      const Doc& d = docs[k + h];
      REQUIRE(d.ids.back() == static_cast<uint32_t>(tok.eos_id()));
      CHECK(d.mask.back() == 0);
      const size_t n = d.ids.size() - 1;
      const std::string text = decode(tok, std::span<const uint32_t>(d.ids.data(), n));
      REQUIRE(halves.count(text) == 1);
      who[h] = halves[text];
      const Pair p = cleaned(pc.good[who[h].first]);
      // Scored: the final reply and its end of turn only; the prompt's assistant turn is context.
      CHECK(decode_masked(tok, d, 1, n) == (h == 0 ? p.chosen : p.rejected) + "<|end|>");
      CHECK(decode_masked(tok, d, 0, n) == render_chat(p.prompt) + "<|assistant|>");
      all += d.ids.size();
      all_scored += scored(d);
    }
    // Chosen first, rejected second, of the same pair, on the same prompt tokens.
    CHECK(who[0].first == who[1].first);
    CHECK(who[0].second);
    CHECK_FALSE(who[1].second);
    CHECK(prompt_tokens(docs[k], markers.assistant) == prompt_tokens(docs[k + 1], markers.assistant));
    CHECK(seen.insert(who[0].first).second);  // each pair once: the duplicates went whole
    chosen_tokens += scored(docs[k]);
    rejected_tokens += scored(docs[k + 1]);
    chosen_longer += scored(docs[k]) > scored(docs[k + 1]);
    prompt += prompt_tokens(docs[k], markers.assistant).size();
  }
  CHECK(seen.count(static_cast<size_t>(pc.contaminated)) == 0);
  const double n = static_cast<double>(want_pairs);
  CHECK(q["tokens"] == all);
  CHECK(q["scored_tokens"] == all_scored);
  CHECK(q["scored_token_share"].get<double>() == Approx(double(all_scored) / double(all)));
  CHECK(q["mean_prompt_tokens"].get<double>() == Approx(double(prompt) / n));
  CHECK(q["mean_chosen_response_tokens"].get<double>() == Approx(double(chosen_tokens) / n));
  CHECK(q["mean_rejected_response_tokens"].get<double>() == Approx(double(rejected_tokens) / n));
  CHECK(q["length_bias"]["chosen_longer_share"].get<double>() == Approx(double(chosen_longer) / n));
  CHECK(chosen_longer > 0);
  CHECK(chosen_longer < want_pairs);
}

TEST_CASE("verify rejects a preference shard with a broken pair") {
  forge::test::TempDir tmp;
  const PairCorpus pc = write_pair_corpus(tmp);
  const std::string dir = tmp / "ds";
  prepare_dataset(pair_options(pc.path, dir));
  const Manifest m = load_manifest(dir);
  const std::string shard = dir + "/" + m.shards.front().file;
  const ShardData good = read_shard(shard);
  const ShardAttrs attrs = read_shard_layout(shard).attrs;
  REQUIRE(good.documents() >= 2);

  ShardData bad = good;  // the chosen half also scores its prompt's first token
  bad.loss_mask[0] = 1;
  write_shard(shard, bad, attrs, m.token_bytes);
  expect_error(forge::ExitCode::kData, [&] { verify_chat_masks(dir); },
               {shard, "pair 0", "final-reply rule"});

  bad = good;  // the last rejected half is gone
  bad.doc_offsets.pop_back();
  bad.doc_domains.pop_back();
  bad.doc_licenses.pop_back();
  bad.doc_languages.pop_back();
  bad.tokens.resize(bad.doc_offsets.back());
  bad.loss_mask.resize(bad.doc_offsets.back());
  write_shard(shard, bad, attrs, m.token_bytes);
  expect_error(forge::ExitCode::kData, [&] { verify_chat_masks(dir); }, {shard, "whole pairs"});

  write_shard(shard, good, attrs, m.token_bytes);
  verify_chat_masks(dir);
}

TEST_CASE("--max-tokens applies to each half: drop removes a pair with a long half, truncate cuts") {
  forge::test::TempDir tmp;
  const PairCorpus pc = write_pair_corpus(tmp);
  prepare_dataset(pair_options(pc.path, tmp / "full"));
  const std::vector<Doc> full = read_docs(tmp / "full");
  std::vector<size_t> lengths;
  for (const auto& d : full) lengths.push_back(d.ids.size());
  std::sort(lengths.begin(), lengths.end());
  const uint64_t limit = lengths[lengths.size() / 2];
  uint64_t pairs_long = 0, pairs_unscored = 0, halves_cut = 0;
  for (size_t k = 0; k < full.size(); k += 2) {
    bool any_long = false, any_unscored = false;
    uint64_t cut = 0;
    for (size_t h = 0; h < 2; ++h) {
      const Doc& d = full[k + h];
      if (d.ids.size() <= limit) continue;
      any_long = true;
      ++cut;
      any_unscored |=
          std::count(d.mask.begin(), d.mask.begin() + static_cast<std::ptrdiff_t>(limit - 1), 1) == 0;
    }
    pairs_long += any_long;
    pairs_unscored += any_unscored;
    if (!any_unscored) halves_cut += cut;
  }
  const uint64_t pairs = full.size() / 2;
  REQUIRE(pairs_long > 5);
  REQUIRE(pairs_unscored > 0);  // the long-prompt pairs
  REQUIRE(halves_cut > 0);

  PrepareOptions o = pair_options(pc.path, tmp / "drop");
  o.tokenizer_model = tmp / "full/tokenizer.model";
  o.chat.max_tokens = limit;
  o.chat.drop_long = true;
  const PrepareResult dropped = prepare_dataset(o);
  const forge::Json& dq = dropped.quality["preference"];
  CHECK(dq["truncation"]["dropped_too_long"] == pairs_long);
  CHECK(dq["truncation"]["truncated"] == 0);
  CHECK(dq["pairs"] == pairs - pairs_long);
  verify_chat_masks(tmp / "drop");
  const std::vector<Doc> kept = read_docs(tmp / "drop");
  CHECK(kept.size() == 2 * (pairs - pairs_long));
  for (const auto& d : kept) CHECK(d.ids.size() <= limit);

  o.out = tmp / "cut";
  o.chat.drop_long = false;
  const PrepareResult cut = prepare_dataset(o);
  const forge::Json& cq = cut.quality["preference"];
  CHECK(cq["truncation"]["truncated"] == halves_cut);
  CHECK(cq["truncation"]["dropped_no_scored_token_after_cut"] == pairs_unscored);
  CHECK(cq["truncation"]["dropped_too_long"] == 0);
  CHECK(cq["pairs"] == pairs - pairs_unscored);
  verify_chat_masks(tmp / "cut");  // every cut half still scores exactly its (partial) final reply
  const std::vector<Doc> cut_docs = read_docs(tmp / "cut");
  REQUIRE(cut_docs.size() == 2 * (pairs - pairs_unscored));
  uint64_t at_limit = 0;
  for (const auto& d : cut_docs) {
    CHECK(d.ids.size() <= limit);
    CHECK(d.ids.back() == full.front().ids.back());  // end-of-sequence
    CHECK(d.mask.back() == 0);
    CHECK(scored(d) > 0);
    at_limit += d.ids.size() == limit;
  }
  CHECK(at_limit >= halves_cut);
}

TEST_CASE("prepare --format preference: bad lines above the limit exit 65, a tokenizer without markers 64") {
  forge::test::TempDir tmp;
  const PairCorpus pc = write_pair_corpus(tmp);
  PrepareOptions o = pair_options(pc.path, tmp / "ds");
  o.ingest.max_bad_lines = 0.05;  // 4 of 50 lines is 8%
  expect_error(forge::ExitCode::kData, [&] { prepare_dataset(o); },
               {"4 of " + std::to_string(pc.lines) + " preference lines",
                ":" + std::to_string(pc.bad_lines[0]) + ":", "--max-bad-lines", "nothing written"});
  CHECK_FALSE(fs::exists(tmp / "ds"));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    CHECK(e.path().filename().string().find("partial") == std::string::npos);

  const std::string only_degenerate =
      tmp.write("degenerate.jsonl", "{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"a\"}\n");
  expect_error(forge::ExitCode::kData, [&] { prepare_dataset(pair_options(only_degenerate, tmp / "ds2")); },
               {"no usable pair", "identical_replies"});
  CHECK_FALSE(fs::exists(tmp / "ds2"));

  o = pair_options(pc.path, tmp / "ds3");
  o.tokenizer_model = model_without_markers(tmp);
  expect_error(forge::ExitCode::kUsage, [&] { prepare_dataset(o); }, {o.tokenizer_model, "<|system|>"});
  CHECK_FALSE(fs::exists(tmp / "ds3"));
}

// Forge's template in Jinja form (what `forge-ckpt export --format hf` writes) through --chat-template: each
// half is the final reply of its conversation, so the pairs must be exactly the built-in path's.
TEST_CASE("forge's template in Jinja form gives the built-in path's pairs, ids and masks") {
  forge::test::TempDir tmp;
  const PairCorpus pc = write_pair_corpus(tmp);
  prepare_dataset(pair_options(pc.path, tmp / "trained"));
  tmp.write("forge-export/tokenizer_config.json",
            forge::Json{{"chat_template", chat_template_jinja()}}.dump());
  std::vector<size_t> lengths;
  for (const Doc& d : read_docs(tmp / "trained")) lengths.push_back(d.ids.size());
  std::sort(lengths.begin(), lengths.end());
  for (const uint64_t max_tokens : {uint64_t{0}, uint64_t{lengths[lengths.size() / 2]}}) {
    INFO("max_tokens " << max_tokens);
    const std::string tag = std::to_string(max_tokens);
    PrepareOptions builtin = pair_options(pc.path, tmp / ("builtin" + tag));
    builtin.tokenizer_model = tmp / "trained/tokenizer.model";
    builtin.chat.max_tokens = max_tokens;
    PrepareOptions jinja = builtin;
    jinja.out = tmp / ("jinja" + tag);
    jinja.chat_template = tmp / "forge-export/tokenizer_config.json";
    jinja.threads = 3;
    const PrepareResult b = prepare_dataset(builtin);
    const PrepareResult j = prepare_dataset(jinja);
    verify_chat_masks(jinja.out);
    check_same_documents(builtin.out, jinja.out);
    const Manifest mb = load_manifest(builtin.out), mj = load_manifest(jinja.out);
    CHECK(j.quality["preference"]["truncation"] == b.quality["preference"]["truncation"]);
    CHECK(j.quality["preference"]["length_bias"] == b.quality["preference"]["length_bias"]);
    CHECK(mj.version != mb.version);
    CHECK(mj.settings["chat"]["template"]["kind"] == "model");
  }
}
