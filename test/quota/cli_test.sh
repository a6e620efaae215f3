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
101|root|team-a|pretrain|gpu|COMPLETED|3600|billing=16,cpu=16,gres/gpu=16,mem=16000M,node=2|2026-02-02T00:00:00|2026-02-02T01:00:00|node[1-2]|train
102|alice|team-a|explore|gpu|PREEMPTED|1800|cpu=8,gres/gpu=8,node=1|2026-02-02T00:00:00|2026-02-02T00:30:00|node3|x
102|alice|team-a|explore|gpu|COMPLETED|7200|cpu=8,gres/gpu=8,node=1|2026-02-02T01:00:00|2026-02-02T03:00:00|node3|x
103|bob|team-b|finetune|gpu|FAILED|600|cpu=4,gres/gpu=4,node=1|2026-02-03T00:00:00|2026-02-03T00:10:00|node4|ft
104|bob|team-b|finetune|gpu|CANCELLED by 0|0||Unknown|Unknown|None assigned|never-ran
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
  "cat '$tmp/sacct.txt'" >"$tmp/bin/sacct"
printf '%s\n' '#!/usr/bin/env bash' \
  'echo "300|bob|team-b|explore|gpu|PENDING|0:00|2:00:00|cpu=1,gres/gpu=8,node=1"' >"$tmp/bin/squeue"
printf '%s\n' '#!/usr/bin/env bash' \
  'case "$*" in' \
  '  *"show qos"*) echo "normal|0||cluster|00:00:00||1.000000|" ;;' \
  '  *"show assoc"*) echo "team-a||||normal"; echo "team-a|root|||normal" ;;' \
  "  *) echo \"\$*\" >>'$tmp/sacctmgr.log' ;;" \
  'esac' >"$tmp/bin/sacctmgr"
chmod +x "$tmp/bin/sacct" "$tmp/bin/squeue" "$tmp/bin/sacctmgr"
export PATH="$tmp/bin:$PATH"
echo '{"job_id": "101", "tokens": 4000000, "mean_mfu": 0.5}' >"$tmp/runs/run-1/summary.json"

# check-policy
"$bin" check-policy "$policy" >/dev/null || fail "check-policy rejects the example policy"
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
echo "ok"
