#!/usr/bin/env bash
# The recovery chain on the dev cluster (docs/ARCHITECTURE.md, "Failures"): detect, classify, isolate,
# restore, reallocate, verify.
#   (c) an impossible memory plan: class oom_host, no requeue, one line saying what to change;
#   (d) job-level errors (that one, a bad spec) drain no node;
#   (a) a GPU that turns unhealthy mid-run: the rank stops with class gpu, the node is drained with
#       forge-health's reason, the job is requeued on another node and resumes from its checkpoint;
#   (b) a node that crashes mid-run (scripts/devcluster/kill-node): class node_lost, the node is drained,
#       the elastic job (-N 1-2, parallel.elastic; ZeRO-1 sharded within each node) comes back on the one
#       node left with half the
#       data-parallel ranks and twice the micro-batches, and its losses follow an uninterrupted run's
#       within 1e-5 relative. Prints the time from the crash to training again.
# Needs scripts/devcluster/up; FORGE_BUILD_DIR is the build under test. Uses node1 and node2.
set -uo pipefail
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=test/support/devcluster.sh
source "$SRC/test/support/devcluster.sh" recovery
# shellcheck source=test/support/metrics.sh
source "$SRC/test/support/metrics.sh"
# shellcheck source=test/support/slurm_jobs.sh
source "$SRC/test/support/slurm_jobs.sh"
health=$BUILD/health/forge-health
# Whatever happens, the cluster is left as found: nodes healthy, alive and resumed.
restore() {
  scancel "${jobs[@]}" 2>/dev/null
  for n in node1 node2; do
    for g in "$STATE/gpu-health/$n"/gpu*; do [ -e "$g" ] && echo ok >"$g"; done
  done
  "$SRC/scripts/devcluster/up" >/dev/null 2>&1
  for n in node1 node2; do
    "$health" resume --node "$n" >/dev/null 2>&1
    sinfo -h -n "$n" -o %t | grep -qE 'drain|drng|down' &&
      scontrol update NodeName="$n" State=RESUME 2>/dev/null
  done
  rm -rf "$work"
}
trap restore EXIT
export FORGE_HOME=$SRC FORGE_BUILD_DIR=$BUILD
# No drains left over from an earlier run: every node this test uses starts idle and healthy.
for n in node1 node2; do
  sinfo -h -n "$n" -o %t | grep -qE 'drain|drng|down' && fail "$n is not usable before the test: $(sinfo -h -n "$n" -o '%t %E')"
done
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=64 --model.heads=4 --model.vocab=256
  --model.seq_len=32 --ckpt.milestone_every=0 --guard.watchdog_s=10)
submit() { sbatch --parsable --train-team=team-a --train-tier=explore -x node3,node4 "$@"; }
drained() { sinfo -h -N -o '%N %t' | awk '$2 ~ /drain|drng/ {print $1}' | sort | tr '\n' ' '; }
record() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# (c) + (d): an impossible memory plan, then a bad spec: each stops at once, says what to change, is not
# requeued and drains nothing.
before=$(drained)
oom=$(submit --train-layout=tp1,pp1,dp1 -N1 -n1 --gres=gpu:1 -o "$work/oom-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" \
  "$SRC/configs/tiny.ini" --run.dir="$work/oom" "${model[@]}" --run.steps=4 --data.batch=50000000) || fail "oom job not submitted"
bad=$(submit --train-layout=tp1,pp1,dp1 -N1 -n1 --gres=gpu:1 -o "$work/bad-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" \
  "$SRC/configs/tiny.ini" --run.dir="$work/bad" "${model[@]}" --run.steps=4 --optim.min_lr=1) || fail "bad-spec job not submitted"
jobs+=("$oom" "$bad")
for j in "$oom" "$bad"; do
  for _ in $(seq 1 120); do squeue -h -j "$j" | grep -q . || break; sleep 0.5; done
done
out=$(cat "$work"/oom-*.out)
grep -q "exit class: oom_host" <<<"$out" || fail "the impossible plan is not oom_host: $(grep '^forge' <<<"$out" | tail -n3)"
grep -q "^forge: oom_host: needs less host memory.*lower data.batch" <<<"$out" ||
  fail "the OOM job does not say what to change: $(tail -n3 <<<"$out")"
grep -q "requeueing" <<<"$out" && fail "the OOM job was requeued"
out=$(cat "$work"/bad-*.out)
if ! grep -q "exit class: config" <<<"$out" || ! grep -q "^forge: config: fix the key named above" <<<"$out"; then
  fail "the bad spec is not class config with its advice: $(grep '^forge' <<<"$out" | tail -n3)"
fi
[ "$(drained)" = "$before" ] || fail "a job-level error drained a node: $(drained)"
echo "(c)+(d) OOM and bad spec: stopped with advice, not requeued, no node drained"

# (a) A GPU turns bad mid-run: class gpu, its node drained by forge-health, requeued elsewhere, resumed.
gpu=$(submit --train-layout=tp1,pp1,dp2 -N1 -n2 --gres=gpu:2 -o "$work/gpu-%j.out" "$SRC/scripts/sbatch/pretrain.sbatch" \
  "$SRC/configs/tiny.ini" --run.dir="$work/gpu" "${model[@]}" --run.steps=300 --data.batch=2 --parallel.dp=2 \
  --ckpt.recovery_every=5) || fail "gpu job not submitted"
jobs+=("$gpu")
wait_for_steps "$work/gpu" 8 600 0.1 || fail "the gpu job never trained: $(tail -n3 "$work"/gpu-*.out)"
first=$(squeue -h -j "$gpu" -o %N)
echo "xid 79: GPU has fallen off the bus (injected by recovery_test)" >"$STATE/gpu-health/$first/gpu0"
state=$(wait_requeued_job "$gpu")
# The drain's reason is read while the GPU is still bad: once healed, the periodic health check may resume
# the node at any moment (it resumes forge-health's own drains when the node is healthy again).
reason=$(sinfo -h -n "$first" -o %E)
echo ok >"$STATE/gpu-health/$first/gpu0"
out=$(cat "$work"/gpu-*.out)
[ "$state" = COMPLETED ] || fail "the gpu job ended $state: $(grep '^forge' <<<"$out" | tail -n4 | tr '\n' ' ')"
grep -q "exit class: gpu" <<<"$out" || fail "the bad GPU is not class gpu: $(grep 'exit class' <<<"$out")"
[ "$(record "$work/gpu/failures/$gpu-0.json" "d['class'], [s['host'] for s in d['suspects']]")" = "('gpu', ['$first'])" ] ||
  fail "the failure record does not name $first: $(cat "$work/gpu/failures/$gpu-0.json")"
case $reason in "forge-health: gpu"*) ;; *) fail "$first was not drained by forge-health: '$reason'" ;; esac
second=$(sacct -n -X -P -j "$gpu" -o NodeList | tail -n1)
[ "$second" != "$first" ] || fail "the requeued job ran on the drained node $first again"
grep -q "resumed from" <<<"$out" || fail "the requeued gpu job did not resume from its checkpoint"
"$health" resume --node "$first" >/dev/null || fail "forge-health did not resume $first once healthy"
echo "(a) bad GPU on $first: class gpu, drained ('$reason'), requeued on $second, resumed"

# (b) A node crashes mid-run. The elastic job asks for 1-2 nodes of 8 GPUs (tp1,pp1,dp16: 2 nodes) and has
# only node1 and node2: it comes back on the survivor as dp8 with two micro-batches of 1 per step.
# Slurm starts a node-range job at once on what is free: both nodes must be idle first.
for _ in $(seq 1 120); do
  [ "$(sinfo -h -n node1,node2 -o %t | sort -u)" = idle ] && break
  sleep 0.5
done
steps=60
# Hybrid sharding: on two nodes the optimizer state is sharded over each node's 8 ranks and summed across
# the nodes; the checkpoint (the first node's copy of each shard) resumes on the one node.
elastic=(--run.dir="$work/elastic" "${model[@]}" --run.steps="$steps" --data.batch=1 --parallel.dp=16
  --parallel.elastic=true --ckpt.recovery_every=10 --parallel.zero=1 --parallel.zero_group=node)
el=$(submit --train-layout=tp1,pp1,dp16 -N 1-2 --ntasks-per-node=8 --gres=gpu:8 -o "$work/elastic-%j.out" \
  "$SRC/scripts/sbatch/pretrain.sbatch" "$SRC/configs/tiny.ini" "${elastic[@]}") || fail "elastic job not submitted"
jobs+=("$el")
# The uninterrupted reference meanwhile: one process, the same 16 sequences per step.
"$BUILD/launcher/forge-train" "$SRC/configs/tiny.ini" --run.dir="$work/reference" "${model[@]}" --run.steps="$steps" \
  --data.batch=16 2>"$work/reference.log" || fail "reference run failed: $(tail -n1 "$work/reference.log")"
wait_for_steps "$work/elastic" 14 1200 0.1 || fail "the elastic job never trained: $(tail -n3 "$work"/elastic-*.out)"
[ "$(squeue -h -j "$el" -o %D)" = 2 ] || fail "the elastic job did not start on 2 nodes: $(squeue -h -j "$el" -o '%D %N')"
"$SRC/scripts/devcluster/kill-node" node2 >/dev/null || fail "could not crash node2"
crashed=$(date +%s.%N)
# Training again: the first record after the resume. Nothing here helps: the batch script, Slurm and the
# Epilog (which releases a requeued forge job at once) do it all.
back=""
for _ in $(seq 1 1800); do
  if grep -q resumed_from "$work/elastic/metrics/rank-0.jsonl" 2>/dev/null; then back=$(date +%s.%N); break; fi
  if [ -z "$(squeue -h -j "$el" -o %T)" ]; then break; fi
  sleep 0.1
done
[ -n "$back" ] || fail "the elastic job did not train again: $(grep '^forge' "$work"/elastic-*.out | tail -n4 | tr '\n' ' ')"
state=$(wait_requeued_job "$el")
out=$(cat "$work"/elastic-*.out)
[ "$state" = COMPLETED ] || fail "the elastic job ended $state: $(grep '^forge' <<<"$out" | tail -n4 | tr '\n' ' ')"
grep -q "exit class: node_lost" <<<"$out" || fail "the crash is not class node_lost: $(grep 'exit class' <<<"$out")"
case $(sinfo -h -n node2 -o %E) in "forge-health: node_lost"*) ;; *) fail "node2 not drained by forge-health: $(sinfo -h -n node2 -o %E)" ;; esac
grep -q "resumed on tp1,pp1,dp8" <<<"$out" || fail "the job did not come back as dp8: $(grep -m2 'plan:' <<<"$out")"
grep -q "micro-batches 2 of 1 sequences" <<<"$out" || fail "the global batch was not kept with 2 micro-batches"
grep -q "sharded across the 8 data-parallel ranks of each node, copied on 2 nodes" <<<"$out" \
  || fail "the first start did not shard within each node: $(grep -m1 'ZeRO' <<<"$out")"
python3 - "$work/reference/metrics/rank-0.jsonl" "$work/elastic/metrics/rank-0.jsonl" <<'PY' || fail "the elastic run left the loss curve"
import json, sys
ref = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
run = {}
for r in map(json.loads, open(sys.argv[2])):
    run[r["step"]] = r["loss"]  # a step trained twice (after the crash) counts as its last time
assert sorted(run) == sorted(ref), (sorted(run), sorted(ref))
worst = max(abs(run[s] - ref[s]) / abs(ref[s]) for s in ref)
print(f"elastic run vs uninterrupted: {len(ref)} steps, worst relative loss difference {worst:.1e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
echo "(b) node2 crashed: node_lost, drained, back on node1 as dp8 x 2 micro-batches;" \
  "$(python3 -c "print(f'{$back - $crashed:.1f}')") s from the crash to training again"
echo "PASS: recovery chain"
