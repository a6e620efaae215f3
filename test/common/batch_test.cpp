// The batch's rollout fields (MicroBatch::advantages, old_logps, ref_logps) through the batch's own
// transformations and its validation.
#include "forge/common/batch.h"

#include <catch2/catch.hpp>

#include <vector>

using forge::MicroBatch;

namespace {

// `rows` sampled replies of 4 positions: the first position a prompt (not scored).
MicroBatch rollout(int rows, float base) {
  MicroBatch b;
  b.resize(rows, 4);
  b.weights.assign(b.size(), 1.0f);
  for (size_t i = 0; i < b.size(); ++i) {
    b.inputs[i] = int32_t(i % 7);
    b.targets[i] = i % 4 == 0 ? MicroBatch::kIgnore : int32_t((i + 1) % 7);
    if (i % 4 == 0) b.weights[i] = 0.0f;
  }
  for (int r = 0; r < rows; ++r) b.advantages.push_back(base + float(r));
  for (size_t i = 0; i < b.size(); ++i) {
    b.old_logps.push_back(i % 4 == 0 ? 0.0f : -0.5f - float(i));
    b.ref_logps.push_back(i % 4 == 0 ? 0.0f : -0.25f - float(i));
  }
  return b;
}

}  // namespace

TEST_CASE("rollout fields survive serialize, slice_rows and concat; mixing and bad values are refused") {
  const MicroBatch a = rollout(2, 0.5f), b = rollout(3, -1.0f);
  REQUIRE_FALSE(a.problem(7, 8));
  const MicroBatch back = MicroBatch::deserialize(a.serialize());
  CHECK(back.advantages == a.advantages);
  CHECK(back.old_logps == a.old_logps);
  CHECK(back.ref_logps == a.ref_logps);
  const MicroBatch both = MicroBatch::concat(std::vector<MicroBatch>{a, b});
  CHECK(both.advantages.size() == 5);
  CHECK(both.slice_rows(2, 3).advantages == b.advantages);
  CHECK(both.slice_rows(2, 3).old_logps == b.old_logps);
  CHECK(both.slice_rows(2, 3).ref_logps == b.ref_logps);
  MicroBatch plain = a;
  plain.advantages.clear();
  plain.old_logps.clear();
  plain.ref_logps.clear();
  CHECK_THROWS_AS(MicroBatch::concat(std::vector<MicroBatch>{plain, b}), std::invalid_argument);
  CHECK(MicroBatch::deserialize(plain.serialize()).advantages.empty());

  MicroBatch bad = a;
  bad.old_logps[1] = 0.5f;  // a probability above 1
  CHECK(bad.problem(7, 8).value_or("").find("log-probability 0.5 is not a finite value <= 0") !=
        std::string::npos);
  bad = a;
  bad.advantages.pop_back();
  CHECK(bad.problem(7, 8).value_or("").find("wrong length") != std::string::npos);
  bad = a;
  bad.resize(2, 4);  // clears them with the other optional fields
  CHECK(bad.advantages.empty());
  CHECK(bad.old_logps.empty());
}
