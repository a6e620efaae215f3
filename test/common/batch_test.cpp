// The batch's rollout fields (MicroBatch::advantages, old_logps, ref_logps) and pictures through the batch's
// own transformations and its validation.
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

TEST_CASE("pictures follow their rows through serialize, slice_rows and concat; bad runs are refused") {
  MicroBatch b;
  b.resize(3, 8, MicroBatch::Targets::kNextToken);
  b.image_size = 2;
  b.image_tokens = 3;
  const std::vector<uint8_t> red(12, 200), blue(12, 30), green(12, 90);
  b.add_image(0, 1, red.data());
  b.add_image(2, 0, blue.data());
  b.add_image(2, 4, green.data());
  REQUIRE_FALSE(b.problem(7, 8));
  const MicroBatch back = MicroBatch::deserialize(b.serialize());
  CHECK(back.image_starts == b.image_starts);
  CHECK(back.image_pixels == b.image_pixels);
  CHECK(back.image_tokens == 3);
  // Row 2 alone: its pictures at rows 0's positions.
  const MicroBatch last = b.slice_rows(2, 1);
  CHECK(last.image_starts == std::vector<int64_t>{0, 4});
  CHECK(std::vector<uint8_t>(last.image_pixels.begin(), last.image_pixels.begin() + 12) == blue);
  const MicroBatch joined = MicroBatch::concat(std::vector<MicroBatch>{b.slice_rows(0, 2), last});
  CHECK(joined.image_starts == b.image_starts);
  CHECK(joined.image_pixels == b.image_pixels);
  CHECK(MicroBatch::deserialize(rollout(1, 0).serialize()).images() == 0);
  // A run past its row's end, and one overlapping the previous picture.
  MicroBatch bad = b;
  bad.image_starts[0] = 6;
  CHECK(bad.problem(7, 8)->find("picture 0") != std::string::npos);
  bad = b;
  bad.image_starts[2] = 17;
  CHECK(bad.problem(7, 8)->find("picture 2") != std::string::npos);
  bad = b;
  bad.image_pixels.pop_back();
  CHECK(bad.problem(7, 8));
}
