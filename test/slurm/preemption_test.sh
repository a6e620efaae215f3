#!/usr/bin/env bash
# Real Slurm preemption: an explore-tier training job is preempted by a pretrain-tier job on the same
# node (QOS pretrain preempts explore, PreemptMode=REQUEUE, GraceTime), saves a recovery checkpoint on the
# signal, is requeued, resumes when the node is free, and its per-step losses equal those of an
# uninterrupted run exactly. Then a 2-rank job loses a rank to kill -9 and runs again in the same
# allocation (docs/ARCHITECTURE.md, "Failures"), resuming from its checkpoint.
# Needs scripts/devcluster/up; FORGE_BUILD_DIR is the build under test.
set -uo pipefail
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=test/support/devcluster.sh
source "$SRC/test/support/devcluster.sh" preempt
# shellcheck source=test/support/metrics.sh
source "$SRC/test/support/metrics.sh"
# shellcheck source=test/support/slurm_jobs.sh
source "$SRC/test/support/slurm_jobs.sh"
export FORGE_HOME=$SRC FORGE_BUILD_DIR=$BUILD
node=node3  # a node of the training pool (partition train)
args=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=256 --model.heads=4
  --model.seq_len=256 --ckpt.recovery_every=5 --ckpt.milestone_every=0)
# The explore job takes all CPUs of the node, so the pretrain job can only start by preempting it.
explore=$(sbatch --parsable --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 -N1 -n1 -c16 \
  --gres=gpu:1 -w "$node" -o "$work/explore-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" "$SRC/configs/tiny.ini" \
  --run.dir="$work/explore" "${args[@]}" --run.steps=60) || fail "explore job not submitted"
jobs+=("$explore")
wait_for_steps "$work/explore" 8 600 0.1
[ -f "$work/explore/metrics/rank-0.jsonl" ] || fail "the explore job never trained ($(cat "$work"/explore-*.out 2>/dev/null | tail -3))"
pretrain=$(sbatch --parsable --train-team=team-a --train-tier=pretrain --train-layout=tp1,pp1,dp1 -N1 -n1 -c16 \
  --gres=gpu:1 -w "$node" -o "$work/pretrain-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" "$SRC/configs/tiny.ini" \
  --run.dir="$work/pretrain" "${args[@]}" --run.steps=5) || fail "pretrain job not submitted"
jobs+=("$pretrain")

# The uninterrupted reference, meanwhile, outside Slurm.
"$BUILD/launcher/forge-train" "$SRC/configs/tiny.ini" --run.dir="$work/reference" "${args[@]}" --run.steps=60 2>"$work/reference.log" ||
  fail "reference run failed: $(tail -n1 "$work/reference.log")"

state=$(wait_requeued_job "$explore" "$node")
[ "$state" = COMPLETED ] || fail "explore job $explore ended $state ($(tail -n3 "$work"/explore-*.out))"
out=$(cat "$work"/explore-*.out)
grep -q "exit class: preempted" <<<"$out" || fail "the explore job was not preempted (exit 75): $(grep 'exit class' <<<"$out")"
grep -q "resumed from" <<<"$out" || fail "the requeued explore job did not resume from its checkpoint"
[ "$(sacct -n -X -P -j "$pretrain" -o State | tail -n1)" = COMPLETED ] || fail "the pretrain job did not complete"
diff <(losses "$work/reference/metrics/rank-0.jsonl") <(losses "$work/explore/metrics/rank-0.jsonl") >/dev/null ||
  fail "the preempted run's per-step losses differ from the uninterrupted run's"
echo "explore job $explore preempted by $pretrain, requeued, resumed; 60 steps identical to the reference"

# A rank killed outright (kill -9, as an OOM kill without cgroups would): srun ends the step, every node
# still answers, so the batch script classes it as a communication failure and runs the step again in the
# same allocation (no requeue: one job instance, a new step id); it resumes from its last checkpoint.
killed=$(sbatch --parsable --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp2 -N1 -n2 \
  --gres=gpu:2 -w "$node" -o "$work/killed-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" "$SRC/configs/tiny.ini" \
  --run.dir="$work/killed" "${args[@]}" --run.steps=40 --data.batch=2 --parallel.dp=2) || fail "2-rank job not submitted"
jobs+=("$killed")
for _ in $(seq 1 600); do
  [ -f "$work/killed/metrics/rank-1.jsonl" ] && [ "$(wc -l <"$work/killed/metrics/rank-1.jsonl")" -ge 8 ] && break
  sleep 0.1
done
victim=$(pgrep -f "run.dir=$work/killed" | tail -n1)
[ -n "$victim" ] || fail "no rank of job $killed to kill"
kill -9 "$victim"
t0=$(date +%s.%N)
back=""
for _ in $(seq 1 1200); do
  if grep -q resumed_from "$work/killed/metrics/rank-0.jsonl" 2>/dev/null; then back=$(date +%s.%N); break; fi
  [ -n "$(squeue -h -j "$killed" -o %T)" ] || break
  sleep 0.1
done
state=$(wait_requeued_job "$killed" "$node")
out=$(cat "$work"/killed-*.out)
[ "$state" = COMPLETED ] || fail "job $killed with a killed rank ended $state: $(grep '^forge:' <<<"$out" | tail -n4 | tr '\n' ' ')"
grep -q "exit class: comm (exit [0-9]*, restart 0, attempt 0)" <<<"$out" ||
  fail "the killed rank was not classed as a comm failure: $(grep 'exit class' <<<"$out")"
grep -q "running the step again in this allocation (attempt 1)" <<<"$out" || fail "the step did not run again in place"
grep -q "requeueing" <<<"$out" && fail "job $killed was requeued instead"
[ "$(sacct -n -X -P --duplicates -j "$killed" -o JobID | wc -l)" = 1 ] || fail "job $killed ran as more than one instance"
[ -n "$back" ] && grep -q "resumed from" <<<"$out" || fail "the step run again did not resume from its checkpoint"
echo "PASS: a preemption requeues and resumes; a killed rank runs again in place and resumes" \
  "($(python3 -c "print(f'{$back - $t0:.1f}')") s from the kill to training again)"
