#!/usr/bin/env bash
# Mixture of Experts through forge-train on real MPI ranks: dropless EP1, EP2, EP2 x TP2 x PP2, CP2 and
# CP2 x DP2 x EP2 give the one-process losses (and, under cp, router figures) over 20 steps, and so do the
# Mixtral and Qwen2-MoE families; a checkpoint saved on CP2 x EP2 resumes on DP2 x EP2, one saved on EP2
# resumes on EP4, and that one on pp2 at EP1, continuing the one-process curve; the token all-to-all moves
# exactly the analytic volume; the metrics carry every block's expert load; capacity drops are counted,
# not errors; a dead expert is reported, or stops the run (71); bad MoE settings exit 64 naming the key.
# Usage: moe_train_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
moe=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=64 --model.heads=4
  --model.vocab=256 --model.seq_len=32 --ckpt.recovery_every=0 --ckpt.milestone_every=0
  --model.ffn=moe --model.experts=4 --model.top_k=2)
run() { local np=$1 dir=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/$dir" "${moe[@]}" "$@" \
    2>"$work/$dir.log" || fail "$dir failed: $(grep -i error "$work/$dir.log" | head -3)"; }

# One process, 4 sequences per step in two micro-batches of 2 (the load-balancing loss is a micro-batch's,
# so layouts agree when their micro-batches hold the same sequences); then the same micro-batches on 2
# data-parallel ranks without and with expert parallelism, and on 8 ranks of tp2, pp2, dp2 with ep2 and
# ZeRO-1.
"$train" "$src/configs/tiny.ini" --run.dir="$work/ref" "${moe[@]}" --run.steps=20 --data.batch=2 \
  --parallel.microbatches=2 2>"$work/ref.log" \
  || fail "one-process MoE run failed: $(tail -n2 "$work/ref.log")"
run 2 ep1 --run.steps=20 --data.batch=2 --parallel.dp=2
compare "$work/ref" "$work/ep1"
run 2 ep2 --run.steps=20 --data.batch=2 --parallel.dp=2 --parallel.ep=2
compare "$work/ref" "$work/ep2"
run 8 ep2tp2pp2 --run.steps=20 --data.batch=2 --parallel.tp=2 --parallel.pp=2 --parallel.dp=2 --parallel.ep=2 \
  --parallel.zero=1
compare "$work/ref" "$work/ep2tp2pp2"

# Context parallelism: each rank routes 1/cp of every sequence's tokens, and the router's load-balancing
# and z losses are summed over the cp group, so cp2 and cp2 x dp2 x ep2 with ZeRO-1 (experts' gradients
# over dp/ep x cp) give the one-process losses and router figures; a checkpoint saved on cp2 x ep2 resumes
# on dp2 x ep2; capacity-bound routing under cp is refused (a rank's capacity would drop other tokens).
run 2 cp2 --run.steps=20 --data.batch=2 --parallel.microbatches=2 --parallel.cp=2
compare "$work/ref" "$work/cp2"
run 4 cp2dp2ep2 --run.steps=20 --data.batch=2 --parallel.cp=2 --parallel.dp=2 --parallel.ep=2 --parallel.zero=1
compare "$work/ref" "$work/cp2dp2ep2"
python3 - "$work/ref" "$work/cp2" "$work/cp2dp2ep2" <<'PY' || fail "router figures under cp differ from one process"
import json, sys
def figures(run):
    return [(r["step"], m["layer"], m[key]) for r in map(json.loads, open(f"{run}/metrics/rank-0.jsonl"))
            for m in r["moe"] for key in ("aux_loss", "z_loss", "router_entropy")]
ref = figures(sys.argv[1])
for run in sys.argv[2:]:
    got = figures(run)
    assert len(got) == len(ref), (run, len(got), len(ref))
    worst = max(abs(g[2] - r[2]) / max(abs(r[2]), 1e-12) for g, r in zip(got, ref))
    print(f"{run}: router figures within {worst:.1e} of one process")
    assert worst <= 1e-5, (run, worst)
PY
run 4 cpresume --run.steps=3 --data.batch=2 --parallel.cp=2 --parallel.dp=2 --parallel.ep=2 --parallel.zero=1
run 2 cpresume --run.steps=20 --data.batch=2 --parallel.dp=2 --parallel.ep=2
grep -q "verification loss .* matches" "$work/cpresume.log" || fail "the cp2 -> dp2 resume skipped the verification step"
compare "$work/ref" "$work/cpresume" 4
"$mpiexec" --oversubscribe -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/cpcap" "${moe[@]}" \
  --parallel.cp=2 --model.capacity_factor=1.25 >/dev/null 2>"$work/cpcap.log"
rc=$?
[ $rc -eq 64 ] || fail "capacity-bound MoE on cp2: exit $rc, want 64"
grep -q "model.capacity_factor.*use 0 (dropless)" "$work/cpcap.log" \
  || fail "capacity-bound MoE on cp2: $(tail -n1 "$work/cpcap.log")"

# The MoE families: Mixtral (SwiGLU experts, renormalised top-2 gates, 2 key/value heads) and Qwen2-MoE (a
# sigmoid-gated shared expert, split by tensor parallelism like a dense MLP) on ep2 and on tp2 x dp2 x ep2
# against one process.
for family in mixtral qwen2_moe; do
  fam=(--model.family=$family --model.kv_heads=2 --model.moe_hidden=64)
  "$train" "$src/configs/tiny.ini" --run.dir="$work/${family}_ref" "${moe[@]}" "${fam[@]}" --run.steps=20 \
    --data.batch=2 --parallel.microbatches=2 2>"$work/${family}_ref.log" \
    || fail "one-process $family run failed: $(tail -n2 "$work/${family}_ref.log")"
  run 2 "${family}_ep2" "${fam[@]}" --run.steps=20 --data.batch=2 --parallel.dp=2 --parallel.ep=2
  compare "$work/${family}_ref" "$work/${family}_ep2"
  run 4 "${family}_tp2ep2" "${fam[@]}" --run.steps=20 --data.batch=2 --parallel.tp=2 --parallel.dp=2 --parallel.ep=2
  compare "$work/${family}_ref" "$work/${family}_tp2ep2"
done

# The metrics: every block's expert load and router figures; the all-to-all's bytes, summed over the ep2
# run's ranks, are the analytic volume: per MoE block and micro-batch, the counts (experts x 8 bytes per
# rank) and four exchanges of rows (dispatch and combine, forward and backward), each N x top_k rows of
# d_model floats per rank.
python3 - "$work/ep2/metrics" <<'PY' || fail "MoE metrics"
import json, sys
ranks = [[json.loads(l) for l in open(f"{sys.argv[1]}/rank-{r}.jsonl")] for r in range(2)]
rec = ranks[0][2]
assert [m["layer"] for m in rec["moe"]] == [0, 1], rec.get("moe")
for m in rec["moe"]:
    for key in ("tokens_min", "tokens_max", "tokens_cv", "dropped_fraction", "router_entropy", "aux_loss", "z_loss"):
        assert key in m, key
    assert sum(m["tokens"]) == 4 * 32 * 2 and m["dropped_fraction"] == 0, m  # global batch x top_k, dropless
    assert 0 < m["router_entropy"] <= 1.3863, m  # at most log(4)
layers, P, N, k, C, E = 2, 2, 2 * 32, 2, 64, 4
analytic = layers * (P * E * 8 + 4 * P * N * k * C * 4)
for step in range(20):
    sent = sum(r[step]["expert_comm_bytes"] for r in ranks)
    assert sent == analytic, (step, sent, analytic)
print(f"all-to-all: {analytic} bytes per step over 2 ranks, as analysed")
PY

# Saved on EP2 at step 3, resumed on EP4 to step 5 (dp4, one sequence per rank), then on pp2 at EP1 (8
# ranks) to step 20, against one process training the same sequences in
# micro-batches of one. The first two legs end inside the warm-up, where the learning rate does not depend
# on run.steps.
"$train" "$src/configs/tiny.ini" --run.dir="$work/ref1" "${moe[@]}" --run.steps=20 --data.batch=1 \
  --parallel.microbatches=4 2>"$work/ref1.log" || fail "one-process MoE run failed: $(tail -n2 "$work/ref1.log")"
run 4 reshard --run.steps=3 --data.batch=1 --parallel.dp=4 --parallel.ep=2 --parallel.zero=1
run 4 reshard --run.steps=5 --data.batch=1 --parallel.dp=4 --parallel.ep=4 --parallel.zero=1
grep -q "verification loss .* matches" "$work/reshard.log" || fail "the EP4 resume skipped the verification step"
run 8 reshard --run.steps=20 --data.batch=1 --parallel.pp=2 --parallel.dp=4 --parallel.zero=1
grep -q "verification loss .* matches" "$work/reshard.log" || fail "the pp2 resume skipped the verification step"
compare "$work/ref1" "$work/reshard" 4

# Capacity below the load: drops are counted in the metrics, the run goes on.
"$train" "$src/configs/tiny.ini" --run.dir="$work/cap" "${moe[@]}" --run.steps=3 --model.capacity_factor=0.5 \
  2>"$work/cap.log" || fail "a capacity-bound run failed: $(tail -n2 "$work/cap.log")"
python3 -c "
import json, sys
r = json.loads(open('$work/cap/metrics/rank-0.jsonl').readline())
sys.exit(0 if all(m['dropped_fraction'] >= 0.5 for m in r['moe']) else f'drops not counted: {r[\"moe\"]}')" \
  || fail "capacity drops"

# A dead expert: reported in the metrics and the log, or (action stop) exit 71 naming it.
"$train" "$src/configs/tiny.ini" --run.dir="$work/dead" "${moe[@]}" --run.steps=6 --guard.inject_dead_expert=1/3 \
  --guard.dead_expert_steps=4 2>"$work/dead.log" || fail "dead expert (report) failed: $(tail -n2 "$work/dead.log")"
grep -q "dead expert 1/3: no token for 4 steps" "$work/dead.log" || fail "the dead expert was not logged"
grep -q '"kind":"dead_expert"' "$work/dead/metrics/rank-0.jsonl" || fail "the dead expert is not in the metrics"
"$train" "$src/configs/tiny.ini" --run.dir="$work/dead2" "${moe[@]}" --run.steps=6 --guard.inject_dead_expert=1/3 \
  --guard.dead_expert_steps=4 --guard.dead_expert_action=stop >/dev/null 2>"$work/dead2.log"
rc=$?
[ $rc -eq 71 ] || fail "dead expert (stop): exit $rc, want 71"
grep -q "step 4: dead expert 1/3" "$work/dead2.log" || fail "stop message: $(tail -n1 "$work/dead2.log")"

# Bad MoE settings: exit 64 naming the key, before anything starts.
bad() { local key=$1; shift
  "$train" "$src/configs/tiny.ini" --run.dir="$work/bad" --model.layers=2 "$@" >/dev/null 2>"$work/bad.log"
  local rc=$?
  [ $rc -eq 64 ] || fail "$*: exit $rc, want 64"
  grep -q "$key" "$work/bad.log" || fail "$*: the message does not name $key: $(tail -n1 "$work/bad.log")"
}
bad "parallel.ep.*must divide model.experts = 3" --model.ffn=moe --model.experts=3 --parallel.dp=2 --parallel.ep=2
bad "model.top_k.*must be from 1 to model.experts = 4" --model.ffn=moe --model.experts=4 --model.top_k=5
bad "parallel.ep.*must divide parallel.dp = 3" --model.ffn=moe --model.experts=4 --parallel.dp=3 --parallel.ep=2
bad "model.moe_every.*must be from 1 to model.layers = 2" --model.ffn=moe --model.experts=4 --model.moe_every=3
bad "model.moe_every" --model.ffn=moe --model.experts=4 --model.moe_every=0
bad "model.experts.*needs at least 2 experts" --model.ffn=moe
bad "model.experts.*is set but model.ffn = dense" --model.experts=4
bad "parallel.ep.*needs a Mixture-of-Experts model" --parallel.dp=2 --parallel.ep=2
echo "PASS"
