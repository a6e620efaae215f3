#!/usr/bin/env bash
# forge-quota end to end without Slurm: fake sacct, squeue and sacctmgr stand first on PATH.
# Usage: cli_test.sh FORGE_QUOTA_BINARY
set -u
bin=$1
src=${FORGE_SOURCE_DIR:?}
policy=$src/configs/quota.example.ini
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
[ -n "$tmp" ] && [ -d "$tmp" ] || { echo "FAIL: mktemp -d" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/runs/run-1"

# The rows both forge-quota and the independent computation below read.
cat >"$tmp/sacct.txt" <<'ROWS'
101|root|team-a|pretrain|train|COMPLETED|3600|billing=16,cpu=16,gres/gpu=16,mem=16000M,node=2|2026-02-02T00:00:00|2026-02-02T01:00:00|node[1-2]|train
102|alice|team-a|explore|train|PREEMPTED|1800|cpu=8,gres/gpu=8,node=1|2026-02-02T00:00:00|2026-02-02T00:30:00|node3|x
102|alice|team-a|explore|train|COMPLETED|7200|cpu=8,gres/gpu=8,node=1|2026-02-02T01:00:00|2026-02-02T03:00:00|node3|x
103|bob|team-b|finetune|train|FAILED|600|cpu=4,gres/gpu=4,node=1|2026-02-03T00:00:00|2026-02-03T00:10:00|node4|ft
104|bob|team-b|finetune|train|CANCELLED by 0|0||Unknown|Unknown|None assigned|never-ran
ROWS

# Job comments (sacct -o JobID,Comment): job 103's run directory is out of reach, its batch script left
# the summary; job 102's comment is somebody else's.
cat >"$tmp/comments.txt" <<'ROWS'
102|resubmitted after | maintenance
103|forge:{"tokens":1000000,"steps":50,"mfu":0.2,"ettr":0.9,"class":"failure","run":"/elsewhere/run"}
ROWS

# Fake commands: written with printf so no here-document nests inside this script.
printf '%s\n' '#!/usr/bin/env bash' \
  '[ "${TZ:-}" = UTC ] || { echo "sacct: TZ is not UTC" >&2; exit 1; }' \
  'for want in -a -X -D --parsable2 --noheader; do' \
  '  case " $* " in *" $want "*) ;; *) echo "sacct: missing $want in: $*" >&2; exit 1 ;; esac' \
  'done' \
  'case " $* " in *" JobID,Comment "*) cat "'"$tmp/comments.txt"'"; exit 0 ;; esac' \
  'case " $* " in *" JobID,AdminComment "*) cat "'"$tmp/admin_comments.txt"'"; exit 0 ;; esac' \
  "cat '$tmp/sacct.txt'" >"$tmp/bin/sacct"
printf '%s\n' '#!/usr/bin/env bash' \
  'echo "300|bob|team-b|explore|train|PENDING|0:00|2:00:00|cpu=1,gres/gpu=8,node=1"' >"$tmp/bin/squeue"
printf '%s\n' '#!/usr/bin/env bash' \
  'case "$*" in' \
  '  *"show qos"*) echo "normal|0||cluster|00:00:00||1.000000|" ;;' \
  '  *"show assoc"*) echo "team-a||||normal"; echo "team-a|root|||normal" ;;' \
  "  *) echo \"\$*\" >>'$tmp/sacctmgr.log' ;;" \
  'esac' >"$tmp/bin/sacctmgr"
chmod +x "$tmp/bin/sacct" "$tmp/bin/squeue" "$tmp/bin/sacctmgr"
: >"$tmp/admin_comments.txt"
export PATH="$tmp/bin:$PATH"
echo '{"job_id": "101", "tokens": 4000000, "mean_mfu": 0.5}' >"$tmp/runs/run-1/summary.json"

# check-policy resolves every user and group the policy names. On a machine without the example's users
# (alice, bob, carol, dave; groups forge-a, forge-b) it checks a copy that names root instead.
example=$policy
if ! getent passwd alice bob carol dave >/dev/null || ! getent group forge-a forge-b >/dev/null; then
  sed -E -e 's/^(members|approvers|admins) = .*/\1 = root, @root/' -e 's/^group = .*/group = root/' \
    "$policy" >"$tmp/example-here.ini"
  example=$tmp/example-here.ini
fi
out=$("$bin" check-policy "$example" 2>&1) || fail "check-policy rejects the example policy: $out"
# A name the machine does not know is refused with the line it is on.
sed -e '0,/^approvers = .*/s//approvers = zz-no-such-user-7f3e/' "$example" >"$tmp/unknown.ini"
line=$(grep -n '^approvers = zz-no-such-user-7f3e$' "$tmp/unknown.ini" | head -1 | cut -d: -f1)
[ -n "$line" ] || fail "could not write a policy with an unknown approver"
out=$("$bin" check-policy "$tmp/unknown.ini" 2>&1)
rc=$?
[ $rc -eq 64 ] || fail "check-policy of an unknown approver exited $rc, expected 64"
[ "$out" = "forge-quota: error: $tmp/unknown.ini:$line: approver 'zz-no-such-user-7f3e' of team team-a is not a user on this machine" ] ||
  fail "check-policy of an unknown approver said: $out"
sed -e '0,/^members = .*/s//members = root, @zz-no-such-group-7f3e/' "$example" >"$tmp/unknown-group.ini"
out=$("$bin" check-policy "$tmp/unknown-group.ini" 2>&1)
[ $? -eq 64 ] && [[ $out == *"member '@zz-no-such-group-7f3e' of team team-a is not a group on this machine"* ]] ||
  fail "check-policy of an unknown group said: $out"
printf '[policy]\ncluster = c\nperiod = weekly\n' >"$tmp/bad.ini"
out=$("$bin" check-policy "$tmp/bad.ini" 2>&1)
rc=$?
[ $rc -eq 64 ] || fail "check-policy of a bad file exited $rc, expected 64"
[[ $out == *"$tmp/bad.ini:3: period = weekly: must be one of: month, quarter, year"* ]] || fail "check-policy said: $out"
# layout: the one parser's facts for scripts; nodes from --policy, else FORGE_GPUS_PER_NODE, else 8
out=$(FORGE_GPUS_PER_NODE= "$bin" layout dp4,tp2,pp2) || fail "layout dp4,tp2,pp2 failed: $out"
[ "$out" = "layout=tp2,pp2,dp4 tp=2 cp=1 ep=1 dp=4 pp=2 ranks=16 nodes=2 tasks_per_node=8" ] || fail "layout said: $out"
out=$(FORGE_GPUS_PER_NODE=4 "$bin" layout tp2,pp1,dp5) || fail "layout with 4 GPUs per node failed: $out"
[[ $out == *" ranks=10 nodes=3 tasks_per_node=4" ]] || fail "layout with FORGE_GPUS_PER_NODE=4 said: $out"
out=$(FORGE_GPUS_PER_NODE=4 "$bin" layout tp2,pp1,dp4 --policy "$policy") || fail "layout --policy failed: $out"
[[ $out == *" nodes=1 tasks_per_node=8" ]] || fail "layout --policy (8 GPUs per node) said: $out"
out=$("$bin" layout tp2,tp2,pp1,dp1 2>&1)
rc=$?
[ $rc -eq 64 ] || fail "a bad layout exited $rc, expected 64"
[ "$out" = "forge-quota: error: 'tp2,tp2,pp1,dp1' is not a layout: tp is given twice; expected tpX,ppY,dpZ (and optionally cpN, epN) such as tp2,pp2,dp4" ] ||
  fail "a bad layout said: $out"
out=$(FORGE_GPUS_PER_NODE=x "$bin" layout tp1,pp1,dp1 2>&1)
[ $? -eq 64 ] && [[ $out == *"FORGE_GPUS_PER_NODE=x: expected a whole number"* ]] || fail "FORGE_GPUS_PER_NODE=x said: $out"
"$bin" layout >/dev/null 2>&1
[ $? -eq 64 ] || fail "layout without an argument is not exit 64"
"$bin" frobnicate >/dev/null 2>&1
[ $? -eq 64 ] || fail "an unknown command is not exit 64"
"$bin" report --policy "$policy" --by colour >/dev/null 2>&1
[ $? -eq 64 ] || fail "--by colour is not exit 64"

# sync twice (idempotent), then report
common=(--policy "$policy" --ledger "$tmp/ledger.db" --snapshot "$tmp/state/usage.json")
for i in 1 2; do
  "$bin" sync "${common[@]}" -S 2026-02-01 -E 2026-03-01 --runs "$tmp/runs" >"$tmp/sync.out" 2>&1 ||
    fail "sync $i failed: $(cat "$tmp/sync.out")"
done
grep -q "4 runs" "$tmp/sync.out" || fail "sync did not report 4 runs: $(cat "$tmp/sync.out")"
[ "$(stat -c %a "$tmp/state/usage.json")" = 644 ] || fail "snapshot is not mode 644"
"$bin" report "${common[@]}" --by team -S 2026-02-01 -E 2026-03-01 --format json >"$tmp/report.json" ||
  fail "report failed"
expected=$(awk -F'|' '$9 != "Unknown" { match($8, /gres\/gpu=[0-9]+/); g = substr($8, RSTART + 9, RLENGTH - 9);
                       h[$3] += $7 * g / 3600 } END { for (a in h) printf "%s=%.6f\n", a, h[a] }' "$tmp/sacct.txt" | sort)
got=$(/usr/bin/python3 -c 'import json,sys
for r in json.load(open(sys.argv[1])): print("%s=%.6f" % (r["team"], r["gpu_hours"]))' "$tmp/report.json" | sort)
[ -n "$got" ] && [ "$got" = "$expected" ] || fail "report GPU-hours '$got' differ from the sacct rows' '$expected'"
/usr/bin/python3 - "$tmp/report.json" <<'PY' || fail "report JSON rows lack the documented keys or values"
import json, sys
rows = json.load(open(sys.argv[1]))
a = [r for r in rows if r["team"] == "team-a"][0]
for k in ("gpu_hours", "cost", "jobs", "wasted_gpu_hours", "tokens", "cost_per_mtoken", "mfu"):
    assert k in a, k
assert a["jobs"] == 2 and a["tokens"] == 4e6 and abs(a["wasted_gpu_hours"] - 4.0) < 1e-9, a
assert abs(a["mfu"] - 0.5) < 1e-9, a
b = [r for r in rows if r["team"] == "team-b"][0]  # from job 103's comment
assert b["tokens"] == 1e6 and abs(b["mfu"] - 0.2) < 1e-9, b
PY
for fmt in table csv html; do
  "$bin" report "${common[@]}" --by user -S 2026-02-01 -E 2026-03-01 --format $fmt >"$tmp/r.$fmt" ||
    fail "report --format $fmt"
done
grep -q "^user,gpu_hours,cost" "$tmp/r.csv" || fail "csv header"
grep -q "<svg" "$tmp/r.html" || fail "html has no chart"

# status of the current period: the fixture rows are from another month, so only the pending job counts
"$bin" status "${common[@]}" --format json >"$tmp/status.json" || fail "status failed"
/usr/bin/python3 - "$tmp/status.json" <<'PY' || fail "status JSON is wrong: $(cat "$tmp/status.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
b = [r for r in rows if r["team"] == "team-b"][0]
for k in ("team", "budget_gpu_hours", "used_gpu_hours", "reserved_gpu_hours", "remaining_gpu_hours"):
    assert k in b, k
assert abs(b["reserved_gpu_hours"] - 8.0) < 1e-9, b  # 8 GPUs x 2 h x explore's charge 0.5
PY
"$bin" status "${common[@]}" --team team-z >/dev/null 2>&1
[ $? -eq 64 ] || fail "status --team team-z is not exit 64"
# The same status as gauges for node_exporter's textfile collector, written atomically with -o.
"$bin" status "${common[@]}" --format prom -o "$tmp/forge_quota.prom" || fail "status --format prom failed"
promtool check metrics <"$tmp/forge_quota.prom" >"$tmp/promtool.out" 2>&1 ||
  fail "promtool rejects the status gauges: $(cat "$tmp/promtool.out")"
grep -qx 'forge_quota_reserved_gpu_seconds{cluster="forge",team="team-b"} 28800' "$tmp/forge_quota.prom" ||
  fail "no team-b reserved gauge of 8 GPU-hours: $(cat "$tmp/forge_quota.prom")"
grep -q '^forge_quota_budget_gpu_seconds{cluster="forge",team="team-a"} 72000000$' "$tmp/forge_quota.prom" ||
  fail "no team-a budget gauge"

# apply: the dry run prints the plan, apply runs exactly that plan
"$bin" apply --policy "$policy" --dry-run >"$tmp/dry.out" || fail "apply --dry-run failed"
[ ! -e "$tmp/sacctmgr.log" ] || fail "apply --dry-run ran sacctmgr commands"
grep -q "sacctmgr -i add qos pretrain" "$tmp/dry.out" || fail "dry run lacks 'add qos pretrain': $(cat "$tmp/dry.out")"
"$bin" apply --policy "$policy" >/dev/null || fail "apply failed"
[ "$(wc -l <"$tmp/sacctmgr.log")" -eq "$(grep -c '^sacctmgr -i' "$tmp/dry.out")" ] || fail "apply ran a different plan"

# Approvals. admit is for the controller (root, or the policy file's owner): one line on stdout.
cp "$policy" "$tmp/policy.ini"
ap=(--policy "$tmp/policy.ini" --ledger "$tmp/ledger.db")
me=$(id -u)
out=$("$bin" admit "${ap[@]}" --uid "$me" --team team-a --tier explore --gpus 8 --minutes 60)
rc=$?
if [ "$(id -un)" = root ]; then
  [ $rc -eq 0 ] && [ "$out" = "admit partition=train approval=-" ] || fail "admit of a small job said ($rc): $out"
  out=$("$bin" admit "${ap[@]}" --uid 0 --team team-a --tier explore --gpus 24 --minutes 240)
  rc=$?
  [ $rc -eq 1 ] || fail "admit of a job that needs an approval exited $rc, expected 1"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "admit printed more than one line: $out"
  [[ $out == "reject this job needs an approval: 24 GPUs is more than the 16 a job may take without approval;"* ]] &&
    [[ $out == *"'forge-quota request --team team-a --tier explore --gpus 24 --time 4:00:00 --reason \"...\"'"* ]] ||
    fail "admit of a job that needs an approval said: $out"
  out=$("$bin" admit "${ap[@]}" --uid 0 --team team-a --tier explore --gpus 24 --minutes 240 --approval '%n%s%x')
  [ $? -eq 1 ] && [ "$out" = "reject approval id '%n%s%x' is malformed (expected apr- and 12 hex digits)" ] ||
    fail "admit with a malformed id said: $out"
  out=$("$bin" admit "${ap[@]}" --uid 0 --team team-a --tier explore --gpus 1 --minutes 10 --partition eval)
  [ $? -eq 1 ] && [[ $out == "reject partition 'eval' (pool eval) does not take tier 'explore' jobs"* ]] ||
    fail "admit to the eval partition said: $out"
fi
"$bin" admit --policy /nonexistent.ini --uid 0 --team team-a --tier explore --gpus 1 --minutes 1 >"$tmp/admit.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 1 ] && ! grep -q '^admit ' "$tmp/admit.out" || fail "admit without a policy exited $rc: $(cat "$tmp/admit.out")"

# request: the id alone on stdout, who can approve it on stderr
id=$("$bin" request "${ap[@]}" --team team-a --tier explore --gpus 24 --time 4:00:00 --reason "scaling, test" 2>"$tmp/request.err")
rc=$?
if [ "$(id -un)" = root ]; then
  [ $rc -eq 0 ] && [[ $id =~ ^apr-[0-9a-f]{12}$ ]] || fail "request printed '$id' (exit $rc): $(cat "$tmp/request.err")"
  grep -q "(carol) runs: forge-quota approve $id" "$tmp/request.err" || fail "request's hint: $(cat "$tmp/request.err")"
  out=$("$bin" approve "${ap[@]}" "$id" 2>&1)
  [ $? -eq 64 ] && [[ $out == *"user root may not decide requests of team team-a; its approvers: carol"* ]] ||
    fail "approve by a non-approver said: $out"
  out=$("$bin" request "${ap[@]}" --team team-a --tier explore --gpus 24 --time 9:00:00 --reason x 2>&1)
  [ $? -eq 64 ] && [[ $out == *"--time 9:00:00 is over tier 'explore''s max wall 4:00:00"* ]] || fail "request over the max wall said: $out"

  # report --approvals in each format
  "$bin" report "${ap[@]}" --approvals >"$tmp/approvals.txt" || fail "report --approvals failed"
  head -1 "$tmp/approvals.txt" | grep -Eq '^id +team +tier +gpus +time +requester +state +decided_by +decided_at +expires +uses +jobs +reason$' ||
    fail "report --approvals table header: $(head -1 "$tmp/approvals.txt")"
  grep -Eq "^$id +team-a +explore +24 +4:00:00 +root +pending +- +- +- +0/0 +- +scaling, test$" "$tmp/approvals.txt" ||
    fail "report --approvals row: $(cat "$tmp/approvals.txt")"
  "$bin" report "${ap[@]}" --approvals --format csv >"$tmp/approvals.csv" || fail "report --approvals csv"
  [ "$(head -1 "$tmp/approvals.csv")" = "id,team,tier,gpus,time,requester,reason,state,decided_by,decided_at,expires,uses_used,uses_allowed,job_ids" ] ||
    fail "csv header: $(head -1 "$tmp/approvals.csv")"
  grep -qx "$id,team-a,explore,24,4:00:00,root,\"scaling, test\",pending,,,,0,0," "$tmp/approvals.csv" || fail "csv row: $(cat "$tmp/approvals.csv")"
  "$bin" report "${ap[@]}" --approvals --format json >"$tmp/approvals.json" || fail "report --approvals json"
  /usr/bin/python3 - "$tmp/approvals.json" "$id" <<'PY' || fail "report --approvals json: $(cat "$tmp/approvals.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 1, rows
r = rows[0]
assert r["id"] == sys.argv[2] and r["team"] == "team-a" and r["tier"] == "explore" and r["gpus"] == 24, r
assert r["time_limit_s"] == 14400 and r["time"] == "4:00:00" and r["requester"] == "root", r
assert r["state"] == "pending" and r["decided_by"] is None and r["expires_at"] is None, r
assert r["uses_used"] == 0 and r["uses_allowed"] == 0 and r["job_ids"] == [] and r["reason"] == "scaling, test", r
PY
  "$bin" report "${ap[@]}" --approvals --format html >/dev/null 2>&1
  [ $? -eq 64 ] || fail "report --approvals --format html is not exit 64"
fi

# As root, the rest of the story with a second user: nobody approves, root's job is admitted with the
# approval, sync learns its job id from AdminComment, and nobody sees only the team it approves for.
if [ "$(id -un)" = root ] && command -v setpriv >/dev/null && getent passwd nobody >/dev/null; then
  as_nobody() { setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$@"; }
  sed -i -e '0,/^approvers = carol$/s//approvers = nobody/' "$tmp/policy.ini"
  chmod 755 "$tmp"
  chmod 644 "$tmp/policy.ini"
  chmod 666 "$tmp/ledger.db" "$tmp/ledger.db-wal" "$tmp/ledger.db-shm" || fail "the ledger lacks its -wal and -shm files"
  out=$(as_nobody "$bin" approve "${ap[@]}" "$id" --uses 2 --note "go ahead" 2>&1) ||
    fail "approve as nobody failed: $out"
  [[ $out == "approved $id: team team-a, tier explore, up to 24 GPUs for 4:00:00, 2 use(s), expires "*" UTC" ]] ||
    fail "approve said: $out"
  out=$("$bin" admit "${ap[@]}" --uid 0 --team team-a --tier explore --gpus 24 --minutes 240 --approval "$id")
  [ $? -eq 0 ] && [ "$out" = "admit partition=train approval=$id" ] || fail "admit with the approval said: $out"
  out=$(as_nobody "$bin" admit "${ap[@]}" --uid 0 --team team-a --tier explore --gpus 1 --minutes 1 2>&1)
  [ $? -eq 64 ] && [[ $out == *"admit is for the controller"* ]] || fail "admit as nobody said: $out"
  # ... unless the policy names nobody as the controller (the user slurmctld runs as).
  sed 's/^controller = .*/controller = nobody/' "$tmp/policy.ini" >"$tmp/policy-nobody.ini"
  chmod 644 "$tmp/policy-nobody.ini"
  out=$(as_nobody "$bin" admit --policy "$tmp/policy-nobody.ini" --ledger "$tmp/ledger.db" --uid 0 --team team-a \
    --tier explore --gpus 1 --minutes 1 2>&1)
  [ $? -eq 0 ] && [ "$out" = "admit partition=train approval=-" ] || fail "admit as the policy's controller said: $out"
  echo "105|forge-elastic:nodes=1-2 forge-approval=$id" >"$tmp/admin_comments.txt"
  "$bin" sync "${ap[@]}" --snapshot "$tmp/state/usage.json" -S 2026-02-01 -E 2026-03-01 >"$tmp/sync.out" 2>&1 ||
    fail "sync failed: $(cat "$tmp/sync.out")"
  grep -q "1 approved job(s)" "$tmp/sync.out" || fail "sync did not record the approved job: $(cat "$tmp/sync.out")"
  "$bin" report "${ap[@]}" --approvals --format json >"$tmp/approvals.json" || fail "report --approvals json"
  /usr/bin/python3 - "$tmp/approvals.json" <<'PY' || fail "approval after use: $(cat "$tmp/approvals.json")"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["state"] == "approved" and r["decided_by"] == "nobody" and r["note"] == "go ahead", r
assert r["uses_used"] == 1 and r["uses_allowed"] == 2 and r["job_ids"] == ["105"], r
PY
  out=$(as_nobody "$bin" status "${ap[@]}" 2>&1) || fail "status as nobody failed: $out"
  [[ $out == *"team-a"* ]] && [[ $out != *"team-b"* ]] && [[ $out == *"(showing teams team-a; admins see all)"* ]] ||
    fail "status as nobody: $out"
  out=$(as_nobody "$bin" report "${ap[@]}" --by team -S 2026-02-01 -E 2026-03-01 2>&1) || fail "report as nobody: $out"
  [[ $out == *"(showing teams team-a; admins see all)"* ]] && [[ $out != *"team-b"* ]] || fail "report as nobody: $out"
  out=$(as_nobody "$bin" report "${ap[@]}" --approvals 2>&1) || fail "report --approvals as nobody: $out"
  [[ $out == *"$id"* ]] && [[ $out == *"(showing teams team-a; admins see all)"* ]] || fail "report --approvals as nobody: $out"
fi

# Installed setgid (AT_SECURE), forge-quota reads only the system policy and runs no apply or sync. Root
# can make such a copy where the file system honours setgid bits.
if [ "$(id -un)" = root ] && ! findmnt -no OPTIONS -T "$tmp" | grep -qw nosuid && getent group nogroup >/dev/null; then
  mkdir "$tmp/sg"
  cp "$bin" "$tmp/sg/forge-quota"
  chgrp nogroup "$tmp/sg/forge-quota"
  chmod 2755 "$tmp/sg/forge-quota"
  sg=$tmp/sg/forge-quota
  out=$("$sg" sync --policy "$tmp/policy.ini" 2>&1)
  [ $? -eq 64 ] && [[ $out == *"forge-quota runs setgid: 'sync' needs the unprivileged forge-quota"* ]] || fail "setgid sync said: $out"
  out=$("$sg" status --policy "$tmp/policy.ini" 2>&1)
  [ $? -eq 64 ] && [[ $out == *"forge-quota runs setgid: it reads only the system policy "*", not '$tmp/policy.ini'"* ]] ||
    fail "setgid status with --policy said: $out"
  out=$(FORGE_QUOTA_POLICY=$tmp/policy.ini "$sg" report --approvals 2>&1)
  [ $? -eq 64 ] && [[ $out == *"reads only the system policy"* ]] || fail "setgid with FORGE_QUOTA_POLICY said: $out"
  # check-policy and layout give the group up and read what the caller may.
  "$sg" check-policy "$example" >/dev/null 2>&1 || fail "setgid check-policy of the example failed"
  out=$("$sg" layout tp2,pp1,dp4) || fail "setgid layout failed: $out"
fi
echo "ok"
