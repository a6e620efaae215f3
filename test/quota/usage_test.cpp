#include "forge/quota/usage.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/quota/accounting.h"
#include "forge/quota/apply.h"
#include "forge/quota/ledger.h"
#include "forge/quota/report.h"
#include "forge/quota/snapshot.h"
#include "support/paths.h"

#include <sys/stat.h>
#include <catch2/catch.hpp>
#include <tuple>

#include "../support/temp_dir.h"

using namespace forge::quota;

namespace {

const Policy& policy() {
  static const Policy p = load_policy(forge::test::source_path("configs/quota.example.ini"));
  return p;
}

// Rows as `sacct -a -X -D -P -n -o kSacctFields` prints them (JobName last).
const char* kSacct =
    "101|root|team-a|pretrain|train|COMPLETED|3600|billing=16,cpu=16,gres/gpu=16,mem=16000M,node=2|"
    "2026-02-02T00:00:00|2026-02-02T01:00:00|node[1-2]|train|a|b\n"
    "102|alice|team-a|explore|train|PREEMPTED|1800|cpu=8,gres/gpu=8,node=1|2026-02-02T00:00:00|"
    "2026-02-02T00:30:00|node3|x\n"
    "102|alice|team-a|explore|train|COMPLETED|7200|cpu=8,gres/gpu=8,node=1|2026-02-02T01:00:00|"
    "2026-02-02T03:00:00|node3|x\n"
    "103|bob|team-b|finetune|train|FAILED|600|cpu=4,gres/gpu:h100=4,node=1|2026-02-03T00:00:00|"
    "2026-02-03T00:10:00|node4|ft\n"
    "104|bob|team-b|finetune|train|CANCELLED by 0|0||Unknown|Unknown|None assigned|never-ran\n"
    "105|root|team-a|normal|train|RUNNING|900|cpu=1,gres/"
    "gpu=2,node=1|2026-02-04T00:00:00|Unknown|node1|run\n";

int64_t ts(const char* s) {
  return *parse_slurm_timestamp(s);
}

}  // namespace

TEST_CASE("sacct rows parse: requeued runs kept apart, never-started rows skipped, '|' in JobName") {
  const auto runs = parse_sacct(kSacct);
  REQUIRE(runs.size() == 5);
  CHECK(runs[0].job_name == "train|a|b");
  CHECK(runs[0].gpus == 16);
  CHECK(runs[0].start == ts("2026-02-02T00:00:00"));
  CHECK(runs[1].job_id == runs[2].job_id);
  CHECK(runs[1].start != runs[2].start);
  CHECK(runs[3].gpus == 4);
  CHECK(runs[3].gpu_type == "h100");
  CHECK(runs[4].end == 0);
  CHECK(runs[4].state == "RUNNING");
  CHECK_THROWS_AS(parse_sacct("1|2|3\n"), forge::Error);
  CHECK_THROWS_WITH(parse_sacct("1|u|a|q|p|S|x|gres/gpu=1|2026-01-01T00:00:00|Unknown|n|j\n"),
                    Catch::Contains("line 1: ElapsedRaw 'x'"));
}

TEST_CASE("GPU-hours: ElapsedRaw x GPUs / 3600, clipped to the window by share of wall span") {
  const auto runs = parse_sacct(kSacct);
  const int64_t day = ts("2026-02-02T00:00:00");
  CHECK(gpu_hours_in(runs[0], 0, INT64_MAX) == Approx(16.0));
  CHECK(gpu_hours_in(runs[0], day, day + 1800) == Approx(8.0));
  CHECK(gpu_hours_in(runs[0], day + 3600, day + 7200) == 0.0);
  CHECK(gpu_hours_in(runs[4], 0, INT64_MAX) == Approx(0.5));  // running: as far as sacct saw it
  CHECK(gpus_in_tres("cpu=1,gres/gpu:a100=2,gres/gpu:h100=2") == 4);
  CHECK(gpus_in_tres("cpu=1,gres/gpu=3,gres/gpu:a100=3") == 3);
  CHECK(gpus_in_tres("cpu=1,mem=1G") == 0);
  CHECK(is_wasted_state("PREEMPTED"));
  CHECK(is_wasted_state("FAILED"));
  CHECK_FALSE(is_wasted_state("COMPLETED"));
  CHECK_FALSE(is_wasted_state("CANCELLED"));
}

TEST_CASE("squeue rows parse, padded or not") {
  const auto q = parse_squeue(
      "200                 |root      |team-a    |pretrain  |gpu       |RUNNING   |1:00:00   |2-00:00:00|"
      "cpu=16,gres/gpu=16,node=2\n"
      "201|bob|team-b|finetune|train|PENDING|0:00|UNLIMITED|cpu=1,gres/gpu=8,node=1\n");
  REQUIRE(q.size() == 2);
  CHECK(q[0].elapsed_s == 3600);
  CHECK(q[0].time_limit_s == 48 * 3600);
  CHECK(q[0].gpus == 16);
  CHECK(q[1].time_limit_s == 0);
  // Running: 16 GPUs x 47 h left; pending UNLIMITED: 8 x the tier's 24 h.
  CHECK(reserved_gpu_hours(policy(), q[0]) == Approx(16 * 47.0));
  CHECK(reserved_gpu_hours(policy(), q[1]) == Approx(8 * 24.0));
}

TEST_CASE("the ledger is idempotent: re-syncing the same rows counts nothing twice") {
  forge::test::TempDir dir;
  const auto runs = parse_sacct(kSacct);
  {
    Ledger l(dir / "ledger.db");
    l.record(runs, {}, {{"101", {2e6, 0.4, {}}}}, 1000);
    l.record(runs, {}, {{"101", {2e6, 0.4, {}}}}, 2000);
  }
  Ledger l(dir / "ledger.db");
  CHECK(l.last_sync() == 2000);
  const auto back = l.runs(0, INT64_MAX);
  REQUIRE(back.size() == runs.size());
  CHECK(back[0] == runs[0]);
  // A running job's row is updated in place when sacct reports it again.
  auto later = runs;
  later[4].elapsed_s = 1800;
  l.record(later, {}, {}, 3000);
  const auto again = l.runs(0, INT64_MAX);
  REQUIRE(again.size() == runs.size());
  CHECK(again.back().elapsed_s == 1800);
  CHECK(l.summaries().at("101").tokens == 2e6);
  // WAL mode, as `sync` and the readers run concurrently.
  CHECK(std::filesystem::exists(dir / "ledger.db-wal"));
  // Window query: runs overlapping Feb 3.
  CHECK(l.runs(ts("2026-02-03T00:00:00"), ts("2026-02-04T00:00:00")).size() == 1);
}

TEST_CASE("status: used (charged) and reserved per team and tier") {
  const auto runs = parse_sacct(kSacct);
  const auto q = parse_squeue("300|bob|team-b|explore|train|PENDING|0:00|2:00:00|gres/gpu=8\n");
  const int64_t from = ts("2026-02-01T00:00:00"), to = ts("2026-03-01T00:00:00");
  const auto st = compute_status(policy(), runs, q, from, to);
  REQUIRE(st.size() == 2);
  // team-a: 16 (pretrain) + (4 + 16) x 0.5 (explore) + 0.5 (normal, charge 1) = 26.5
  CHECK(st[0].team == "team-a");
  CHECK(st[0].used_gpu_hours == Approx(26.5));
  CHECK(st[0].tiers.at("explore").used_gpu_hours == Approx(10.0));
  CHECK(st[0].remaining_gpu_hours == Approx(20000 - 26.5));
  // team-b: 4 GPUs x 600 s = 0.6667 used; reserved 8 x 2 h x 0.5 = 8
  CHECK(st[1].used_gpu_hours == Approx(4 * 600 / 3600.0));
  CHECK(st[1].reserved_gpu_hours == Approx(8.0));
  const auto json = forge::Json::parse(render_status_json(st));
  for (const char* key :
       {"team", "budget_gpu_hours", "used_gpu_hours", "reserved_gpu_hours", "remaining_gpu_hours"})
    CHECK(json[0].contains(key));
}

TEST_CASE("the snapshot round-trips and is written world-readable") {
  forge::test::TempDir dir;
  UsageSnapshot s;
  s.generated_at = 1771000000;
  s.period_start = 1769904000;
  s.period_end = 1772323200;
  s.teams["team-a"] = {12.5, 3.25, 16};
  const std::string path = dir / "sub/usage.json";
  ::umask(077);
  write_snapshot(path, s);
  ::umask(022);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  std::string why;
  const auto back = read_snapshot(path, &why);
  REQUIRE(back);
  CHECK(back->teams.at("team-a").used_gpu_hours == 12.5);
  CHECK(back->teams.at("team-a").running_gpus == 16);
  CHECK_FALSE(read_snapshot(dir / "none.json", &why));
  CHECK_THAT(why, Catch::Contains("cannot be read"));
  CHECK_FALSE(read_snapshot(dir.write("bad.json", "{\"format\": 1"), &why));
  CHECK_THAT(why, Catch::Contains("malformed"));
}

TEST_CASE("report: GPU-hours, cost, jobs, waste, tokens and MFU per group") {
  const auto runs = parse_sacct(kSacct);
  const std::map<std::string, RunSummary> sums = {{"101", {4e6, 0.5, {}}}, {"102", {1e6, 0.3, {}}}};
  const int64_t from = ts("2026-02-01T00:00:00"), to = ts("2026-03-01T00:00:00");
  const Report r = build_report(policy(), runs, sums, GroupBy::kTeam, from, to);
  REQUIRE(r.rows.size() == 2);
  const ReportRow& a = r.rows[0];
  CHECK(a.key == "team-a");
  CHECK(a.gpu_hours == Approx(16 + 4 + 16 + 0.5));
  CHECK(a.jobs == 3);
  CHECK(a.wasted_gpu_hours == Approx(4.0));
  // partition train: 2.50 per GPU-hour, times the tier's charge.
  CHECK(a.cost == Approx(16 * 2.5 + 20 * 2.5 * 0.5 + 0.5 * 2.5));
  CHECK(a.tokens == 5e6);
  CHECK(*a.cost_per_mtoken == Approx((40.0 + 25.0) / 5.0));
  CHECK(*a.mfu == Approx((0.5 * 16 + 0.3 * 20) / 36));
  const ReportRow& b = r.rows[1];
  CHECK(b.cost == Approx(4 * 600 / 3600.0 * 4.0));  // gpu_type h100 price wins over the partition
  CHECK_FALSE(b.cost_per_mtoken);
  CHECK(r.total.gpu_hours == Approx(a.gpu_hours + b.gpu_hours));

  const auto json = forge::Json::parse(render_report_json(r));
  for (const char* key :
       {"team", "gpu_hours", "cost", "jobs", "wasted_gpu_hours", "tokens", "cost_per_mtoken", "mfu", "ettr"})
    CHECK(json[0].contains(key));
  CHECK(json[1]["cost_per_mtoken"].is_null());
  const std::string csv = render_report_csv(r);
  CHECK(csv.rfind("team,gpu_hours,cost,jobs,wasted_gpu_hours,tokens,cost_per_mtoken,mfu,ettr\n", 0) == 0);
  const std::string html = render_report_html(r);
  CHECK_THAT(html, Catch::Contains("<svg") && Catch::Contains("</html>"));
  const Report by_job = build_report(policy(), runs, sums, GroupBy::kJob, from, to);
  CHECK(by_job.rows.size() == 4);
  const Report by_tier = build_report(policy(), runs, sums, GroupBy::kTier, from, to);
  CHECK(by_tier.rows.size() == 4);  // pretrain, explore, finetune, normal
}

TEST_CASE("waste: the work after the last committed checkpoint plus restart time; ETTR from kept step time") {
  const auto runs = parse_sacct(kSacct);
  const double t0 = double(ts("2026-02-02T00:00:00")), t1 = double(ts("2026-02-02T01:00:00"));
  // Job 102 (8 GPUs): preempted after 1800 s with a checkpoint 2 s before the end, requeued, resumed (30 s
  // start-up) and finished in 7200 s.
  const RunSegment preempted{"102", t0 + 5, t0 + 1799, false, 20, 1700, 2, "preempted"};
  const RunSegment resumed{"102", t1 + 3, t1 + 7199, true, 30, 7000, 0, "ok"};
  const std::map<std::string, RunSummary> sums = {{"102", {1e6, 0.3, {preempted, resumed}}}};
  const int64_t from = ts("2026-02-01T00:00:00"), to = ts("2026-03-01T00:00:00");
  const Report r = build_report(policy(), runs, sums, GroupBy::kTeam, from, to);
  REQUIRE(r.rows.size() == 2);
  const ReportRow& a = r.rows[0];
  // Not the preempted run's 4 GPU-hours: 2 s of it, and the resumed run's 30 s start-up.
  CHECK(a.wasted_gpu_hours == Approx(8 * 2 / 3600.0 + 8 * 30 / 3600.0));
  CHECK(*a.ettr == Approx((8 * 1700 + 8 * 7000) / 3600.0 / 20.0));
  // Job 103 recorded nothing: sacct says FAILED, all of it is lost, and it has no ETTR.
  CHECK(r.rows[1].wasted_gpu_hours == Approx(4 * 600 / 3600.0));
  CHECK_FALSE(r.rows[1].ettr);
  CHECK(forge::Json::parse(render_report_json(r))[0]["ettr"].get<double>() == Approx(*a.ettr));

  // The ledger keeps each segment under its own job id: a run directory continued by a later job holds
  // the earlier job's segments too.
  forge::test::TempDir dir;
  RunSegment earlier = preempted;
  earlier.job_id = "99";
  {
    Ledger l(dir / "ledger.db");
    l.record(runs, {}, {{"102", {1e6, 0.3, {earlier, preempted, resumed}}}}, 1000);
  }
  const auto back = Ledger(dir / "ledger.db").summaries();
  CHECK(back.at("102").segments == std::vector<RunSegment>{preempted, resumed});
  CHECK(back.at("99").segments == std::vector<RunSegment>{earlier});
  CHECK(back.at("99").tokens == 0);
}

TEST_CASE("job comments: the batch scripts' run summaries, other comments ignored") {
  const auto c = parse_job_comments(
      "201|forge:{\"tokens\":4096,\"steps\":8,\"mfu\":0.25,\"ettr\":0.5,\"class\":\"ok\",\"run\":\"/"
      "r\\u007cx\"}\n"
      "202|someone else's note | with a bar\n"
      "203|\n"
      "204|forge:{not json\n");
  REQUIRE(c.size() == 1);
  CHECK(c.at("201").tokens == 4096);
  CHECK(*c.at("201").mfu == 0.25);
}

TEST_CASE("report by job: the costliest first, job ids as numbers, small jobs readable, the rest folded") {
  // Jobs 2, 10 and 9 cost the same; 19 costs most; 3 ran 40 s on one GPU.
  std::vector<RunRecord> runs;
  for (const auto& [id, seconds, gpus] : std::vector<std::tuple<const char*, int, int>>{
           {"2", 600, 4}, {"10", 600, 4}, {"19", 3600, 8}, {"3", 40, 1}, {"9", 600, 4}}) {
    RunRecord r;
    r.job_id = id;
    r.user = "alice";
    r.account = "team-a";
    r.qos = "explore";
    r.partition = "train";
    r.start = 100;
    r.end = 100 + seconds;
    r.elapsed_s = seconds;
    r.gpus = gpus;
    runs.push_back(r);
  }
  Report rep = build_report(policy(), runs, {{"19", {1e6, 0.4, {}}}}, GroupBy::kJob, 0, 10000);
  std::vector<std::string> order;
  for (const auto& row : rep.rows) order.push_back(row.key);
  CHECK(order == std::vector<std::string>{"19", "2", "9", "10", "3"});
  CHECK(format_amount(40.0 / 3600) == "0.0111");
  CHECK(format_amount(8.0) == "8.00");
  CHECK(format_amount(123.456) == "123");
  CHECK_THAT(render_report_table(rep), Catch::Contains(" 0.0111 "));
  CHECK_THAT(render_report_html(rep), Catch::Contains("0.0111 GPU-h"));

  const ReportRow total = rep.total;
  keep_costliest(rep, 2);
  REQUIRE(rep.rows.size() == 3);
  CHECK(rep.rows[1].key == "2");
  const ReportRow& other = rep.rows[2];
  CHECK(other.key == "other (3)");
  CHECK(other.jobs == 3);
  CHECK(other.gpu_hours == Approx(total.gpu_hours - rep.rows[0].gpu_hours - rep.rows[1].gpu_hours));
  CHECK(other.cost == Approx(total.cost - rep.rows[0].cost - rep.rows[1].cost));
  CHECK_FALSE(other.mfu);
  CHECK(rep.total.gpu_hours == total.gpu_hours);
  keep_costliest(rep, 2);  // nothing more to fold
  CHECK(rep.rows.size() == 3);
}

TEST_CASE("report HTML escapes names") {
  RunRecord r;
  r.job_id = "1";
  r.user = "<script>x</script>";
  r.start = 10;
  r.end = 20;
  r.elapsed_s = 10;
  r.gpus = 1;
  const Report rep = build_report(policy(), {r}, {}, GroupBy::kUser, 0, 100);
  const std::string html = render_report_html(rep);
  CHECK(html.find("<script>") == std::string::npos);
  CHECK_THAT(html, Catch::Contains("&lt;script&gt;"));
}

TEST_CASE("apply plans QOS and accounts from scratch, and nothing once Slurm matches") {
  const std::string qos0 = "normal|0||cluster|00:00:00||1.000000|\n";
  const std::string assoc0 = "root|||||\n";
  SlurmState st = parse_slurm_state(qos0, "root|root|||normal\n");
  const auto plan = plan_apply(policy(), st);
  std::string all;
  for (const auto& c : plan) all += shell_line(c) + "\n";
  CHECK_THAT(all, Catch::Contains("sacctmgr -i add qos pretrain\n"));
  CHECK_THAT(all, Catch::Contains("modify qos where name=pretrain set Priority=100 Preempt=explore "
                                  "PreemptMode=requeue GraceTime=0 Flags+=DenyOnLimit UsageFactor=1 "
                                  "MaxWall=2-00:00:00"));
  CHECK_THAT(all,
             Catch::Contains("modify qos where name=explore set Priority=10 Preempt= PreemptMode=requeue "
                             "GraceTime=30 Flags+=DenyOnLimit UsageFactor=0.5 MaxWall=04:00:00"));
  CHECK_THAT(all, Catch::Contains("add account team-a Cluster=forge 'Description=forge team team-a'"));
  CHECK_THAT(all,
             Catch::Contains("modify account where name=team-b cluster=forge set GrpTRESMins=gres/gpu=120000 "
                             "GrpTRES=gres/gpu=16 QOS=eval,explore,finetune,normal"));
  CHECK_THAT(all, Catch::Contains("add user bob Account=team-b Cluster=forge"));
  // Every add comes before the modify that names it.
  CHECK(all.find("add qos explore") < all.find("Preempt=explore"));

  // What sacctmgr shows after that plan ran: nothing left to do.
  const std::string qos1 = qos0 +
                           "eval|60|explore|requeue|00:00:00|DenyOnLimit|1.000000|04:00:00\n"
                           "explore|10||requeue|00:00:30|DenyOnLimit|0.500000|04:00:00\n"
                           "finetune|50|explore|requeue|00:00:00|DenyOnLimit|1.000000|1-00:00:00\n"
                           "pretrain|100|explore|requeue|00:00:00|DenyOnLimit|1.000000|2-00:00:00\n";
  const std::string assoc1 =
      "team-a||gres/gpu=1200000|gres/gpu=32|eval,explore,normal,pretrain\n"
      "team-a|root|||eval,explore,normal,pretrain\n"
      "team-a|alice|||eval,explore,normal,pretrain\n"
      "team-b||gres/gpu=120000|gres/gpu=16|eval,explore,finetune,normal\n"
      "team-b|bob|||eval,explore,finetune,normal\n";
  CHECK(plan_apply(policy(), parse_slurm_state(qos1, assoc1)).empty());
  // A drifted value is corrected, and only that value.
  std::string drift = assoc1;
  drift.replace(drift.find("gres/gpu=32"), 11, "gres/gpu=64");
  const auto fix = plan_apply(policy(), parse_slurm_state(qos1, drift));
  REQUIRE(fix.size() == 1);
  CHECK(shell_line(fix[0]) ==
        "sacctmgr -i modify account where name=team-a cluster=forge set GrpTRES=gres/gpu=32");
  // A user holding a tier QOS the team may not use loses it.
  const auto strip =
      plan_apply(policy(), parse_slurm_state(qos1, assoc1 + "team-b|root|||explore,normal,pretrain\n"));
  REQUIRE(strip.size() == 1);
  CHECK(shell_line(strip[0]) ==
        "sacctmgr -i modify user where name=root account=team-b cluster=forge set "
        "QOS=eval,explore,finetune,normal");
  (void)assoc0;
}
