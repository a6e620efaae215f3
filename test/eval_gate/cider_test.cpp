#include "forge/eval_gate/cider.h"

#include <catch2/catch.hpp>

#include <sstream>

using namespace forge::gate;

namespace {

// Words split at spaces and nothing else, case kept: the COCO scorer's input when the text comes
// tokenized.
Words split(const std::string& text) {
  Words out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<double> scores(const std::vector<std::string>& candidates,
                           const std::vector<std::vector<std::string>>& references) {
  std::vector<std::vector<Words>> corpus;
  for (const auto& refs : references) {
    corpus.emplace_back();
    for (const auto& r : refs) corpus.back().push_back(split(r));
  }
  const CiderD cider(corpus);
  std::vector<double> out;
  for (size_t i = 0; i < candidates.size(); ++i) out.push_back(cider.score(split(candidates[i]), corpus[i]));
  return out;
}

}  // namespace

TEST_CASE("CIDEr-D: the published value of SummEval's test set (COCO caption scorer)", "[gate][cider]") {
  // Yale-LILY/SummEval, evaluation/summ_eval/test_util.py (CANDS, REFS) and tests/test_cider.py: the COCO
  // CIDEr-D of these three candidates, one reference each, tokenized as given, is 2.5759014911864084.
  const std::vector<std::string> candidates = {
      "28-year-old chef found dead in San Francisco mall",
      "A 28-year-old chef who recently moved to San Francisco was found dead in the staircase of a local "
      "shopping center.",
      "The victim's brother said he cannot imagine anyone who would want to harm him,\"Finally, it went "
      "uphill again at him.\""};
  const std::vector<std::vector<std::string>> references = {
      {"28-Year-Old Chef Found Dead at San Francisco Mall"},
      {"A 28-year-old chef who had recently moved to San Francisco was found dead in the stairwell of a "
       "local "
       "mall this week."},
      {"But the victim's brother says he can't think of anyone who would want to hurt him, saying, \"Things "
       "were finally going well for him.\""}};
  const std::vector<double> s = scores(candidates, references);
  REQUIRE(s.size() == 3);
  CHECK((s[0] + s[1] + s[2]) / 3 == Approx(2.5759014911864084).epsilon(1e-12));
}

TEST_CASE("CIDEr-D: a copy of a rare reference is 10, no shared n-gram 0, repeats are clipped, length costs",
          "[gate][cider]") {
  const std::vector<std::vector<std::string>> refs = {{"two red circles on the left"},
                                                      {"one blue square on the right"}};
  // Each n-gram of a copy is in one picture's references of two: idf log 2, cosine 1 for every n.
  auto s = scores({"two red circles on the left", "a green triangle"}, refs);
  CHECK(s[0] == Approx(10.0));
  CHECK(s[1] == 0.0);
  // "on the" is in both pictures' references: weight log 2 - log 2 = 0, so it adds nothing.
  CHECK(scores({"on the", "on the"}, refs) == std::vector<double>{0.0, 0.0});
  // Saying "red" four times does not beat saying it once: the candidate's weight is clipped by the
  // reference's (the cosine's norm still grows with the repeats).
  const double once = scores({"red", "x"}, refs)[0], four = scores({"red red red red", "x"}, refs)[0];
  CHECK(once > 0);
  CHECK(four < once);
  // The Gaussian length penalty: the same words and more of them score less, by e^(-d^2 / 72) per n.
  const double exact = scores({"two red circles on the left", "x"}, refs)[0];
  const double longer = scores({"two red circles on the left a b c d e f", "x"}, refs)[0];
  CHECK(longer < exact);
  // Several references: the mean over them.
  const Words r1 = split("two red circles"), r2 = split("three green squares"), c = split("two red squares");
  const CiderD cider({{r1, r2}, {split("a b")}});
  CHECK(cider.score(c, {r1, r2}) == Approx((cider.score(c, {r1}) + cider.score(c, {r2})) / 2));
  CHECK(cider.score(c, {r1}) > 0);
  CHECK(cider.score(c, {r2}) > 0);
  // A picture without references.
  CHECK_THROWS_AS(CiderD(std::vector<std::vector<Words>>(1)), std::invalid_argument);
}

TEST_CASE("CIDEr-D: caption words are lowercased runs of letters and digits", "[gate][cider]") {
  CHECK(caption_words("A red-circle, 2 Squares.") == Words{"a", "red", "circle", "2", "squares"});
  CHECK(caption_words("  ") == Words{});
  CHECK(caption_words("caf\xc3\xa9 ok") == Words{"caf\xc3\xa9", "ok"});
}
