#!/usr/bin/env bash
# The README's first command in CI form: scripts/demo.sh --fast against the running dev cluster and the
# build under test (FORGE_BUILD_DIR). Checks that every stage ran and printed its line, that the run's
# outputs exist (continuous loss curve across the preemption, gate verdict, cost report), and that the
# demo leaves no job behind; its work directory is removed at the end.
# Exit 0 = pass; one "FAIL: ..." line per failed check. Needs scripts/devcluster/up.
set -uo pipefail

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ -r "$STATE/env.sh" ] || { echo "FAIL: $STATE/env.sh missing: start the cluster with scripts/devcluster/up"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh"
scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "FAIL: slurmctld not answering (scripts/devcluster/status)"; exit 1; }
[ -n "${FORGE_BUILD_DIR:-}" ] || { echo "FAIL: FORGE_BUILD_DIR is not set (ctest sets it to the build tree)"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/forge-demo-test.XXXXXX")
chmod 755 "$WORK"
LOG=$WORK/demo.log
job_ids() { sed -nE 's/^(train|gate) job: *([0-9]+)$/\2/p' "$LOG" 2>/dev/null; }
cleanup() {
  local ids
  ids=$(job_ids)
  [ -n "$ids" ] && scancel $ids 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

export FORGE_DEMO_DIR=$WORK/demo
timeout "${FORGE_DEMO_TIMEOUT:-900}" "$SRC/scripts/demo.sh" --fast >"$LOG" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "demo.sh --fast exited $rc; the last lines of its output:"
  tail -n 40 "$LOG" | sed 's/^/    /'
fi

for s in "install dependencies" "build" "dev cluster up" "demo corpus and dataset" "submit the pipeline" \
  "preempt the training job" "gate: evaluate" "accounting: forge-quota sync and report" "done"; do
  grep -qE "^\[demo [0-9:]+\] == $s" "$LOG" || fail "no progress line for stage '$s'"
done
run=$FORGE_DEMO_DIR/runs/demo
grep -qE "^loss curve: [0-9]+ steps, .* continuous across the preemption" "$LOG" ||
  fail "no continuous loss curve reported"
grep -q "resumed from" "$LOG" || fail "the training job did not report resuming from a checkpoint"
[ -s "$run/summary.json" ] || fail "no $run/summary.json"
[ -s "$run/gate/verdict.json" ] || fail "no gate verdict ($run/gate/verdict.json)"
[ -s "$FORGE_DEMO_DIR/quota-report.html" ] || fail "no cost report ($FORGE_DEMO_DIR/quota-report.html)"
grep -q "<svg" "$run/report.html" 2>/dev/null || fail "no training report with plots ($run/report.html)"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s.get('layout') == 'tp2,pp2,dp4' and s.get('ranks') == 16 else 'summary says ' + str(s.get('layout')))" \
  "$run/summary.json" || fail "the run did not train on tp2,pp2,dp4 (16 ranks)"

# Nothing left queued or running: the next test needs the nodes.
for id in $(job_ids); do
  state=$(squeue -h -j "$id" -o %T 2>/dev/null)
  [ -z "$state" ] || fail "job $id is still in the queue ($state)"
done

if [ $fails -eq 0 ]; then
  echo "PASS: demo.sh --fast: $(grep -E '^loss curve' "$LOG"); total $(grep -oE '^\[demo [0-9:]+\]' "$LOG" | sed -n '1p;$p' | tr -d '[]demo ' | paste -sd- -)"
  exit 0
fi
exit 1
