#!/usr/bin/env bash
# Soak: one long elastic training job on the dev cluster with three injected failures of different classes,
# each recovered by the batch scripts alone (docs/ARCHITECTURE.md, "Failures"):
#   1. gpu        a fake GPU of the job's first node turns bad (xid 79): drained, requeued elsewhere;
#   2. node_lost  a node of the job crashes (scripts/devcluster/kill-node): drained, requeued;
#   3. comm       a rank is killed outright (kill -9): requeued on the same nodes.
# The job asks for 1-2 nodes (tp1,pp1,dp16 at most, parallel.elastic), so it runs on whatever is left.
# The bench only injects and watches (it never releases or resubmits the job). It prints, per failure, the
# time from the injection to training again, then the run's ETTR (committed training time over the
# allocated wall time of its segments, docs/ADMISSION.md "Waste") and checks that no committed step was
# lost (every step 1..N in the metrics, the last one N). Restores the nodes at the end.
#
# usage: bench/soak.sh [BUILD_DIR] [STEPS]   (default build/release, 1800 steps: ~20 minutes here)
# Needs scripts/devcluster/up (root); not part of the CI suite (test/slurm/recovery_test.sh is its short form).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
steps=${2:-1800}
STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
# shellcheck source=/dev/null
source "$STATE/env.sh" || { echo "soak.sh: no dev cluster ($STATE/env.sh); run scripts/devcluster/up" >&2; exit 64; }
# shellcheck source=test/support/metrics.sh
source "$root/test/support/metrics.sh"
die() { echo "soak.sh: $*" >&2; exit 1; }
work=$(mktemp -d /var/tmp/forge-soak.XXXXXX)
chmod 755 "$work"
run=$work/run
job=""
restore() {
  [ -z "$job" ] || scancel "$job" 2>/dev/null
  for g in "$STATE"/gpu-health/*/gpu*; do echo ok >"$g"; done
  "$root/scripts/devcluster/up" >/dev/null 2>&1
  for n in node1 node2 node3 node4; do "$build/health/forge-health" resume --node "$n" >/dev/null 2>&1; done
  echo "work directory (logs, run): $work"
}
trap restore EXIT
export FORGE_HOME=$root FORGE_BUILD_DIR=$build
machine "$steps steps"

job=$(sbatch --parsable --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp16 -N 1-2 \
  --ntasks-per-node=8 --gres=gpu:8 -o "$work/job-%j.out" "$root/scripts/sbatch/pretrain.sbatch" \
  "$root/configs/tiny.ini" --run.dir="$run" --run.threads=1 --run.peak_gflops=100 --model.layers=4 \
  --model.d_model=128 --model.heads=4 --model.vocab=512 --model.seq_len=256 --data.batch=1 --parallel.dp=16 \
  --parallel.elastic=true --ckpt.recovery_every=25 --ckpt.milestone_every=0 --guard.watchdog_s=10 \
  --run.steps="$steps") || die "job not submitted"
echo "job $job"
metrics=$run/metrics/rank-0.jsonl
last_step() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])['step'])" "$metrics" 2>/dev/null || echo 0; }
# trained_again BEFORE: waits for a record with resumed_from that is not in the file BEFORE (the metrics
# are cut back to the checkpoint on a resume, so a line count says nothing); prints the time.
trained_again() {
  for _ in $(seq 1 6000); do
    if grep resumed_from "$metrics" 2>/dev/null | grep -qvxF -f "$1"; then date +%s.%N; return 0; fi
    [ -n "$(squeue -h -j "$job" -o %T)" ] || return 1
    sleep 0.1
  done
  return 1
}
inject() {   # inject WHAT AT_STEP: waits for the step, injects, waits for training again
  local what=$1 at=$2 nodes node t0 t1
  until [ "$(last_step)" -ge "$at" ]; do
    [ -n "$(squeue -h -j "$job" -o %T)" ] || die "the job ended before step $at: $(grep '^forge' "$work"/job-*.out | tail -n3)"
    sleep 1
  done
  nodes=$(squeue -h -j "$job" -o %N)
  node=$(scontrol show hostnames "$nodes" | head -n1)
  grep resumed_from "$metrics" >"$work/resumed-before" || echo none >"$work/resumed-before"
  case $what in
    gpu) echo "xid 79: GPU has fallen off the bus (bench/soak.sh)" >"$STATE/gpu-health/$node/gpu0" ;;
    node_lost) node=$(scontrol show hostnames "$nodes" | tail -n1); "$root/scripts/devcluster/kill-node" "$node" >/dev/null ;;
    comm) pkill -9 -f -n "run.dir=$run" ;;
  esac
  t0=$(date +%s.%N)
  t1=$(trained_again "$work/resumed-before") || die "no training after the $what failure: $(grep '^forge' "$work"/job-*.out | tail -n3)"
  echo "$what at step $at on $nodes ($node): training again after $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
  # Put the node back for what comes next (the drain stays until forge-health sees it healthy).
  echo ok >"$STATE/gpu-health/$node/gpu0"
  [ "$what" != node_lost ] || "$root/scripts/devcluster/up" >/dev/null 2>&1
}
inject gpu $((steps / 4))
inject node_lost $((steps / 2))
inject comm $((steps * 3 / 4))
while [ -n "$(squeue -h -j "$job" -o %T)" ]; do sleep 2; done
state=$(sacct -n -X -P -j "$job" -o State | tail -n1)
[ "$state" = COMPLETED ] || die "the job ended $state"
# Every instance of the job (a requeue starts a new one): its allocated wall time.
sacct -n -X -P --duplicates -j "$job" -o JobID,Start,End,Elapsed,State >"$work/instances"
python3 - "$run" "$steps" "$work/instances" <<'PY' || exit 1
import json, sys
run, steps, instances = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def seconds(elapsed):  # [D-]HH:MM:SS
    d, _, hms = elapsed.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(d or 0) * 86400 + h * 3600 + m * 60 + s
allocated = sum(seconds(l.split("|")[3]) for l in open(instances) if l.strip())
recs = [json.loads(l) for l in open(run + "/metrics/rank-0.jsonl")]
seen = {r["step"] for r in recs}
missing = [s for s in range(1, steps + 1) if s not in seen]
s = json.load(open(run + "/summary.json"))
segs = s["segments"]
wall = sum(g["end"] - g["start"] for g in segs)
kept = sum(g["kept_train_s"] for g in segs)
lost = sum(g.get("lost_s", 0) for g in segs)
for g in segs:
    print(f"  segment job {g['job_id']}: {g['layout']} on {g['ranks']} ranks, steps {g['resumed_from'] + 1}-{g['last_step']}, "
          f"{g['end'] - g['start']:.0f} s, kept {g['kept_train_s']:.0f} s, lost {g.get('lost_s', 0):.0f} s, {g['exit_class']}")
print(f"segments {len(segs)}, final step {s['steps']}, steps missing {len(missing)}; job instances "
      f"{sum(1 for l in open(instances) if l.strip())}, allocated {allocated} s (segments {wall:.0f} s), "
      f"committed training {kept:.0f} s, lost {lost:.0f} s: ETTR {kept / allocated:.3f}")
sys.exit(0 if not missing and s["steps"] == steps and s["exit_class"] == "ok" else 1)
PY
load_after
