#!/usr/bin/env bash
# forge-quota against the dev cluster: apply is idempotent and writes the limits into Slurm; sync +
# report GPU-hours equal an independent computation from the same sacct rows; status reports budgets.
# Usage: slurm_accounting.sh FORGE_QUOTA_BINARY
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../spank_plugin" && pwd)
# shellcheck source=../spank_plugin/slurm_lib.sh
source "$HERE/slurm_lib.sh"

# --- apply: once to converge, then nothing left to change ---------------------------------------------
"$FORGE_QUOTA" apply --policy "$POLICY" >"$WORK/apply1.out" 2>&1 || fail "apply failed: $(cat "$WORK/apply1.out")"
"$FORGE_QUOTA" apply --policy "$POLICY" >"$WORK/apply2.out" 2>&1 || fail "second apply failed: $(cat "$WORK/apply2.out")"
grep -q "nothing to change" "$WORK/apply2.out" || fail "apply is not idempotent; second run: $(cat "$WORK/apply2.out")"
qos=$(sacctmgr -n -P show qos format=Name,Priority,Preempt,PreemptMode,GraceTime,Flags,UsageFactor,MaxWall)
grep -qx 'explore|10||requeue|00:00:30|DenyOnLimit|0.500000|04:00:00' <<<"$qos" || fail "explore QOS is not the policy's: $qos"
grep -q '^pretrain|100|explore|requeue|.*DenyOnLimit' <<<"$qos" || fail "pretrain QOS does not preempt explore: $qos"
assoc=$(sacctmgr -n -P show assoc where account=team-a user= format=Account,GrpTRESMins,GrpTRES)
[[ $assoc == *"gres/gpu=1200000"*"gres/gpu=32"* ]] || fail "team-a limits are not the policy's: $assoc"
echo "ok: apply wrote the policy and is idempotent"

# --- a few real jobs, then sync + report against sacct ----------------------------------------------
t0=$(date -u +%Y-%m-%dT%H:%M:%S)
sleep 1
j1=$(sbatch --parsable --train-team=team-a --train-tier=explore --train-layout=tp2,pp1,dp4 -N1 --gpus-per-node=8 \
  -o /dev/null --wrap 'sleep 3') || fail "sbatch j1: $j1"
j2=$(sbatch --parsable -N2 --gpus-per-node=3 -o /dev/null --wrap 'sleep 2') || fail "sbatch j2: $j2"
j3=$(sbatch --parsable -N1 --gpus-per-node=1 -o /dev/null --wrap 'sleep 2; exit 3') || fail "sbatch j3: $j3"
cleanup_jobs+=("$j1" "$j2" "$j3")
for j in "$j1" "$j2" "$j3"; do wait_done "$j" 90 >/dev/null || fail "job $j did not finish"; done
sleep 1
t1=$(date -u +%Y-%m-%dT%H:%M:%S)

echo '{"job_id": "'"$j1"'", "tokens": 2000000, "mean_mfu": 0.42}' >"$WORK/summary.json"
mkdir -p "$WORK/runs/r1" && mv "$WORK/summary.json" "$WORK/runs/r1/summary.json"
"$FORGE_QUOTA" sync --policy "$POLICY" --ledger "$LEDGER" --snapshot "$SNAPSHOT" --runs "$WORK/runs" \
  -S "$t0" -E "$t1" >"$WORK/sync.out" 2>&1 || fail "sync failed: $(cat "$WORK/sync.out")"
# Re-sync of the same window must not double count.
"$FORGE_QUOTA" sync --policy "$POLICY" --ledger "$LEDGER" --snapshot "$SNAPSHOT" --runs "$WORK/runs" \
  -S "$t0" -E "$t1" >"$WORK/sync.out" 2>&1 || fail "second sync failed: $(cat "$WORK/sync.out")"
"$FORGE_QUOTA" report --policy "$POLICY" --ledger "$LEDGER" --by job -S "$t0" -E "$t1" --format json \
  >"$WORK/report.json" || fail "report failed"

# Independent: the same sacct rows, GPU-hours = ElapsedRaw x gres/gpu / 3600.
TZ=UTC sacct -a -X -D -P -n -S "$t0" -E "$t1" -o JobID,ElapsedRaw,AllocTRES,State >"$WORK/sacct.txt"
for j in "$j1" "$j2" "$j3"; do
  want=$(awk -F'|' -v j="$j" '$1 == j { match($3, /gres\/gpu=[0-9]+/); g = substr($3, RSTART + 9, RLENGTH - 9);
                                         h += $2 * g / 3600 } END { printf "%.6f", h }' "$WORK/sacct.txt")
  got=$(/usr/bin/python3 -c 'import json,sys
rows = [r for r in json.load(open(sys.argv[1])) if r["job"] == sys.argv[2]]
print("%.6f" % (rows[0]["gpu_hours"] if rows else -1))' "$WORK/report.json" "$j")
  [ "$got" = "$want" ] || fail "job $j: report says $got GPU-hours, sacct rows give $want"
  [ "$want" != 0.000000 ] || fail "job $j has no GPU-hours in sacct (AccountingStorageTRES=gres/gpu?)"
done
/usr/bin/python3 - "$WORK/report.json" "$j1" "$j3" <<'PY' || fail "report rows are wrong: $(cat "$WORK/report.json")"
import json, sys
rows = {r["job"]: r for r in json.load(open(sys.argv[1]))}
j1, j3 = rows[sys.argv[2]], rows[sys.argv[3]]
for k in ("gpu_hours", "cost", "jobs", "wasted_gpu_hours", "tokens", "cost_per_mtoken", "mfu"):
    assert k in j1, k
assert j1["tokens"] == 2e6 and abs(j1["mfu"] - 0.42) < 1e-9 and j1["cost_per_mtoken"] > 0, j1
assert j3["wasted_gpu_hours"] == j3["gpu_hours"] > 0, j3  # exit 3: FAILED, all of it wasted
PY
echo "ok: report GPU-hours of jobs $j1 $j2 $j3 equal sacct's"

# --- status and the snapshot the plugin reads --------------------------------------------------------
"$FORGE_QUOTA" status --policy "$POLICY" --ledger "$LEDGER" --format json >"$WORK/status.json" || fail "status failed"
/usr/bin/python3 - "$WORK/status.json" <<'PY' || fail "status JSON is wrong: $(cat "$WORK/status.json")"
import json, sys
rows = {r["team"]: r for r in json.load(open(sys.argv[1]))}
a = rows["team-a"]
for k in ("budget_gpu_hours", "used_gpu_hours", "reserved_gpu_hours", "remaining_gpu_hours"):
    assert k in a, k
assert a["budget_gpu_hours"] == 20000 and a["used_gpu_hours"] > 0, a
assert abs(a["remaining_gpu_hours"] - (a["budget_gpu_hours"] - a["used_gpu_hours"] - a["reserved_gpu_hours"])) < 1e-6
PY
# Bare, as a user types it: the policy the dev cluster installs (FORGE_QUOTA_POLICY from env.sh) has the
# same teams and budgets (usage may move meanwhile: other tests sync the same ledger).
[ -n "${FORGE_QUOTA_POLICY:-}" ] || fail "env.sh does not set FORGE_QUOTA_POLICY (scripts/devcluster/up)"
(cd / && "$FORGE_QUOTA" status --format json) >"$WORK/bare.json" 2>"$WORK/bare.err" ||
  fail "a bare 'forge-quota status' failed: $(cat "$WORK/bare.err")"
budgets() { python3 -c 'import json,sys; print(sorted((r["team"], r["budget_gpu_hours"]) for r in json.load(open(sys.argv[1]))))' "$1"; }
[ "$(budgets "$WORK/bare.json")" = "$(budgets "$WORK/status.json")" ] ||
  fail "a bare 'forge-quota status' differs: $(cat "$WORK/bare.json")"
[ "$(stat -c '%a %U' "$SNAPSHOT")" = "644 root" ] || fail "snapshot $SNAPSHOT is not root-owned mode 644"
"$FORGE_QUOTA" report --policy "$POLICY" --ledger "$LEDGER" --by team -S "$t0" -E "$t1" --format html >"$WORK/r.html" ||
  fail "html report failed"
grep -q '<svg' "$WORK/r.html" || fail "html report has no chart"
check_no_drain "accounting"
echo "ok: status, snapshot and html report"
