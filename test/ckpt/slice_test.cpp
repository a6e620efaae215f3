#include "forge/ckpt/slice.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <random>
#include <set>

using namespace forge::ckpt;

namespace {

// Every logical index of a slice, in buffer order, by brute force.
std::vector<int64_t> brute_force(const Slice& s) {
  std::vector<int64_t> all;
  const size_t rank = s.shape.size();
  int64_t slab = 1;
  for (auto c : s.count) slab *= c;
  for (int64_t k = 0; k < slab; ++k) {
    int64_t rem = k, flat = 0, stride = 1;
    std::vector<int64_t> c(rank);
    for (size_t d = rank; d-- > 0;) {
      c[d] = rem % s.count[d] + s.offset[d];
      rem /= s.count[d];
    }
    for (size_t d = rank; d-- > 0;) {
      flat += c[d] * stride;
      stride *= s.shape[d];
    }
    if (k >= s.begin && k < s.end) all.push_back(flat);
  }
  return all;
}

std::vector<int64_t> from_runs(const std::vector<Run>& runs) {
  std::vector<int64_t> all;
  for (const auto& r : runs) {
    REQUIRE(r.at == static_cast<int64_t>(all.size()));
    for (int64_t i = r.lo; i < r.hi; ++i) all.push_back(i);
  }
  return all;
}

}  // namespace

TEST_CASE("runs of random hyperslabs and ranges match a brute-force walk") {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    Slice s;
    s.name = "param/x";
    const int rank = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < rank; ++d) {
      const int64_t n = 1 + rng() % 6;
      const int64_t off = rng() % n;
      s.shape.push_back(n);
      s.offset.push_back(off);
      s.count.push_back(1 + rng() % (n - off));
    }
    int64_t slab = 1;
    for (auto c : s.count) slab *= c;
    s.begin = rng() % (slab + 1);
    s.end = s.begin + rng() % (slab - s.begin + 1);
    const Slice n = s.normalized();
    const auto runs = runs_of(n);
    CHECK(from_runs(runs) == brute_force(n));
    for (size_t i = 1; i < runs.size(); ++i) CHECK(runs[i - 1].hi < runs[i].lo);  // merged and sorted
  }
}

TEST_CASE("a full-width row slab is one run; a column slab is one run per row") {
  Slice rows = Slice::whole("param/w", {8, 4});
  rows.offset = {2, 0};
  rows.count = {3, 4};
  auto r = runs_of(rows.normalized());
  REQUIRE(r.size() == 1);
  CHECK(r[0].lo == 8);
  CHECK(r[0].hi == 20);
  Slice cols = Slice::whole("param/w", {8, 4});
  cols.offset = {0, 2};
  cols.count = {8, 2};
  CHECK(runs_of(cols.normalized()).size() == 8);
  CHECK(runs_of(Slice::whole("param/s", {})).size() == 1);
}

TEST_CASE("intersect_runs reports overlaps with both buffer positions") {
  const std::vector<Run> a = {{0, 4, 0}, {10, 14, 4}}, b = {{2, 12, 0}};
  std::vector<std::array<int64_t, 4>> got;
  intersect_runs(a, b, [&](int64_t lo, int64_t hi, int64_t at_a, int64_t at_b) {
    got.push_back({lo, hi, at_a, at_b});
  });
  REQUIRE(got.size() == 2);
  CHECK(got[0] == std::array<int64_t, 4>{2, 4, 2, 0});
  CHECK(got[1] == std::array<int64_t, 4>{10, 12, 4, 8});
}

TEST_CASE("bad slices are usage errors naming the tensor") {
  Slice s = Slice::whole("param/w", {4, 4});
  s.offset = {3, 0};
  s.count = {2, 4};
  try {
    s.normalized();
    FAIL("no error");
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    CHECK(std::string(e.what()).find("param/w") != std::string::npos);
  }
  Slice r = Slice::whole("param/w", {4, 4});
  r.begin = 5;
  r.end = 17;
  CHECK_THROWS_AS(r.normalized(), forge::Error);
  Slice d = Slice::whole("param/w", {4, 4});
  d.offset = {0};
  CHECK_THROWS_AS(d.normalized(), forge::Error);
  CHECK_THROWS_AS(parse_dtype("f128"), forge::Error);
  CHECK(parse_dtype("bf16") == DType::kBF16);
  CHECK(dtype_size(DType::kBF16) == 2);
}

TEST_CASE("slice JSON round-trips and coordinates print") {
  Slice s = Slice::whole("adam_m/w", {3, 5}, DType::kBF16);
  s.begin = 2;
  s.end = 9;
  const Slice back = Slice::from_json(s.to_json());
  CHECK(back.to_json() == s.to_json());
  CHECK(coords_of({3, 5}, 7) == "[1, 2]");
}
