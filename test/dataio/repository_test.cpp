// Repositories: whole-repository duplicates, forks and their families, licenses from license files, the
// license allow-list, the split that keeps a family on one side, and the "repo" field at ingest.
#include "forge/dataio/repository.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/dataio/filters.h"
#include "forge/dataio/ingest.h"
#include "forge/dataio/split.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

using namespace forge::data;

namespace {

constexpr const char* kMit =
    "MIT License\n\nPermission is hereby granted, free of charge, to any person obtaining a copy of this "
    "software and associated documentation files, to deal in the Software without restriction.\n";

// A source file long enough to count for fork detection, distinct per (tag, i).
std::string source_file(const std::string& tag, int i) {
  return fmt::format("// {} file {}\nint function_{}_{}(int value) {{\n  return value * {} + {};\n}}\n", tag,
                     i, tag, i, i + 3, i);
}

void add(Corpus& c, const std::string& repo, const std::string& name, std::string text, uint16_t domain = 0) {
  Document d;
  d.repo = repo;
  d.source = repo + "/" + name;
  d.text = std::move(text);
  d.domain = domain;
  c.docs.push_back(std::move(d));
}

std::map<std::string, std::set<std::string>> families(const Corpus& c) {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& d : c.docs) out[d.repo_family].insert(d.repo);
  return out;
}

}  // namespace

TEST_CASE("duplicate repositories go whole; forks join their origin's family; license files license") {
  REQUIRE(source_file("lib", 0).size() >= kMinForkFileBytes);
  Corpus c;
  c.domains = {"code"};
  for (int i = 0; i < 5; ++i) add(c, "alice/lib", fmt::format("f{}.c", i), source_file("lib", i));
  add(c, "alice/lib", "LICENSE", kMit);
  // An exact copy under another name.
  for (int i = 0; i < 5; ++i) add(c, "mallory/lib-copy", fmt::format("f{}.c", i), source_file("lib", i));
  add(c, "mallory/lib-copy", "LICENSE", kMit);
  // A fork: four of the five files, and two of its own.
  for (int i = 0; i < 4; ++i) add(c, "bob/lib-fork", fmt::format("f{}.c", i), source_file("lib", i));
  for (int i = 0; i < 2; ++i) add(c, "bob/lib-fork", fmt::format("g{}.c", i), source_file("bob", i));
  // A fork of the fork: its files came from alice/lib first, so its family is alice/lib's.
  for (int i = 0; i < 4; ++i) add(c, "carol/lib-fork2", fmt::format("f{}.c", i), source_file("lib", i));
  for (int i = 0; i < 2; ++i) add(c, "carol/lib-fork2", fmt::format("g{}.c", i), source_file("bob", i));
  add(c, "carol/lib-fork2", "h.c", source_file("carol", 0));
  // Unrelated, with the same (common) license file and one file in common: not a fork.
  for (int i = 0; i < 5; ++i) add(c, "dave/app", fmt::format("a{}.c", i), source_file("app", i));
  add(c, "dave/app", "f0.c", source_file("lib", 0));
  add(c, "dave/app", "COPYING", kMit);
  Document loose;
  loose.text = source_file("loose", 0);
  c.docs.push_back(loose);
  const size_t in = c.docs.size();

  SECTION("forks kept") {
    const forge::Json st = dedup_repositories(c, RepositoryOptions{});
    CHECK(st["repositories"] == 5);
    CHECK(st["duplicate_repositories"] == 1);
    CHECK(st["forks"] == 2);
    CHECK(st["removed"]["repository_duplicate"] == 6);
    CHECK(st["removed"]["repository_fork"] == 0);
    CHECK(c.docs.size() == in - 6);
    const auto fam = families(c);
    CHECK(fam.at("alice/lib") == std::set<std::string>{"alice/lib", "bob/lib-fork", "carol/lib-fork2"});
    CHECK(fam.at("dave/app") == std::set<std::string>{"dave/app"});
    CHECK(fam.at("") == std::set<std::string>{""});  // a document without a repository has no family
    for (const auto& d : c.docs) {
      INFO(d.source);
      CHECK(d.license == (d.repo == "alice/lib" || d.repo == "dave/app" ? "MIT" : ""));
    }
    CHECK(st["licensed_from_repository_file"] == 19);  // alice's 6, mallory's 6 (before removal), dave's 7
  }
  SECTION("forks dropped") {
    RepositoryOptions o;
    o.drop_forks = true;
    const forge::Json st = dedup_repositories(c, o);
    CHECK(st["removed"]["repository_fork"] == 13);
    for (const auto& d : c.docs) CHECK((d.repo == "alice/lib" || d.repo == "dave/app" || d.repo.empty()));
  }
  SECTION("a higher threshold: the fork of the fork is its own family") {
    RepositoryOptions o;
    o.fork_threshold = 0.6;  // carol shares 4 of 7 with alice (0.57), bob 4 of 6 (0.67)
    dedup_repositories(c, o);
    const auto fam = families(c);
    CHECK(fam.at("alice/lib") == std::set<std::string>{"alice/lib", "bob/lib-fork"});
    CHECK(fam.at("carol/lib-fork2") == std::set<std::string>{"carol/lib-fork2"});
  }
}

TEST_CASE("the split puts every file of a repository family on one side") {
  Corpus c;
  c.domains = {"code", "docs"};
  for (int r = 0; r < 60; ++r) {
    const std::string repo = fmt::format("owner{}/repo{}", r, r);
    for (int i = 0; i < 2 + r % 7; ++i) {
      Document d;
      d.repo = repo;
      d.repo_family = r % 10 == 9 ? "owner0/repo0" : repo;  // every tenth repository is a fork of the first
      d.text = source_file(repo, i);
      d.domain = i == 0 && r % 3 == 0 ? 1 : 0;  // some families also have a file in another domain
      c.docs.push_back(std::move(d));
    }
  }
  for (int i = 0; i < 40; ++i) {
    Document d;
    d.text = fmt::format("loose doc {}", i);
    c.docs.push_back(std::move(d));
  }
  const auto valid = assign_valid_split(c, 0.1, 0);
  std::map<std::string, std::set<int>> sides;
  uint64_t code_docs = 0, code_valid = 0;
  for (size_t i = 0; i < c.docs.size(); ++i) {
    if (!c.docs[i].repo_family.empty()) sides[c.docs[i].repo_family].insert(valid[i]);
    if (c.docs[i].domain == 0) {
      ++code_docs;
      code_valid += valid[i];
    }
  }
  size_t valid_families = 0;
  for (const auto& [family, s] : sides) {
    INFO(family);
    CHECK(s.size() == 1);
    valid_families += s.count(1);
  }
  CHECK(valid_families >= 1);
  CHECK(valid_families < sides.size());
  // Whole units are taken until the domain's share is reached: at least f, at most f plus one family.
  CHECK(double(code_valid) >= 0.1 * double(code_docs) - 1e-9);
  CHECK(double(code_valid) <= 0.1 * double(code_docs) + 8 * 7 + 1);
}

TEST_CASE("without repositories the split is the ceil(f * n) lowest document hashes, as before") {
  Corpus c;
  c.domains = {"a", "b"};
  for (int i = 0; i < 257; ++i) {
    Document d;
    d.text = fmt::format("document number {}", i);
    d.domain = static_cast<uint16_t>(i % 3 == 0);
    c.docs.push_back(std::move(d));
  }
  const auto valid = assign_valid_split(c, 0.07, 5);
  for (uint16_t dom = 0; dom < 2; ++dom) {
    std::vector<std::pair<uint64_t, size_t>> keyed;
    for (size_t i = 0; i < c.docs.size(); ++i)
      if (c.docs[i].domain == dom)
        keyed.emplace_back(forge::xxh3_64(c.docs[i].text.data(), c.docs[i].text.size(), 5), i);
    std::sort(keyed.begin(), keyed.end());
    const auto take = static_cast<size_t>(std::ceil(0.07 * double(keyed.size())));
    for (size_t k = 0; k < keyed.size(); ++k) CHECK(valid[keyed[k].second] == (k < take ? 1 : 0));
  }
}

TEST_CASE("the license allow-list keeps listed SPDX ids and counts the rest per domain") {
  Corpus c;
  c.domains = {"code", "web"};
  const std::vector<std::pair<std::string, uint16_t>> docs = {{"MIT", 0},        {"GPL-3.0", 0}, {"", 0},
                                                              {"Apache-2.0", 1}, {"GPL-3.0", 1}, {"MIT", 1}};
  for (const auto& [lic, dom] : docs) {
    Document d;
    d.text = "x";
    d.license = lic;
    d.domain = dom;
    c.docs.push_back(d);
  }
  LicenseOptions o;
  o.allow = {"MIT", "Apache-2.0", "unknown"};
  const forge::Json st = apply_license_policy(c, o);
  CHECK(c.docs.size() == 4);
  CHECK(st["removed"]["license_not_allowed"] == 2);
  CHECK(st["licenses_removed"]["GPL-3.0"] == 2);
  CHECK(st["removed_per_domain"]["code"]["GPL-3.0"] == 1);
  CHECK(st["licenses_kept"]["unknown"] == 1);
  // No list: everything stays, and is counted.
  const forge::Json all = apply_license_policy(c, LicenseOptions{});
  CHECK(c.docs.size() == 4);
  CHECK(all["licenses_kept"]["MIT"] == 2);
}

TEST_CASE("ingest reads repositories from JSONL and from the directory layout; a bad repo field is exit 65") {
  forge::test::TempDir tmp;
  std::filesystem::create_directories(tmp.path() / "src/alice/lib/sub");
  tmp.write("src/alice/lib/a.c", "int a;\n");
  tmp.write("src/alice/lib/sub/b.c", "int b;\n");
  tmp.write("src/top.c", "int top;\n");  // less deep than the layout: no repository
  tmp.write("src/recs.jsonl", "{\"text\": \"one\", \"repo\": \"bob/x\"}\n{\"text\": \"two\"}\n");
  IngestOptions o;
  o.extensions = {"c", "jsonl"};
  o.repo_depth = 2;
  Corpus c;
  IngestStats st;
  ingest({InputSpec{tmp / "src", "code"}}, o, c, st);
  std::map<std::string, std::string> repo_of;
  for (const auto& d : c.docs) repo_of[d.text] = d.repo;
  CHECK(repo_of.at("int a;\n") == "alice/lib");
  CHECK(repo_of.at("int b;\n") == "alice/lib");
  CHECK(repo_of.at("int top;\n") == "");
  CHECK(repo_of.at("one") == "bob/x");
  CHECK(repo_of.at("two") == "");

  const std::string bad = tmp.write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"t\", \"repo\": 7}\n");
  Corpus c2;
  IngestStats st2;
  try {
    ingest({InputSpec{bad, ""}}, o, c2, st2);
    FAIL("accepted a numeric repo");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(std::string(e.what()).find(bad + ":2") != std::string::npos);
    CHECK(std::string(e.what()).find("\"repo\"") != std::string::npos);
  }
}
