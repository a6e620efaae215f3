#!/usr/bin/env bash
# forge-gate on the post-training objectives, end to end on the real binaries.
# DPO: a preference dataset, a base model and a DPO run from it (forge-train, as test/launcher/dpo_test.sh);
# under configs/gate.dpo.ini the DPO model passes against its parent, which is its reference (margin and
# accuracy exactly 0), and with no baseline (the floors); its accuracy and margin equal the ones
# pair_margins recomputes from the models' full logits; judged against itself it fails; 2 MPI ranks agree
# with one; a text dataset and a reference that is not there are refused (64).
# Distillation: checkpoints whose spec names a teacher (make_checkpoints KEY=VALUE); under
# configs/gate.distill.ini the model that is its own teacher has KL exactly 0 and passes against its
# parent (KL > 0); a damaged one fails; on chat data the replies are scored; a teacher with another
# vocabulary is refused (64).
# Usage: objectives_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
gate=$build/eval_gate/forge-gate train=$build/launcher/forge-train data=$build/dataio/forge-data
make_checkpoints=$build/test/eval_gate/make_checkpoints
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
launcher=()
run_gate() {  # run_gate EXPECTED_RC CHECKPOINT BASELINE OUT DATASET POLICY; uses $launcher
  local want=$1 ck=$2 base=$3 out=$4 ds=$5 pol=$6
  "${launcher[@]}" "$gate" evaluate --checkpoint "$ck" --dataset "$ds" --baseline "$base" --policy "$pol" \
    --out "$out" --max-sequences 64 --threads 1 --no-promote >"$out.log" 2>&1
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$out.log" >&2; fail "forge-gate on $(basename "$ck") vs $base: exit $rc, want $want"; }
}

# --- DPO. Pairs whose chosen reply follows the prompt's instruction and whose rejected one does not; one
# in six the other way round, so that the tuned model ranks some held-out pairs wrong.
python3 - "$work/pairs.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
with open(sys.argv[1], "w") as f:
    for i in range(400):
        a, b = random.sample(words, 2)
        n = random.randint(2, 5)
        good, bad = " ".join([a] * n) + " and " + b + ".", " ".join(random.sample(words, n)) + "?"
        if random.random() < 1 / 6:
            good, bad = bad, good
        f.write(json.dumps({"prompt": f"Repeat {a} {n} times, then say {b}. ({i})", "chosen": good,
                            "rejected": bad}) + "\n")
PY
"$data" prepare --format preference --input "$work/pairs.jsonl=pairs" --vocab 360 --valid-fraction 0.1 \
  --out "$work/pairs" >/dev/null 2>"$work/prepare.log" || fail "prepare pairs: $(tail -n1 "$work/prepare.log")"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2
  --model.seq_len=64 --model.vocab=360 --data.dataset="$work/pairs")
"$train" "$src/configs/tiny.ini" --run.dir="$work/base" "${model[@]}" --run.steps=20 --ckpt.milestone_every=20 \
  2>"$work/base.log" || fail "base run: $(tail -n1 "$work/base.log")"
base=$work/base/checkpoints/milestone/step-00000020
"$train" "$src/configs/tiny.ini" --run.dir="$work/dpo" "${model[@]}" --run.objective=dpo --ckpt.init_from="$base" \
  --dpo.beta=0.5 --optim.weight_decay=0 --optim.lr=2e-3 --run.steps=30 --ckpt.milestone_every=30 \
  2>"$work/dpo.log" || fail "dpo run: $(tail -n1 "$work/dpo.log")"
dpo=$work/dpo/checkpoints/milestone/step-00000030
# The shipped policy, with a token minimum this small split meets.
sed 's/^min_tokens = .*/min_tokens = 64/' "$src/configs/gate.dpo.ini" >"$work/gate.dpo.ini"

run_gate 0 "$dpo" "$base" "$work/g-dpo" "$work/pairs" "$work/gate.dpo.ini"
v=$work/g-dpo/verdict.json
[ "$(json "$v" 'd["baseline_domains"]["pairs"]["reward_margin"] == 0 and d["baseline_domains"]["pairs"]["accuracy"] == 0 and d["baseline_domains"]["pairs"]["reward_margin_se"] == 0')" = True ] ||
  fail "the parent (the reference itself) has a margin: $(json "$v" 'd["baseline_domains"]["pairs"]')"
[ "$(json "$v" '[(c["kind"], c["baseline"], c["pass"]) for c in d["checks"] if c["metric"] in ("accuracy", "reward_margin")]')" = \
  "[('min_stderr_improvement', 0.5, True), ('min_stderr_improvement', 0.0, True)]" ] ||
  fail "DPO checks: $(json "$v" 'd["checks"]')"
[ "$(json "$v" 'd["scoring"]["dpo"]["beta"] == 0.5 and d["scoring"]["dpo"]["reference"]["path"] == sys.argv[3]' "$(realpath "$base")")" = True ] ||
  fail "the verdict does not name the reference and beta: $(json "$v" 'd["scoring"]')"
grep -q "^pairs *accuracy .*(baseline 0.0000" "$work/g-dpo/summary.txt" || fail "summary lacks the accuracy line"
# The same figures from the full logits.
"$build/test/eval_gate/pair_margins" "$work/pairs" pairs "$dpo" "$base" 0.5 64 >"$work/oracle.json" 2>&1 ||
  fail "pair_margins: $(cat "$work/oracle.json")"
python3 - "$v" "$work/oracle.json" <<'PY' || fail "the gate's DPO figures differ from the recomputed ones"
import json, sys
got, want = json.load(open(sys.argv[1]))["domains"]["pairs"], json.load(open(sys.argv[2]))
assert got["pairs"] == want["pairs"] > 10, (got["pairs"], want)
assert got["accuracy"] == want["accuracy"], (got["accuracy"], want)
assert abs(got["reward_margin"] - want["reward_margin"]) < 1e-4 * max(1, abs(want["reward_margin"])), (got, want)
assert 0.5 < got["accuracy"] < 1 and got["accuracy_se"] > 0 and got["reward_margin_se"] > 0, got
PY

# Judged against itself it has improved on nothing.
run_gate 1 "$dpo" "$dpo" "$work/g-self" "$work/pairs" "$work/gate.dpo.ini"
grep -q "^FAIL accuracy" "$work/g-self/summary.txt" || fail "summary does not show the failed accuracy check"

# No baseline: the floors stand in, on 2 MPI ranks that agree with one.
launcher=(mpirun -np 2 --oversubscribe)
run_gate 0 "$dpo" none "$work/g-mpi" "$work/pairs" "$work/gate.dpo.ini"
launcher=()
[ "$(json "$work/g-mpi/verdict.json" "abs(d['domains']['pairs']['reward_margin'] - $(json "$v" "d['domains']['pairs']['reward_margin']")) < 1e-9 and d['domains']['pairs']['pairs'] == $(json "$v" "d['domains']['pairs']['pairs']")")" = True ] ||
  fail "2-rank DPO figures differ from 1-rank"

# Refused: a text dataset for a DPO model; a reference that is not there.
"$src/scripts/make-demo-corpus.sh" "$work/corpus" 1 >/dev/null || fail "demo corpus"
"$data" prepare --input "$work/corpus/code=code" --input "$work/corpus/legal=legal" --out "$work/ds" --vocab 400 \
  --valid-fraction 0.1 >/dev/null || fail "prepare ds"
printf '[accuracy]\nmin_stderr_improvement = 2\n' >"$work/any.ini"
run_gate 64 "$dpo" "$base" "$work/g-text" "$work/ds" "$work/any.ini"
grep -q "is a text dataset" "$work/g-text.log" || fail "text-dataset message: $(tail -n1 "$work/g-text.log")"
"$make_checkpoints" "$work/ds" "$work/lost" "$work/lost-d" 1 2 run.objective=dpo dpo.reference="$work/nowhere" ||
  fail "make_checkpoints lost"
run_gate 64 "$work/lost/checkpoints/milestone/step-00000002" none "$work/g-lost" "$work/ds" "$work/any.ini"
grep -q "$work/nowhere, which is not a checkpoint here" "$work/g-lost.log" || fail "lost-reference message: $(tail -n1 "$work/g-lost.log")"

# --- Distillation: every checkpoint names the run's last one as its teacher.
teacher=$work/run/checkpoints/milestone/step-00000160
"$make_checkpoints" "$work/ds" "$work/run" "$work/damaged" 40 160 run.objective=distill distill.teacher="$teacher" ||
  fail "make_checkpoints"
parent=$work/run/checkpoints/milestone/step-00000040
sed -e 's/^required_domains = .*/required_domains = code, legal/' -e 's/^min_tokens = .*/min_tokens = 256/' \
  "$src/configs/gate.distill.ini" >"$work/gate.distill.ini"
run_gate 0 "$teacher" "$parent" "$work/g-distill" "$work/ds" "$work/gate.distill.ini"
v=$work/g-distill/verdict.json
for d in code legal; do
  [ "$(json "$v" "d['domains']['$d']['kl'] == 0.0 and d['domains']['$d']['kl_se'] == 0.0")" = True ] ||
    fail "$d: the teacher's own KL is not 0: $(json "$v" "d['domains']['$d']")"
  [ "$(json "$v" "d['baseline_domains']['$d']['kl'] > 0 and d['baseline_domains']['$d']['kl_se'] > 0")" = True ] ||
    fail "$d: the parent's KL: $(json "$v" "d['baseline_domains']['$d']")"
done
[ "$(json "$v" 'sorted(c["domain"] for c in d["checks"] if c["metric"] == "kl" and c["kind"] == "min_stderr_improvement" and c["pass"])')" = "['code', 'legal']" ] ||
  fail "KL checks: $(json "$v" 'd["checks"]')"
run_gate 1 "$work/damaged/checkpoints/milestone/step-00000160" "$parent" "$work/g-damaged" "$work/ds" "$work/gate.distill.ini"
grep -q "^FAIL kl" "$work/g-damaged/summary.txt" || fail "summary does not show the failed KL check"
# On chat data a distilled model is measured on the replies, as it was trained.
python3 "$src/scripts/make-demo-chat.py" "$work/corpus/docs" "$work/chat.jsonl" "$work/unused.jsonl" >/dev/null ||
  fail "make-demo-chat.py"
"$data" prepare --format chat --input "$work/chat.jsonl=chat" --vocab 400 --valid-fraction 0.1 \
  --out "$work/chat" >/dev/null 2>&1 || fail "prepare chat"
"$make_checkpoints" "$work/chat" "$work/c" "$work/c-d" 1 2 run.objective=distill \
  distill.teacher="$work/c/checkpoints/milestone/step-00000002" || fail "make_checkpoints chat"
printf '[kl]\nmax_absolute = 100\n' >"$work/kl.ini"
run_gate 0 "$work/c/checkpoints/milestone/step-00000002" "$work/c/checkpoints/milestone/step-00000001" \
  "$work/g-chat" "$work/chat" "$work/kl.ini"
[ "$(json "$work/g-chat/verdict.json" 'd["replies_only"] and d["document_mask"] and d["domains"]["chat"]["kl"] == 0 and d["baseline_domains"]["chat"]["kl"] > 0')" = True ] ||
  fail "distillation on chat data: $(json "$work/g-chat/verdict.json" '(d["replies_only"], d["domains"])')"

"$make_checkpoints" "$work/ds" "$work/v" "$work/v-d" 1 2 run.objective=distill distill.teacher="$base" ||
  fail "make_checkpoints v"
run_gate 64 "$work/v/checkpoints/milestone/step-00000002" none "$work/g-vocab" "$work/ds" "$work/gate.distill.ini"
grep -q "teacher $base has a vocabulary of 360 tokens but .* has 400" "$work/g-vocab.log" ||
  fail "vocabulary message: $(tail -n1 "$work/g-vocab.log")"
echo "objectives gate test passed"
