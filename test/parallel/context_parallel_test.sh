#!/usr/bin/env bash
# Context parallelism through forge-train on MPI ranks: cp2 (ring, and all-to-all; FP32 and BF16) reproduces
# the single-process losses of a grouped-query Llama-family model and the ring sends exactly its analytic
# bytes per step; a run saved on
# cp2 x dp2 (ZeRO-1) resumes on cp4 x dp2 and continues the loss curve; bad cp settings exit 64 naming the key.
# Usage: context_parallel_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
mpi() { local np=$1; shift; "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" "$@"; }
common=(--run.threads=1 --model.family=llama --model.layers=2 --model.d_model=64 --model.heads=4
  --model.kv_heads=2 --model.ffn_hidden=128 --model.vocab=256 --model.seq_len=64 --ckpt.recovery_every=0
  --ckpt.milestone_every=0)

"$train" "$src/configs/tiny.ini" --run.dir="$work/ref" "${common[@]}" --run.steps=8 --data.batch=2 \
  2>"$work/ref.log" || fail "single-process run failed: $(tail -n1 "$work/ref.log")"

mpi 2 --run.dir="$work/cp2" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.cp=2 --run.trace_steps=2 \
  2>"$work/cp2.log" || fail "cp2 run failed: $(tail -n3 "$work/cp2.log")"
compare "$work/ref" "$work/cp2"
# The trace of step 2 shows the ring: each layer's attention spans and the cp group's sends and receives.
python3 - "$work/cp2/trace/steps-2-2/rank-00000.json" <<'PY' || fail "the cp2 trace does not show the ring"
import json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
names = [e.get("name", "") for e in events]
for want, count in (("ring attention forward", 2), ("ring attention backward", 2), ("send cp", 1), ("recv cp", 1)):
    assert names.count(want) >= count, (want, names.count(want))
PY
mpi 2 --run.dir="$work/a2a" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.cp=2 --parallel.cp_comm=a2a \
  2>"$work/a2a.log" || fail "cp2 a2a run failed: $(tail -n3 "$work/a2a.log")"
compare "$work/ref" "$work/a2a"
# In BF16 (the attention's BF16 inputs widened for the ring, its output rounded once): one process's BF16
# losses within the BF16 layout tolerance (layout_test.cpp's kBf16LossRelTol).
"$train" "$src/configs/tiny.ini" --run.dir="$work/ref16" "${common[@]}" --run.steps=8 --data.batch=2 \
  --precision.dtype=bf16 2>"$work/ref16.log" || fail "single-process BF16 run failed: $(tail -n1 "$work/ref16.log")"
mpi 2 --run.dir="$work/cp2-16" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.cp=2 --precision.dtype=bf16 \
  2>"$work/cp2-16.log" || fail "cp2 BF16 run failed: $(tail -n3 "$work/cp2-16.log")"
compare "$work/ref16" "$work/cp2-16" 1 1e-3
# Per step, layer and micro-batch a rank sends its key/value chunks (2 sequences x 32 positions x 2
# key/value heads x 16, keys and values) cp - 1 times forward and cp - 1 times backward, and the travelling
# gradient cp times: no document ids to gather on the synthetic stream.
python3 - "$work/cp2/metrics/rank-0.jsonl" <<'PY' || fail "cp2's ring bytes are not the analytic count"
import json, sys
cp, layers, rows, kv_width = 2, 2, 2 * 32, 2 * 16
message = rows * 2 * kv_width * 4
want = layers * ((cp - 1) * 2 + cp) * message
for r in map(json.loads, open(sys.argv[1])):
    assert r["cp_comm_bytes"] == want, (r["step"], r["cp_comm_bytes"], want)
    assert 0 <= r["cp_comm_ms"] <= r["comm_ms"] + 1e-9, r
print(f"cp2: {want} ring bytes a step, as counted")
PY

# Saved on cp2 x dp2 with ZeRO-1 after 4 steps (1 sequence per data-parallel rank), resumed on cp4 x dp2:
# the optimizer's shards move from 4 to 8 ranks.
mpi 4 --run.dir="$work/x" "${common[@]}" --run.steps=4 --data.batch=1 --parallel.cp=2 --parallel.dp=2 \
  --parallel.zero=1 2>"$work/x1.log" || fail "cp2 x dp2 failed: $(tail -n3 "$work/x1.log")"
compare "$work/ref" "$work/x"
mpi 8 --run.dir="$work/x" "${common[@]}" --run.steps=8 --data.batch=1 --parallel.cp=4 --parallel.dp=2 \
  --parallel.zero=1 2>"$work/x2.log" \
  || fail "resume on cp4 failed: $(tail -n3 "$work/x2.log")"
grep -q "verification loss .* matches" "$work/x2.log" || fail "the resume on cp4 skipped the verification step"
compare "$work/ref" "$work/x" 5

# Selective and full recompute on cp2: the same losses bit for bit, and plans with less activation memory.
for r in selective full; do
  mpi 2 --run.dir="$work/re-$r" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.cp=2 --model.recompute=$r \
    2>"$work/re-$r.log" || fail "cp2 with $r recompute failed: $(tail -n3 "$work/re-$r.log")"
done
for r in none selective full; do
  "$train" "$src/configs/tiny.ini" "${common[@]}" --data.batch=2 --parallel.cp=2 --model.recompute=$r --plan --json \
    >"$work/plan-$r.json" || fail "--plan with model.recompute = $r failed"
done
python3 - "$work" <<'PY' || fail "recompute changed the losses or saved no memory"
import json, sys
work = sys.argv[1]
def losses(run): return [r["loss"] for r in map(json.loads, open(f"{work}/{run}/metrics/rank-0.jsonl"))]
act = {r: json.load(open(f"{work}/plan-{r}.json"))["stages"][0]["bytes"]["activations"] for r in ("none", "selective", "full")}
for r in ("selective", "full"):
    assert losses("cp2") == losses(f"re-{r}"), (r, losses("cp2"), losses(f"re-{r}"))
    print(f"{r} recompute: losses bit for bit, planned activations {act[r]} bytes instead of {act['none']}")
assert act["full"] < act["selective"] < act["none"], act
PY
"$train" "$src/configs/families/mixtral.ini" --run.dir="$work/bad0" --model.recompute=full >/dev/null \
  2>"$work/bad0.log"
[ $? -eq 64 ] || fail "model.recompute = full with MoE: want exit 64"
grep -q "model.recompute.*model.ffn = moe" "$work/bad0.log" ||
  fail "recompute message: $(grep -i error "$work/bad0.log" | head -1)"

# Bad input: exit 64 with one line naming the key.
mpi 3 --run.dir="$work/bad1" "${common[@]}" --parallel.cp=3 >/dev/null 2>"$work/bad1.log"
[ $? -eq 64 ] || fail "cp3 at seq_len 64: want exit 64"
grep -q "parallel.cp.*must cut model.seq_len = 64 into 2 x 3 equal chunks (cp = 2, 4, 8, 16, 32 would)" \
  "$work/bad1.log" || fail "cp message: $(grep -i error "$work/bad1.log" | head -1)"
mpi 4 --run.dir="$work/bad2" "${common[@]}" --parallel.cp=4 --parallel.cp_comm=a2a >/dev/null 2>"$work/bad2.log"
[ $? -eq 64 ] || fail "a2a with 2 key/value heads on cp4: want exit 64"
grep -q "parallel.cp_comm.*4 query and 2 key/value heads do not divide by cp = 4" "$work/bad2.log" \
  || fail "cp_comm message: $(grep -i error "$work/bad2.log" | head -1)"
# A memory cap the plan does not fit: the run exits 64 before it allocates the model, naming the cap and
# the layouts one key away that would fit (a larger cp among them).
cap=$(python3 -c "import json; p = json.load(open('$work/plan-none.json')); print(max(s['bytes']['total'] for s in p['stages']) * 0.8 / 2**30)")
mpi 2 --run.dir="$work/bad4" "${common[@]}" --data.batch=2 --parallel.cp=2 --run.memory_per_rank_gib="$cap" \
  >/dev/null 2>"$work/bad4.log"
[ $? -eq 64 ] || fail "a plan over run.memory_per_rank_gib: want exit 64"
grep -q "run.memory_per_rank_gib = .*: the plan of layout tp1,pp1,dp1,cp2 needs .* would fit with parallel.cp = " \
  "$work/bad4.log" || fail "memory cap message: $(grep -i error "$work/bad4.log" | head -1)"
[ ! -d "$work/bad4/checkpoints" ] || fail "the refused run left checkpoints"
echo "context parallelism through forge-train: PASS"
