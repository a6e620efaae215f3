// The approval store end to end on a temporary ledger, with explicit identities: request, decide, admit
// (one use per job, under a race too), the pool check, visibility, and job ids learnt from sacct.
#include "forge/quota/approvals.h"
#include "forge/common/error.h"
#include "forge/common/sqlite.h"
#include "forge/quota/ledger.h"
#include "support/paths.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../support/temp_dir.h"

using namespace forge::quota;
using forge::ExitCode;

namespace {

const Policy& policy() {
  static const Policy p = load_policy(forge::test::source_path("configs/quota.example.ini"));
  return p;
}

const int64_t kNow = 1796205600;  // 2026-12-02 10:00 UTC
const Identity alice{"alice", {}}, bob{"bob", {}}, carol{"carol", {}}, dave{"dave", {}};

// The message of the forge::Error(kUsage) that `f` throws; "" when it throws none.
template <typename F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const forge::Error& e) {
    CHECK(e.code() == ExitCode::kUsage);
    return e.what();
  }
  return "";
}

JobRequest job(const std::string& team, const std::string& tier, int gpus, int64_t seconds,
               std::optional<std::string> approval = std::nullopt, const std::string& partition = "") {
  return JobRequest{team, tier, gpus, seconds, partition, std::move(approval)};
}

// An approved request of alice's for team-a, decided by carol.
std::string approved(ApprovalStore& store, const std::string& tier, int gpus, int64_t seconds, int uses = 1,
                     std::optional<int64_t> expires_in = std::nullopt) {
  const std::string id = store.request(policy(), alice, "team-a", tier, gpus, seconds, "scaling run", kNow);
  store.decide(policy(), carol, id, Verdict{true, uses, expires_in, ""}, kNow);
  return id;
}

}  // namespace

TEST_CASE("a large job needs an approval: request, approve, then admitted exactly once") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const Policy& p = policy();

  const AdmitResult without = store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600), kNow);
  CHECK_FALSE(without.admitted);
  CHECK_THAT(
      without.message,
      Catch::Contains("24 GPUs is more than the 16 a job may take without approval") &&
          Catch::Contains("forge-quota request --team team-a --tier explore --gpus 24 --time 4:00:00"));

  const std::string id = store.request(p, alice, "team-a", "explore", 24, 4 * 3600, "scaling test", kNow);
  CHECK(is_approval_id(id));
  const auto pending = store.find(id);
  REQUIRE(pending);
  CHECK(pending->state == ApprovalState::kPending);
  CHECK(pending->requester == "alice");
  CHECK(pending->reason == "scaling test");
  CHECK_THAT(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, id), kNow).message,
             Catch::Contains("approval " + id + " is not approved yet; approvers of team team-a: carol"));

  const Approval a = store.decide(p, carol, id, Verdict{true, 1, std::nullopt, "go"}, kNow + 60);
  CHECK(a.state == ApprovalState::kApproved);
  CHECK(a.decided_by == "carol");
  CHECK(a.expires_at == kNow + 60 + 7 * 86400);  // [approval] ttl
  CHECK(a.uses_allowed == 1);
  CHECK(a.uses_left == 1);

  const AdmitResult first = store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, id), kNow + 120);
  CHECK(first.admitted);
  CHECK(first.approval_id == id);
  CHECK(first.partition == "train");  // no partition named: the first pool that takes explore
  CHECK_THAT(first.message, Catch::Contains("0 of 1 uses left"));
  // Any member of the team may use it; but not a second time.
  const AdmitResult second = store.admit(p, Identity{"mallory", {"forge-a"}},
                                         job("team-a", "explore", 24, 4 * 3600, id), kNow + 180);
  CHECK_FALSE(second.admitted);
  CHECK(second.message == "approval " + id + " is used up (1 of 1 uses)");
  CHECK(store.find(id)->uses_left == 0);
}

TEST_CASE("admit: a job that needs no approval takes none, and a non-member is refused first") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const std::string id = approved(store, "explore", 24, 4 * 3600);
  const AdmitResult small = store.admit(policy(), alice, job("team-a", "explore", 16, 4 * 3600, id), kNow);
  CHECK(small.admitted);
  CHECK(small.approval_id.empty());
  CHECK(store.find(id)->uses_left == 1);  // not spent on a job that did not need it
  CHECK(store.admit(policy(), bob, job("team-a", "explore", 24, 4 * 3600, id), kNow).message ==
        "user bob is not a member of team team-a");
  CHECK_THAT(store.admit(policy(), bob, job("team-b", "pretrain", 1, 60), kNow).message,
             Catch::Contains("team team-b may not use tier 'pretrain'"));
  CHECK_THAT(store.admit(policy(), bob, job("team-z", "explore", 1, 60), kNow).message,
             Catch::Contains("unknown team 'team-z'"));
}

TEST_CASE("admit: expired, another team's, another tier's, a bigger job, a denied request") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const Policy& p = policy();

  const std::string hour = approved(store, "explore", 24, 4 * 3600, 1, 3600);
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, hour), kNow + 3600).message ==
        "approval " + hour + " expired at 2026-12-02 11:00 UTC");
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, hour), kNow + 3599).admitted);

  const std::string b = store.request(p, bob, "team-b", "explore", 16, 4 * 3600, "eval sweep", kNow);
  store.decide(p, carol, b, Verdict{true, 1, std::nullopt, ""}, kNow);
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, b), kNow).message ==
        "approval " + b + " was for team team-b");
  CHECK(store.find(b)->uses_left == 1);

  const std::string pre = approved(store, "pretrain", 24, 4 * 3600);
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, pre), kNow).message ==
        "approval " + pre + " was for tier 'pretrain', not 'explore'");

  const std::string small = approved(store, "explore", 24, 2 * 3600, 3);
  CHECK(store.admit(p, alice, job("team-a", "explore", 32, 2 * 3600, small), kNow).message ==
        "approval " + small + " covers 24 GPUs and this job asks for 32");
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, small), kNow).message ==
        "approval " + small + " covers a time limit of 2:00:00 and this job asks for 4:00:00");
  CHECK(store.admit(p, alice, job("team-a", "explore", 20, 3600, small), kNow).admitted);  // within it
  CHECK(store.find(small)->uses_left == 2);

  const std::string no = store.request(p, alice, "team-a", "explore", 24, 3600, "please", kNow);
  const Approval denied = store.decide(p, carol, no, Verdict{false, 1, std::nullopt, "too big"}, kNow);
  CHECK(denied.state == ApprovalState::kDenied);
  CHECK(denied.uses_left == 0);
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 3600, no), kNow).message ==
        "approval " + no + " was denied by carol: too big");
  CHECK(store.admit(p, alice, job("team-a", "explore", 24, 3600, "apr-000000000000"), kNow).message ==
        "approval apr-000000000000 does not exist; check the id (forge-quota report --approvals)");
}

TEST_CASE("decide: approvers of the team only, never one's own request, pending requests only") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  Policy p = policy();
  p.teams.at("team-a").approvers.users.push_back("alice");  // alice approves for her own team
  const std::string id = store.request(p, alice, "team-a", "explore", 24, 3600, "mine", kNow);
  CHECK_THAT(usage_error([&] { store.decide(p, alice, id, Verdict{true}, kNow); }),
             Catch::Contains("alice asked for " + id + " and may not decide it too") &&
                 Catch::Contains("four eyes"));
  CHECK_THAT(usage_error([&] { store.decide(p, bob, id, Verdict{true}, kNow); }),
             Catch::Contains("user bob may not decide requests of team team-a; its approvers: carol, alice"));
  // An admin sees every request but approves none that is not theirs to approve.
  CHECK_THAT(usage_error([&] { store.decide(p, dave, id, Verdict{true}, kNow); }),
             Catch::Contains("user dave may not decide requests of team team-a"));
  CHECK(store.find(id)->state == ApprovalState::kPending);
  // An approver through a group.
  p.teams.at("team-a").approvers.groups.push_back("leads");
  CHECK(store.decide(p, Identity{"erin", {"leads"}}, id, Verdict{true, 2}, kNow).uses_allowed == 2);
  CHECK_THAT(usage_error([&] { store.decide(p, carol, id, Verdict{false}, kNow); }),
             Catch::Contains(id + " was approved by erin") && Catch::Contains("only a pending request"));
  CHECK_THAT(usage_error([&] { store.decide(p, carol, "apr-0123456789ab", Verdict{true}, kNow); }),
             Catch::Contains("no approval request apr-0123456789ab"));
  CHECK_THAT(usage_error([&] { store.decide(p, carol, "%n%s%s%x", Verdict{true}, kNow); }),
             Catch::Contains("approval id '%n%s%s%x' is malformed"));

  const std::string other = store.request(p, alice, "team-a", "explore", 24, 3600, "again", kNow);
  CHECK_THAT(usage_error([&] {
               store.decide(p, carol, other, Verdict{true, 0}, kNow);
             }),
             Catch::Contains("--uses 0: expected 1 to 100"));
  CHECK_THAT(usage_error([&] {
               store.decide(p, carol, other, Verdict{true, 101}, kNow);
             }),
             Catch::Contains("--uses 101"));
  CHECK_THAT(usage_error([&] {
               store.decide(p, carol, other, Verdict{true, 1, 0}, kNow);
             }),
             Catch::Contains("--expires 0"));
  CHECK_THAT(usage_error([&] {
               store.decide(p, carol, other, Verdict{true, 1, std::nullopt, "a\nb"}, kNow);
             }),
             Catch::Contains("--note contains a control character"));
  CHECK(store.find(other)->state == ApprovalState::kPending);
}

TEST_CASE("request: members only, allowed tiers, within the tier's wall and the team's GPUs, a sane reason") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const Policy& p = policy();
  const auto req = [&](const Identity& who, const std::string& team, const std::string& tier, int gpus,
                       int64_t secs, const std::string& reason) {
    return usage_error([&] { store.request(p, who, team, tier, gpus, secs, reason, kNow); });
  };
  CHECK_THAT(req(bob, "team-a", "explore", 24, 3600, "x"),
             Catch::Contains("user bob is not a member of team team-a"));
  CHECK_THAT(req(alice, "team-a", "finetune", 24, 3600, "x"),
             Catch::Contains("team team-a may not use tier 'finetune'; its tiers are: pretrain, explore"));
  CHECK_THAT(req(alice, "team-a", "explore", 24, 5 * 3600, "x"),
             Catch::Contains("--time 5:00:00 is over tier 'explore''s max wall 4:00:00"));
  CHECK_THAT(req(alice, "team-a", "explore", 0, 3600, "x"),
             Catch::Contains("--gpus 0: expected 1 to 1048576"));
  CHECK_THAT(req(alice, "team-a", "explore", 1048577, 3600, "x"), Catch::Contains("--gpus 1048577"));
  CHECK_THAT(req(alice, "team-a", "explore", 33, 3600, "x"),
             Catch::Contains("team team-a may hold at most 32 GPUs at once"));
  CHECK_THAT(req(alice, "team-a", "explore", 24, 3600, ""), Catch::Contains("--reason is empty"));
  CHECK_THAT(req(alice, "team-a", "explore", 24, 3600, std::string(501, 'r')),
             Catch::Contains("--reason is 501 bytes; keep it to 500"));
  CHECK_THAT(req(alice, "team-a", "explore", 24, 3600, "red \x1b[31m text"),
             Catch::Contains("--reason contains a control character (\\x1b)"));
  CHECK(req(alice, "team-a", "explore", 24, 3600, std::string(500, 'r')).empty());
  CHECK(store.list_all().size() == 1);
}

TEST_CASE("malformed approval ids are rejected, shown escaped and short, never used as a format") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  approved(store, "explore", 24, 3600);
  for (const std::string& bad :
       {std::string("garbage"), std::string(4096, 'a'), std::string("%n%s%s%x"),
        std::string("apr-ZZZZZZZZZZZZ"), std::string("apr-0123456789abc"), std::string("APR-0123456789ab"),
        std::string("apr-0123456789AB"), std::string("apr-0123456789a\n"),
        std::string("apr-01234567\xff\xfe"), std::string("' OR 1=1 --")}) {
    const AdmitResult r = store.admit(policy(), alice, job("team-a", "explore", 24, 3600, bad), kNow);
    CHECK_FALSE(r.admitted);
    CHECK_THAT(r.message, Catch::StartsWith("approval id '") && Catch::Contains("' is malformed"));
    CHECK(r.message.size() < 240);
    CHECK(r.message.find('\n') == std::string::npos);
    CHECK(r.message.find('\xff') == std::string::npos);
  }
  const AdmitResult longer =
      store.admit(policy(), alice, job("team-a", "explore", 24, 3600, std::string(4096, 'a')), kNow);
  CHECK(longer.message.find("'" + std::string(40, 'a') + "…'") != std::string::npos);
  CHECK(store.admit(policy(), alice, job("team-a", "explore", 24, 3600, "%n%s%s%x"), kNow).message ==
        "approval id '%n%s%s%x' is malformed (expected apr- and 12 hex digits)");
  CHECK(store.list_all().front().uses_left == 1);
}

TEST_CASE("two connections racing for a single-use approval: exactly one job is admitted") {
  forge::test::TempDir dir;
  const std::string ledger = dir / "ledger.db";
  for (int round = 0; round < 10; ++round) {
    std::string id;
    {
      ApprovalStore store(ledger);
      id = approved(store, "explore", 24, 3600);
    }
    std::atomic<int> ready{0};
    AdmitResult results[2];
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        ApprovalStore mine(ledger);  // a connection of its own, as two job_submit.lua runs have
        ++ready;
        while (ready.load() < 2) {
        }
        try {
          results[t] = mine.admit(policy(), alice, job("team-a", "explore", 24, 3600, id), kNow);
        } catch (const std::exception& e) {  // a ledger error is a failure of this test, not a crash
          results[t].message = std::string("error: ") + e.what();
        }
      });
    for (auto& t : threads) t.join();
    CHECK(results[0].admitted + results[1].admitted == 1);  // Catch2 checks on this thread only
    const AdmitResult& loser = results[0].admitted ? results[1] : results[0];
    CHECK(loser.message == "approval " + id + " is used up (1 of 1 uses)");
  }
}

TEST_CASE("admit: pools decide the partition a tier's jobs may use") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  Policy p = policy();
  CHECK(store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "train"), kNow).partition ==
        "train");
  CHECK(store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "eval"), kNow).message ==
        "partition 'eval' (pool eval) does not take tier 'explore' jobs; submit to train (--partition)");
  CHECK(store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "gpu"), kNow).message ==
        "partition 'gpu' is in no pool of the policy; tier 'explore' jobs run in: train (--partition)");
  CHECK_FALSE(
      store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "train,eval"), kNow).admitted);
  CHECK_THAT(store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "train data"), kNow).message,
             Catch::Contains("partition 'train data' is not a list of partition names"));
  CHECK_FALSE(store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "train,"), kNow).admitted);
  p.pools[0].tiers = {"pretrain"};
  CHECK(store.admit(p, alice, job("team-a", "explore", 1, 60), kNow).message ==
        "no pool of the policy takes tier 'explore' jobs; ask the administrators");
  // Without pools the partition is not checked and goes back as given.
  p.pools.clear();
  const AdmitResult any = store.admit(p, alice, job("team-a", "explore", 1, 60, std::nullopt, "gpu"), kNow);
  CHECK(any.admitted);
  CHECK(any.partition == "gpu");
  CHECK(store.admit(p, alice, job("team-a", "explore", 1, 60), kNow).partition.empty());
}

TEST_CASE("list: members and approvers see their teams' requests, admins all") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const Policy& p = policy();
  const std::string a = store.request(p, alice, "team-a", "explore", 24, 3600, "a", kNow);
  const std::string b = store.request(p, bob, "team-b", "explore", 16, 3600, "b", kNow + 1);
  const auto ids = [&](const Identity& who) {
    std::vector<std::string> out;
    for (const auto& x : store.list(p, who)) out.push_back(x.id);
    return out;
  };
  CHECK(ids(alice) == std::vector<std::string>{a});
  CHECK(ids(Identity{"mallory", {"forge-b"}}) == std::vector<std::string>{b});
  CHECK(ids(carol) == std::vector<std::string>{a, b});  // approves for both
  CHECK(ids(dave) == std::vector<std::string>{a, b});   // admin
  CHECK(ids(Identity{"eve", {"users"}}).empty());
}

TEST_CASE("sync learns approved jobs' ids from AdminComment, once") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const std::string id = approved(store, "explore", 24, 3600, 3);
  for (int i = 0; i < 2; ++i)
    REQUIRE(store.admit(policy(), alice, job("team-a", "explore", 24, 3600, id), kNow + i).admitted);
  const std::string sacct = "500|forge-elastic:nodes=2-4 forge-approval=" + id +
                            "\n"
                            "501| forge-approval=" +
                            id +
                            "\n"
                            "502|somebody else's comment\n"
                            "503|xforge-approval=" +
                            id +
                            "\n"
                            "504|forge-approval=apr-%n%s\n"
                            "500|forge-elastic:nodes=2-4 forge-approval=" +
                            id + "\n";
  CHECK(store.record_job_ids(sacct) == 2);
  CHECK(store.find(id)->job_ids == std::vector<std::string>{"500", "501"});
  CHECK(store.record_job_ids(sacct) == 0);  // syncing again changes nothing
  // A third admitted job takes the next use row.
  REQUIRE(store.admit(policy(), alice, job("team-a", "explore", 24, 3600, id), kNow + 5).admitted);
  CHECK(store.record_job_ids("600|forge-approval=" + id + "\n") == 1);
  CHECK(store.find(id)->job_ids == std::vector<std::string>{"500", "501", "600"});
  CHECK(store.record_job_ids("601|forge-approval=" + id + "\n") == 0);  // no use left without a job
}

TEST_CASE("an older ledger gains the approval tables and keeps its runs") {
  forge::test::TempDir dir;
  const std::string path = dir / "old.db";
  {
    forge::sqlite::Db old(path, forge::sqlite::Db::Mode::kCreate, {});
    old.exec(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('last_sync', '42');");
  }
  ApprovalStore store(path);
  CHECK(is_approval_id(store.request(policy(), alice, "team-a", "explore", 24, 3600, "x", kNow)));
  CHECK(Ledger(path).last_sync() == 42);
}

TEST_CASE("admit: a change to an admitted job is checked against the approval it holds, which it keeps") {
  forge::test::TempDir dir;
  ApprovalStore store(dir / "ledger.db");
  const Policy& p = policy();
  const std::string id = approved(store, "explore", 24, 4 * 3600, 1, 3600);
  REQUIRE(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600, id), kNow).admitted);
  REQUIRE(store.find(id)->uses_left == 0);

  JobRequest held = job("team-a", "explore", 24, 2 * 3600, id);
  held.approval_held = true;
  // Used up and past its expiry: the use was taken at submission, so the job keeps it.
  const AdmitResult shorter = store.admit(p, alice, held, kNow + 7200);
  CHECK(shorter.admitted);
  CHECK(shorter.approval_id == id);
  CHECK(store.find(id)->uses_left == 0);
  // Beyond what it covers: refused as a new job would be.
  held.time_limit_s = 6 * 3600;
  CHECK(store.admit(p, alice, held, kNow).message ==
        "approval " + id + " covers a time limit of 4:00:00 and this job asks for 6:00:00");
  // A change that needs an approval the job never had: the submission's message.
  CHECK_THAT(store.admit(p, alice, job("team-a", "explore", 24, 4 * 3600), kNow).message,
             Catch::Contains("forge-quota request --team team-a --tier explore --gpus 24 --time 4:00:00"));
}
