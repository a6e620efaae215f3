#include "forge/common/layout.h"
#include "support/paths.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using forge::Layout;
using forge::ModelDims;

namespace {

// One line of test/common/layout_cases.txt (the format is described at its top).
struct Case {
  int line = 0;
  std::string input;
  std::string error;       // set for a case the parser rejects
  std::string normalised;  // else these
  Layout dims;
  int ranks = 0;
};

std::vector<Case> read_cases() {
  const std::string path = forge::test::source_path("test/common/layout_cases.txt");
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<Case> cases;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.empty() || text[0] == '#') continue;
    INFO(path << ":" << line << ": " << text);
    const size_t close = text.find('"', 1);
    REQUIRE((text[0] == '"' && close != std::string::npos));
    Case c;
    c.line = line;
    c.input = text.substr(1, close - 1);
    std::istringstream rest(text.substr(close + 1));
    std::string word;
    rest >> word;
    if (word == "error") {
      std::getline(rest >> std::ws, c.error);
      REQUIRE(!c.error.empty());
    } else {
      c.normalised = word;
      while (rest >> word) {
        const size_t eq = word.find('=');
        REQUIRE(eq != std::string::npos);
        const std::string name = word.substr(0, eq);
        int* slot = name == "tp"      ? &c.dims.tp
                    : name == "cp"    ? &c.dims.cp
                    : name == "ep"    ? &c.dims.ep
                    : name == "dp"    ? &c.dims.dp
                    : name == "pp"    ? &c.dims.pp
                    : name == "ranks" ? &c.ranks
                                      : nullptr;
        REQUIRE(slot);
        *slot = std::stoi(word.substr(eq + 1));
      }
      REQUIRE(c.ranks > 0);
    }
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

TEST_CASE("parse_layout agrees with every case of the shared table") {
  const auto cases = read_cases();
  CHECK(cases.size() >= 40);
  for (const Case& c : cases) {
    INFO("layout_cases.txt:" << c.line << ": \"" << c.input << "\"");
    std::string why;
    const auto layout = forge::parse_layout(c.input, &why);
    if (c.error.empty()) {
      REQUIRE(layout);
      CHECK(*layout == c.dims);
      CHECK(layout->str() == c.normalised);
      CHECK(layout->world() == c.ranks);
      CHECK(forge::parse_layout(layout->str(), nullptr) == layout);  // the normalised spelling parses back
    } else {
      CHECK_FALSE(layout);
      CHECK_THAT(why, Catch::Contains(c.error));
      // One line naming the input and the expected form.
      CHECK_THAT(why,
                 Catch::StartsWith("'") && Catch::Contains("' is not a layout: ") &&
                     Catch::EndsWith("; expected tpX,ppY,dpZ (and optionally cpN, epN) such as tp2,pp2,dp4"));
      CHECK(why.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("hostile layouts give a short, printable message") {
  std::string why;
  CHECK_FALSE(forge::parse_layout(std::string(4096, 'A'), &why));
  CHECK(why.size() < 300);
  CHECK_FALSE(forge::parse_layout("tp1\n,pp1,dp1\xff", &why));
  CHECK_THAT(why, Catch::Contains("'tp1\\x0a,pp1,dp1\\xff'"));
  CHECK_FALSE(forge::parse_layout("tp0,pp1,dp1", nullptr));  // why is optional
}

TEST_CASE("str() is the normalised spelling: tp, pp, dp, then cp and ep when not 1") {
  CHECK(Layout{}.str() == "tp1,pp1,dp1");
  CHECK(Layout{.tp = 2, .dp = 4, .pp = 2}.str() == "tp2,pp2,dp4");
  CHECK(Layout{.tp = 2, .ep = 2, .dp = 4}.str() == "tp2,pp1,dp4,ep2");
  CHECK(Layout{.tp = 1, .cp = 4, .ep = 2, .dp = 2, .pp = 3}.str() == "tp1,pp3,dp2,cp4,ep2");
  CHECK(Layout{.tp = 2, .cp = 2, .ep = 4, .dp = 4}.world() == 16);  // ep is carved out of dp
}

TEST_CASE("coords() and rank() round-trip: TP fastest, then CP, then DP, PP outermost") {
  for (const Layout& l :
       {Layout{}, Layout{.tp = 2, .dp = 4, .pp = 2}, Layout{.tp = 4, .cp = 2, .dp = 3, .pp = 2},
        Layout{.tp = 1, .cp = 3, .ep = 2, .dp = 2, .pp = 5}, Layout{.tp = 8, .dp = 1, .pp = 1}}) {
    INFO(l.str());
    for (int r = 0; r < l.world(); ++r) {
      const Layout::Coords c = l.coords(r);
      CHECK((c.tp >= 0 && c.tp < l.tp && c.cp >= 0 && c.cp < l.cp && c.dp >= 0 && c.dp < l.dp && c.pp >= 0 &&
             c.pp < l.pp));
      CHECK(l.rank(c) == r);
      CHECK(r == c.tp + l.tp * (c.cp + l.cp * (c.dp + l.dp * c.pp)));
      CHECK(l.ep_rank(c) == c.dp % l.ep);
    }
  }
  // tp2,pp2,dp4 with cp2: rank 1 is the second TP rank, rank 2 the second CP rank, rank 4 the second DP
  // rank, rank 32 the first rank of the second pipeline stage.
  const Layout l{.tp = 2, .cp = 2, .dp = 4, .pp = 2};
  CHECK(l.coords(1).tp == 1);
  CHECK((l.coords(2).tp == 0 && l.coords(2).cp == 1));
  CHECK((l.coords(4).cp == 0 && l.coords(4).dp == 1));
  CHECK((l.coords(16).dp == 0 && l.coords(16).pp == 1));
  CHECK(l.rank({.tp = 1, .cp = 1, .dp = 3, .pp = 1}) == 31);
}

TEST_CASE("layout_problem names the first key to change and why") {
  const ModelDims model{.layers = 6, .heads = 6, .vocab = 8192};
  CHECK_FALSE(forge::layout_problem(Layout{}, model));
  CHECK_FALSE(forge::layout_problem(Layout{.tp = 2, .dp = 4, .pp = 6}, model));
  const auto check = [&](const Layout& l, const ModelDims& m, const std::string& key,
                         const std::string& why) {
    INFO(l.str());
    const auto p = forge::layout_problem(l, m);
    REQUIRE(p);
    CHECK(p->key == key);
    CHECK_THAT(p->why, Catch::Contains(why));
  };
  check(Layout{.tp = 4}, model, "parallel.tp", "must divide model.heads = 6 (each rank holds whole heads)");
  check(Layout{.tp = 2}, {.layers = 6, .heads = 6, .vocab = 8191}, "parallel.tp",
        "must divide model.vocab = 8191 (vocabulary-parallel embedding; pad the vocabulary)");
  check(Layout{.pp = 7}, model, "parallel.pp", "7 stages need at least one block each but model.layers is 6");
  // Key/value heads: tp divides them, or is a multiple of them (each then held by tp / kv_heads ranks).
  const ModelDims gqa{.layers = 6, .heads = 12, .vocab = 8192, .kv_heads = 4};
  check(Layout{.tp = 6}, gqa, "parallel.tp", "must divide model.kv_heads = 4 or be a multiple of it");
  CHECK_FALSE(forge::layout_problem(Layout{.tp = 4}, gqa));
  CHECK_FALSE(forge::layout_problem(Layout{.tp = 2}, gqa));
  CHECK_FALSE(
      forge::layout_problem(Layout{.tp = 8}, {.layers = 6, .heads = 16, .vocab = 8192, .kv_heads = 2}));
  CHECK_FALSE(forge::layout_problem(Layout{.tp = 2, .cp = 2, .dp = 2, .pp = 2}, model));
  check(Layout{.cp = 4}, {.layers = 6, .heads = 6, .vocab = 8192, .seq_len = 100}, "parallel.cp",
        "must cut model.seq_len = 100 into 2 x 4 equal chunks (cp = 2 would)");
  CHECK_FALSE(forge::layout_problem(Layout{.cp = 2, .ep = 2, .dp = 2},
                                    {.layers = 6, .heads = 6, .vocab = 8192, .experts = 4, .seq_len = 64}));
  check(Layout{.ep = 2, .dp = 2}, model, "parallel.ep",
        "expert parallelism needs a Mixture-of-Experts model (model.ffn = moe)");
  const ModelDims moe{.layers = 6, .heads = 6, .vocab = 8192, .experts = 6};
  CHECK_FALSE(forge::layout_problem(Layout{.tp = 2, .ep = 2, .dp = 4, .pp = 2}, moe));
  check(Layout{.ep = 4, .dp = 4}, moe, "parallel.ep", "must divide model.experts = 6");
  check(Layout{.ep = 2, .dp = 3}, model, "parallel.ep", "must divide parallel.dp = 3");
}
