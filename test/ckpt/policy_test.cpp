#include "forge/ckpt/policy.h"
#include "forge/common/error.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace forge::ckpt;

TEST_CASE("due_at: milestones win, steps and seconds trigger recovery saves") {
  TierPolicy p;
  p.recovery_every = 10;
  p.milestone_every = 100;
  CHECK(due_at(p, 10, 0, 1) == Due::kRecovery);
  CHECK(due_at(p, 11, 10, 1) == Due::kNone);
  CHECK(due_at(p, 100, 90, 1) == Due::kMilestone);
  CHECK(due_at(p, 100, 100, 1) == Due::kNone);  // saved already
  p.recovery_every = 0;
  p.recovery_every_s = 60;
  CHECK(due_at(p, 7, 3, 59.9) == Due::kNone);
  CHECK(due_at(p, 7, 3, 60) == Due::kRecovery);
}

TEST_CASE("retention keeps the newest K recovery checkpoints, milestones, locked and newest-valid ones") {
  std::vector<CkptRef> all = {{Tier::kRecovery, 10}, {Tier::kRecovery, 20},  {Tier::kRecovery, 30},
                              {Tier::kRecovery, 40}, {Tier::kMilestone, 25}, {Tier::kRelease, 25}};
  auto v = retention_victims(all, 2, std::nullopt);
  REQUIRE(v.size() == 2);
  CHECK(v[0] == CkptRef{Tier::kRecovery, 20});
  CHECK(v[1] == CkptRef{Tier::kRecovery, 10});

  all[1].locked = true;  // step 20 being read
  v = retention_victims(all, 2, std::nullopt);
  REQUIRE(v.size() == 1);
  CHECK(v[0].step == 10);

  // The two newest are damaged: the newest valid one (10) survives even beyond K.
  v = retention_victims(all, 2, CkptRef{Tier::kRecovery, 10});
  CHECK(v.empty());
  CHECK(retention_victims(all, 0, std::nullopt).size() == 2);  // K < 1 acts as 1
}

TEST_CASE("resume order: newest first across recovery and milestone, never release") {
  const std::vector<CkptRef> all = {{Tier::kRecovery, 10},
                                    {Tier::kMilestone, 20},
                                    {Tier::kRecovery, 20},
                                    {Tier::kRelease, 30},
                                    {Tier::kRecovery, 15}};
  const auto o = resume_order(all);
  REQUIRE(o.size() == 4);
  CHECK(o[0] == CkptRef{Tier::kMilestone, 20});
  CHECK(o[1] == CkptRef{Tier::kRecovery, 20});
  CHECK(o[2].step == 15);
  CHECK(o[3].step == 10);
}

TEST_CASE("Young/Daly interval and expected waste") {
  CHECK(young_daly_interval_s(2.0, 3600.0) == Approx(std::sqrt(2.0 * 2.0 * 3600.0)));
  const double best = young_daly_interval_s(2.0, 3600.0);
  // The optimum of C/T + T/(2M) is at sqrt(2CM): neighbours waste more.
  CHECK(expected_waste(best, 2.0, 3600.0) < expected_waste(best * 1.5, 2.0, 3600.0));
  CHECK(expected_waste(best, 2.0, 3600.0) < expected_waste(best / 1.5, 2.0, 3600.0));
  CHECK(expected_waste(100, 1, 1000, 10) == Approx(0.01 + 0.05 + 0.01));
  CHECK_THROWS_AS(young_daly_interval_s(0, 3600), forge::Error);
  CHECK(parse_tier("milestone") == Tier::kMilestone);
  CHECK_THROWS_AS(parse_tier("daily"), forge::Error);
}
