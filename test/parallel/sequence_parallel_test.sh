#!/usr/bin/env bash
# Sequence parallelism through forge-train on MPI ranks: with parallel.sequence_parallel the residual stream
# is cut over tp, and every run reproduces the same layout without it bit for bit — losses, gradient norms
# and the checkpoint's weights and moments: a GQA + RoPE Llama at tp2 (also with selective and with full
# recompute), GPT-2 (LayerNorm with biases, learned positions) at tp2, tp2 x pp2 with two micro-batches, tp2 x cp2,
# the Llama at tp2 in BF16, and Qwen3 (qk-norm) at tp4. A run saved with it resumes without it and continues the curve exactly; the plan
# shows the activations it saves; bad settings exit 64 naming the key.
# Usage: sequence_parallel_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
common=(--run.threads=1 --model.layers=2 --model.d_model=64 --model.heads=4 --model.vocab=256
  --ckpt.recovery_every=0 --ckpt.milestone_every=4)
shape=(--model.seq_len=64 --data.batch=2)
llama=(--model.family=llama --model.kv_heads=2 --model.ffn_hidden=128)
# [STEPS=n] run NAME RANKS OVERRIDES...: 8 steps unless STEPS says.
run() {
  local name=$1 np=$2
  shift 2
  "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/$name" "${common[@]}" \
    "${shape[@]}" --run.steps="${STEPS:-8}" "$@" 2>"$work/$name.log" || fail "$name failed: $(tail -n3 "$work/$name.log")"
}
# identical A B: the same losses and gradient norms at every step, and the same checkpoint shards at step 8.
identical() {
  python3 - "$work/$1" "$work/$2" <<'PY' || fail "$2 is not $1 bit for bit"
import glob, json, os, sys
a, b = sys.argv[1:]
def curve(run): return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{run}/metrics/rank-0.jsonl"))]
assert curve(a) == curve(b), (curve(a), curve(b))
shards = sorted(glob.glob(f"{a}/checkpoints/milestone/step-00000008/rank-*.bin"))
assert shards
for s in shards:
    assert open(s, "rb").read() == open(f"{b}/checkpoints/milestone/step-00000008/{os.path.basename(s)}", "rb").read(), s
print(f"{os.path.basename(b)}: {len(curve(b))} steps and {len(shards)} checkpoint shards bit for bit")
PY
}

run llama 2 "${llama[@]}" --parallel.tp=2
run llama-sp 2 "${llama[@]}" --parallel.tp=2 --parallel.sequence_parallel=true
identical llama llama-sp
"$train" "$src/configs/tiny.ini" --run.dir="$work/one" "${common[@]}" "${shape[@]}" --run.steps=8 \
  "${llama[@]}" 2>"$work/one.log" ||
  fail "single-process run failed: $(tail -n1 "$work/one.log")"
compare "$work/one" "$work/llama-sp"
run llama-re 2 "${llama[@]}" --parallel.tp=2 --model.recompute=selective
run llama-sp-re 2 "${llama[@]}" --parallel.tp=2 --model.recompute=selective --parallel.sequence_parallel=true
identical llama llama-re
identical llama llama-sp-re
run llama-sp-full 2 "${llama[@]}" --parallel.tp=2 --model.recompute=full --parallel.sequence_parallel=true
identical llama llama-sp-full
run gpt2 2 --model.family=gpt2 --parallel.tp=2
run gpt2-sp 2 --model.family=gpt2 --parallel.tp=2 --parallel.sequence_parallel=true
identical gpt2 gpt2-sp
pp=("${llama[@]}" --parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2)
run pp 4 "${pp[@]}"
run pp-sp 4 "${pp[@]}" --parallel.sequence_parallel=true
identical pp pp-sp
run cp 4 "${llama[@]}" --parallel.tp=2 --parallel.cp=2
run cp-sp 4 "${llama[@]}" --parallel.tp=2 --parallel.cp=2 --parallel.sequence_parallel=true
identical cp cp-sp
# In BF16: the norms' BF16 outputs are gathered as they are (half the bytes), the rest as in FP32.
run llama16 2 "${llama[@]}" --parallel.tp=2 --precision.dtype=bf16
run llama16-sp 2 "${llama[@]}" --parallel.tp=2 --precision.dtype=bf16 --parallel.sequence_parallel=true
identical llama16 llama16-sp
qwen=(--model.family=qwen3 --model.kv_heads=2 --model.ffn_hidden=128 --parallel.tp=4)
run qwen 4 "${qwen[@]}"
run qwen-sp 4 "${qwen[@]}" --parallel.sequence_parallel=true
identical qwen qwen-sp

# Saved at step 4 with it, resumed without it: steps 5-8 are the plain run's.
STEPS=4 run resume 2 "${llama[@]}" --parallel.tp=2 --parallel.sequence_parallel=true
run resume 2 "${llama[@]}" --parallel.tp=2
grep -q "verification loss .* matches" "$work/resume.log" || fail "the resume skipped the verification step"
identical llama resume

# The plan: the stream's share of the activations halves.
for sp in false true; do
  "$train" "$src/configs/tiny.ini" "${common[@]}" "${shape[@]}" "${llama[@]}" --parallel.tp=2 --parallel.sequence_parallel=$sp \
    --plan --json >"$work/plan-$sp.json" || fail "--plan with sequence_parallel = $sp failed"
done
python3 - "$work" <<'PY' || fail "the plan shows no saving"
import json, sys
act = {sp: json.load(open(f"{sys.argv[1]}/plan-{sp}.json"))["stages"][0]["bytes"]["activations"] for sp in ("false", "true")}
assert act["true"] < act["false"], act
print(f"planned activations at tp2: {act['true']} bytes with sequence parallelism, {act['false']} without")
PY

# Bad input: exit 64, one line naming the key.
run_bad() {
  local name=$1 np=$2 want=$3
  shift 3
  "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/$name" "${common[@]}" "$@" \
    >/dev/null 2>"$work/$name.log"
  [ $? -eq 64 ] || fail "$name: want exit 64"
  grep -q "$want" "$work/$name.log" || fail "$name message: $(grep -i error "$work/$name.log" | head -1)"
  [ ! -d "$work/$name/checkpoints" ] || fail "$name: the refused run left checkpoints"
}
run_bad rows 2 "parallel.sequence_parallel.*micro-batch's 48 rows .* must be a multiple of 64" "${llama[@]}" \
  --parallel.tp=2 --parallel.sequence_parallel=true --model.seq_len=48 --data.batch=1
run_bad moe 2 "parallel.sequence_parallel.*model.ffn = moe" "${shape[@]}" --model.family=mixtral --model.kv_heads=2 \
  --model.experts=4 --parallel.tp=2 --parallel.sequence_parallel=true
echo "sequence parallelism through forge-train: PASS"
