#!/usr/bin/env bash
# ZeRO-2 and ZeRO-3 through forge-train on real MPI ranks, against ZeRO-1 on the same layout: the same
# losses at every step and the same final weights and AdamW moments (forge-ckpt export, h5diff) at dp2;
# dp4 with gradient accumulation; tp2 x dp2 on a GQA + RoPE Llama; pp2 x dp2; cp2 x dp2; a Mixtral on
# dp4 x ep2; BF16 on dp2; a non-finite step injected; ZeRO-3 without prefetch; ZeRO-2/3 reducing each micro-batch; each
# stage sharded within two nodes and summed across them (hybrid sharding). A ZeRO-1 checkpoint resumes on ZeRO-3 at
# another dp, that one on ZeRO-2 at another layout, on the one-process curve; a ZeRO-3 checkpoint missing a
# rank's shard is named by the tensor range it held and the one before it is used. The training state's resident
# memory (state_mib, the backend's page counts) at ZeRO-3 and dp4 against ZeRO-1's, and what a resume reads.
# The pipeline schedules (parallel.pp_schedule) on pp2 x dp2: interleaved and ZB-H1 train 1F1B's curve and
# state bit for bit, under ZeRO-1 and -3, and a 1F1B checkpoint resumes under either. Bad keys exit 64.
# Usage: zero_test.sh FORGE_TRAIN FORGE_CKPT SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 ckpt=$2 src=$3 mpiexec=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
base=(--run.threads=1 --run.peak_gflops=100 --model.heads=4 --model.vocab=256 --model.seq_len=32
  --ckpt.milestone_every=0 --guard.watchdog_s=300)
small=(--model.layers=4 --model.d_model=64)
# run NP DIR ARGS...: forge-train on NP ranks; checkpoints every $EVERY steps (none by default).
run() { local np=$1 dir=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/$dir" "${base[@]}" \
    --ckpt.recovery_every="${EVERY:-0}" "$@" \
    2>"$work/$dir.log" || fail "$dir failed: $(grep -i error "$work/$dir.log" | head -3)"; }
# same_state A B STEP: the checkpoints of STEP hold the same weights and moments, bit for bit.
same_state() {
  local a b
  a=$(ls -d "$work/$1"/checkpoints/*/step-"$(printf %08d "$3")") && b=$(ls -d "$work/$2"/checkpoints/*/step-"$(printf %08d "$3")") \
    || fail "$1, $2: no checkpoint of step $3"
  "$ckpt" export "$a" --out "$work/$1.h5" >/dev/null && "$ckpt" export "$b" --out "$work/$2.h5" >/dev/null \
    || fail "$1, $2: export failed"
  for group in param adam_m adam_v; do
    h5diff "$work/$1.h5" "$work/$2.h5" "/$group" "/$group" >/dev/null || fail "$2: /$group differs from $1's"
  done
  echo "$2: weights and moments of step $3 bit for bit $1's"
}
# stages NAME NP ARGS...: ZeRO-1, -2 and -3 on one layout for 20 steps; the same curve (from step FROM,
# default 1) and final state.
stages() { local name=$1 np=$2; shift 2
  for z in 1 2 3; do run "$np" "$name-z$z" "${small[@]}" --run.steps=20 --parallel.zero=$z "$@"; done
  for z in 2 3; do
    compare "$work/$name-z1" "$work/$name-z$z" "${FROM:-1}"
    same_state "$name-z1" "$name-z$z" 20
  done
}
stages dp2 2 --data.batch=2 --parallel.dp=2
stages dp4 4 --data.batch=1 --parallel.dp=4 --parallel.microbatches=2
stages tp2dp2 4 --data.batch=2 --model.family=llama --model.kv_heads=2 --parallel.tp=2 --parallel.dp=2
stages pp2dp2 4 --data.batch=2 --parallel.pp=2 --parallel.dp=2 --parallel.microbatches=2
stages cp2dp2 4 --data.batch=2 --model.family=llama --model.kv_heads=2 --parallel.cp=2 --parallel.dp=2
stages ep2 4 --data.batch=1 --model.family=mixtral --model.kv_heads=2 --model.experts=4 --model.moe_hidden=64 \
  --parallel.dp=4 --parallel.ep=2
# parallel.reduce_each_microbatch: each micro-batch's gradients reduced as its backward goes; ZeRO-1's curve
# (the sums' order differs: the ranks' sum of each micro-batch, then the micro-batches').
for z in 2 3; do
  run 4 "dp4-z${z}e" "${small[@]}" --run.steps=20 --data.batch=1 --parallel.dp=4 --parallel.microbatches=2 \
    --parallel.zero=$z --parallel.reduce_each_microbatch=true
  compare "$work/dp4-z1" "$work/dp4-z${z}e"
done
# Hybrid sharding (parallel.zero_group = node): the ranks of two nodes (named as Slurm names them, by
# SLURMD_NODENAME; test/slurm/recovery_test.sh runs it on two nodes of the dev cluster) shard within their
# node and sum their shards across the nodes: ZeRO-1's curve on dp4 (2 ranks a node), on tp2 x dp2 (one
# data-parallel rank a node: nothing to shard within, every part summed across), on a Mixtral at dp4 x
# ep2 (each expert group one rank a node); every stage's final state ZeRO-1's.
# nodes NP DIR ARGS...: forge-train on NP ranks, the first half on node "na", the rest on "nb".
nodes() { local np=$1 dir=$2; shift 2
  local args=("$src/configs/tiny.ini" --run.dir="$work/$dir" "${base[@]}" --ckpt.recovery_every="${EVERY:-0}"
    --parallel.zero_group=node "$@")
  "$mpiexec" --oversubscribe -np $((np / 2)) env SLURMD_NODENAME=na "$train" "${args[@]}" : \
    -np $((np / 2)) env SLURMD_NODENAME=nb "$train" "${args[@]}" 2>"$work/$dir.log" \
    || fail "$dir failed: $(grep -i error "$work/$dir.log" | head -3)"; }
for z in 1 2 3; do
  nodes 4 "hy-dp4-z$z" "${small[@]}" --run.steps=20 --data.batch=1 --parallel.dp=4 --parallel.microbatches=2 \
    --parallel.zero=$z
  compare "$work/dp4-z1" "$work/hy-dp4-z$z"
  same_state dp4-z1 "hy-dp4-z$z" 20
done
grep -q "sharded across the 2 data-parallel ranks of each node, copied on 2 nodes" "$work/hy-dp4-z1.log" \
  || fail "the plan does not say the shards are per node: $(grep -m1 ZeRO "$work/hy-dp4-z1.log")"
# Its traffic is counted: per rank and step a reduce-scatter (n) and a gather (n) within the node and the sum
# of the rank's half across nodes (n / 2), against dp4's n + n.
python3 - "$work/dp4-z1/metrics/rank-0.jsonl" "$work/hy-dp4-z1/metrics/rank-0.jsonl" <<'PY' || fail "hybrid traffic"
import json, sys
flat, hybrid = ([json.loads(l)["comm_bytes"] for l in open(p)][-1] for p in sys.argv[1:])
print(f"bytes a rank moves a step: dp4 {flat}, two nodes of two {hybrid}")
assert 1.1 * flat <= hybrid <= 1.4 * flat, (flat, hybrid)
PY
nodes 4 hy-tp2dp2 "${small[@]}" --run.steps=20 --data.batch=2 --model.family=llama --model.kv_heads=2 \
  --parallel.tp=2 --parallel.dp=2 --parallel.zero=3
compare "$work/tp2dp2-z1" "$work/hy-tp2dp2"
same_state tp2dp2-z1 hy-tp2dp2 20
nodes 4 hy-ep2 "${small[@]}" --run.steps=20 --data.batch=1 --model.family=mixtral --model.kv_heads=2 \
  --model.experts=4 --model.moe_hidden=64 --parallel.dp=4 --parallel.ep=2 --parallel.zero=2
compare "$work/ep2-z1" "$work/hy-ep2"
same_state ep2-z1 hy-ep2 20
# Nodes holding unequal numbers of ranks cannot share a shard out evenly: every rank exits 64 naming both.
"$mpiexec" --oversubscribe -np 2 env SLURMD_NODENAME=na "$train" "$src/configs/tiny.ini" --run.dir="$work/uneven" \
  "${base[@]}" "${small[@]}" --parallel.dp=3 --parallel.zero=1 --parallel.zero_group=node : \
  -np 1 env SLURMD_NODENAME=nb "$train" "$src/configs/tiny.ini" --run.dir="$work/uneven" "${base[@]}" \
  "${small[@]}" --parallel.dp=3 --parallel.zero=1 --parallel.zero_group=node >/dev/null 2>"$work/uneven.log"
rc=$?
[ $rc -eq 64 ] || fail "uneven nodes: exit $rc, want 64 ($(tail -n2 "$work/uneven.log"))"
grep -q "parallel.zero_group = node needs the same number .* node na holds 2 and node nb holds 1" "$work/uneven.log" \
  || fail "uneven nodes: $(grep -m1 -i error "$work/uneven.log")"

# BF16 (on the CPU backend): the working copy is rounded from what each gather brings and released with it.
stages bf16 2 --data.batch=2 --parallel.dp=2 --model.family=llama --model.kv_heads=2 --precision.dtype=bf16
FROM=6 stages nan 2 --data.batch=2 --parallel.dp=2 --guard.inject_nan_step=5
grep -q '"skipped":true' "$work/nan-z3/metrics/rank-0.jsonl" || fail "the injected non-finite step was not skipped"
run 2 noprefetch "${small[@]}" --run.steps=20 --data.batch=2 --parallel.dp=2 --parallel.zero=3 --parallel.prefetch=false
compare "$work/dp2-z1" "$work/noprefetch"

# What ZeRO-3 gathers a step, prefetched or not: the embeddings and the final norm once (E bytes), and each
# pass's blocks but the one it hands to a pass of the other direction on the same chunk (a forward's last
# block to the backward after it, that backward's first to the next forward): at pp 1 with L blocks and m
# micro-batches, 2m(L - 1) + 1 blocks of B bytes. Runs at m = 1 and 2 give B and E; this model's E is less
# than a block, which releasing and gathering the handed-over blocks again would break.
run 2 dp2-z3m2 "${small[@]}" --run.steps=3 --data.batch=1 --parallel.dp=2 --parallel.microbatches=2 --parallel.zero=3
python3 - "$work"/{dp2-z3,noprefetch,dp2-z3m2,dp2-z1}/metrics/rank-0.jsonl <<'PY' || fail "gather metrics"
import json, sys
z3, off, m2 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
assert all(r["gather_bytes"] > 0 and r["gather_ms"] >= 0 for r in z3), z3[0]
assert not any("gather_bytes" in json.loads(l) for l in open(sys.argv[4]))
assert {r["gather_bytes"] for r in z3} == {r["gather_bytes"] for r in off}, "prefetching changed what is gathered"
L, g1, g2 = 4, z3[-1]["gather_bytes"], m2[-1]["gather_bytes"]
block = (g2 - g1) / (2 * (L - 1))
rest = g1 - (2 * (L - 1) + 1) * block
print(f"ZeRO-3 gathers {g1} bytes a step at m = 1, {g2} at m = 2: blocks of {block:.0f} bytes, {rest:.0f} bytes of embeddings and norm")
assert block > 0 and 0 < rest < block, (g1, g2)
PY

# Resume across stages and layouts, the global batch kept by parallel.elastic (dp follows the ranks, the
# micro-batches make up the rest): ZeRO-1 on dp2 to step 3, ZeRO-3 on dp4 to step 6, ZeRO-2 on tp2 x dp2 to
# step 20, against one process training the same 4 sequences a step.
"$train" "$src/configs/tiny.ini" --run.dir="$work/one" "${base[@]}" --ckpt.recovery_every=0 "${small[@]}" --run.steps=20 --data.batch=1 \
  --parallel.microbatches=4 2>"$work/one.log" || fail "one process: $(tail -n2 "$work/one.log")"
elastic=("${small[@]}" --data.batch=1 --parallel.dp=4 --parallel.elastic=true)
run 2 resume --run.steps=3 "${elastic[@]}" --parallel.zero=1
run 4 resume --run.steps=6 "${elastic[@]}" --parallel.zero=3
# (dp2's verification batch of 2 sequences is no whole micro-batch of dp4: said, and skipped.)
grep -q "resuming without the verification step" "$work/resume.log" || fail "the ZeRO-3 resume: $(tail -n2 "$work/resume.log")"
run 4 resume --run.steps=20 "${elastic[@]}" --parallel.zero=2 --parallel.tp=2
grep -q "verification loss .* matches" "$work/resume.log" || fail "the ZeRO-2 resume skipped the verification step"
compare "$work/one" "$work/resume" 4

# A ZeRO-3 checkpoint that lost one rank's shard: the resume names the file and the tensor range it held,
# goes back to the previous checkpoint, and the curve goes on as ZeRO-1's.
shard=("${small[@]}" --data.batch=2 --parallel.dp=2 --parallel.zero=3)
EVERY=2 run 2 shard --run.steps=4 "${shard[@]}"
# (The run's end saves step 4 twice, recovery and milestone: both lose the shard.)
lost=("$work"/shard/checkpoints/*/step-00000004/rank-00001.bin)
[ ${#lost[@]} -eq 2 ] && [ -f "${lost[0]}" ] || fail "no shards of rank 1 in step 4's checkpoints: ${lost[*]}"
rm "${lost[@]}"
EVERY=2 run 2 shard --run.steps=6 "${shard[@]}"
grep -q "not resuming from .*step-00000004: .*'rank-00001.bin' is missing; it held tensor '.*' elements \[.*\] to \[.*\]" \
  "$work/shard.log" || fail "the lost shard: $(grep -m1 'not resuming' "$work/shard.log")"
grep -q "resum.*step-00000002" "$work/shard.log" || fail "did not resume from step 2: $(grep -m2 -i resum "$work/shard.log")"
compare "$work/dp2-z1" "$work/shard"
echo "a lost shard: $(grep -o "'rank-00001.bin' is missing; it held tensor '[^']*'" "$work/shard.log" | head -n1); resumed from step 2"

# Memory: a deeper, wider model (16 blocks of 256, 3 MiB a block) on dp4. ZeRO-1 holds every weight and
# gradient (and its shard of both moments and of the gradients); ZeRO-3 its quarter of each, the blocks a
# pass is at and the gradients not yet reduced. Per parameter, ZeRO-1 = 4 + 4 + 1 + 2 = 11 bytes, ZeRO-3's
# floor 4 bytes (0.36x), plus those blocks, which the kernel's transparent huge pages round up to 2 MiB:
# asserted at most 0.55x, from the resident pages the backend counts.
# Both are stopped at step 2 and resumed: a ZeRO-3 rank reads its quarter of the weights and its moments
# (4/4 + 8/4 bytes a parameter), a ZeRO-1 rank every weight and its moments (4 + 8/4): half as much.
deep=(--model.layers=16 --model.d_model=256 --data.batch=1 --parallel.dp=4)
for z in 1 3; do
  EVERY=2 run 4 "mem-z$z" "${deep[@]}" --parallel.zero=$z --run.steps=2
  EVERY=2 run 4 "mem-z$z" "${deep[@]}" --parallel.zero=$z --run.steps=3
done
python3 - "$work/mem-z1/metrics" "$work/mem-z3/metrics" <<'PY' || fail "ZeRO-3 memory"
import json, sys
def peak(d):
    return max(json.loads(l)["state_mib"] for r in range(4) for l in open(f"{d}/rank-{r}.jsonl"))
z1, z3 = peak(sys.argv[1]), peak(sys.argv[2])
print(f"training state per rank: ZeRO-1 {z1:.1f} MiB, ZeRO-3 {z3:.1f} MiB ({z3 / z1:.2f}x)")
assert z3 <= 0.55 * z1, (z1, z3)
PY
read_mib() { grep -o "read [0-9.]* MiB" "$work/$1.log" | tail -n1 | grep -o "[0-9.]*"; }
python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'resume reads per rank: ZeRO-1 {a} MiB, ZeRO-3 {b} MiB ({b / a:.2f}x)'); assert 0.45 <= b / a <= 0.55" \
  "$(read_mib mem-z1)" "$(read_mib mem-z3)" || fail "the ZeRO-3 resume read more than its ranges: $(grep -m1 'read .* MiB' "$work/mem-z3.log")"
# With 4 micro-batches, ZeRO-2 accumulates the whole gradients until the last; reducing each micro-batch
# keeps a few layers' at a time.
run 4 mem-z2 "${deep[@]}" --run.steps=3 --parallel.zero=2 --parallel.microbatches=4
run 4 mem-z2e "${deep[@]}" --run.steps=3 --parallel.zero=2 --parallel.microbatches=4 --parallel.reduce_each_microbatch=true
python3 - "$work/mem-z2/metrics" "$work/mem-z2e/metrics" <<'PY' || fail "reduce_each_microbatch memory"
import json, sys
def peak(d):
    return max(json.loads(l)["state_mib"] for r in range(4) for l in open(f"{d}/rank-{r}.jsonl"))
once, each = peak(sys.argv[1]), peak(sys.argv[2])
print(f"ZeRO-2, 4 micro-batches: {once:.1f} MiB reducing once a step, {each:.1f} MiB reducing each micro-batch")
assert each < once, (once, each)
PY

# Pipeline schedules on pp2 x dp2 (4 blocks: interleaved's 2 chunks a stage hold one each): the same sums
# in the same order as 1F1B, so the same losses and final state bit for bit; the bubble measured beside
# each schedule's analytic one in the metrics.
for sched in interleaved zb-h1; do
  for z in 1 3; do
    run 4 "pp2dp2-$sched-z$z" "${small[@]}" --run.steps=20 --data.batch=2 --parallel.pp=2 --parallel.dp=2 \
      --parallel.microbatches=2 --parallel.zero=$z --parallel.pp_schedule=$sched
    compare "$work/pp2dp2-z1" "$work/pp2dp2-$sched-z$z" 1 0
    same_state pp2dp2-z1 "pp2dp2-$sched-z$z" 20
  done
done
python3 - "$work"/pp2dp2-z1/metrics/rank-0.jsonl "$work"/pp2dp2-{interleaved,zb-h1}-z1/metrics/rank-0.jsonl <<'PY' \
  || fail "pipeline bubble metrics"
import json, sys
for name, path in zip(("1f1b", "interleaved", "zb-h1"), sys.argv[1:]):
    r = [json.loads(l) for l in open(path)][-1]
    print(f"{name}: bubble measured {r['bubble_fraction']:.3f} of the step, analytic {r['bubble_analytic']:.3f}")
    assert 0 <= r["bubble_fraction"] < 1, r
analytic = [[json.loads(l) for l in open(p)][-1]["bubble_analytic"] for p in sys.argv[1:]]
assert analytic[0] > analytic[1] > analytic[2] > 0, analytic  # 1/3, 1/5 and 1/7 at pp2 x m2
PY
# A 1F1B checkpoint resumes under interleaved, and that one under ZB-H1, on 1F1B's curve (a warm-up longer
# than the runs: the learning rate of a step does not depend on run.steps, which each leg sets).
pipe=("${small[@]}" --data.batch=2 --parallel.pp=2 --parallel.dp=2 --parallel.microbatches=2 --parallel.zero=1
  --optim.warmup_steps=30)
run 4 sched-1f1b "${pipe[@]}" --run.steps=12
EVERY=2 run 4 sched-resume "${pipe[@]}" --run.steps=4
for leg in "8 interleaved" "12 zb-h1"; do
  read -r steps sched <<<"$leg"
  EVERY=2 run 4 sched-resume "${pipe[@]}" --run.steps="$steps" --parallel.pp_schedule="$sched"
  grep -q "verification loss .* matches" "$work/sched-resume.log" \
    || fail "the $sched resume skipped verification: $(grep -i resum "$work/sched-resume.log" | tail -n1)"
done
compare "$work/sched-1f1b" "$work/sched-resume"

# Bad keys: exit 64 naming the key and the choices.
bad() { local want=$1; shift
  "$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${base[@]}" "$@" >/dev/null 2>"$work/bad.log"
  local rc=$?
  [ $rc -eq 64 ] || fail "$*: exit $rc, want 64"
  grep -q "$want" "$work/bad.log" || fail "$*: $(tail -n1 "$work/bad.log")"
}
bad "parallel.zero.*must be 0, 1, 2 or 3" --parallel.zero=4
bad "parallel.reduce_each_microbatch.*under ZeRO-2 or 3" --parallel.zero=1 --parallel.reduce_each_microbatch=true
bad "parallel.zero_group.*expected dp or node" --parallel.zero=1 --parallel.zero_group=rack
bad "parallel.zero_group.*parallel.zero is 0" --parallel.zero_group=node
bad "parallel.pp_schedule.*expected 1f1b, interleaved or zb-h1" --parallel.pp=2 --parallel.pp_schedule=gpipe
bad "parallel.pp_virtual = 3: does not divide the blocks of each stage" "${small[@]}" --parallel.pp=2 \
  --parallel.microbatches=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=3
bad "parallel.microbatches = 3: the interleaved schedule .* a multiple of 2" "${small[@]}" --parallel.pp=2 \
  --parallel.microbatches=3 --parallel.pp_schedule=interleaved
# A plan over the memory cap tries the layouts one key away under the same rules: pp4 cannot take 2
# micro-batches interleaved, and is left out, not planned (it was an internal error).
bad "run.memory_per_rank_gib = 0.001: the plan of layout tp1,pp2,dp1 needs" --plan --model.layers=8 \
  --model.d_model=64 --parallel.pp=2 --parallel.microbatches=2 --parallel.pp_schedule=interleaved \
  --run.memory_per_rank_gib=0.001
echo "PASS"
