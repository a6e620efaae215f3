#!/usr/bin/env bash
# run.objective = dpo end to end on the real binaries: a preference dataset (forge-data prepare --format
# preference), a base model trained on it, then DPO from that model as its own reference: step 1's loss is
# ln 2 (policy = reference), the loss falls and the chosen replies gain; the reference log-probabilities are
# computed once and kept beside the dataset, a second run reuses them, a damaged or foreign file exits 65; a
# preempted DPO run resumes with exactly the uninterrupted run's losses; a live reference (a frozen copy)
# trains as the stored one and resumes exactly; the same losses with each pair's row shared out over
# context-parallel ranks; what dpo needs is refused with 64.
# Usage: dpo_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR [MPIEXEC]
set -uo pipefail
train=$1 data=$2 src=$3 mpiexec=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
# Pairs whose chosen reply follows the prompt's instruction and whose rejected one does not.
python3 - "$work/pairs.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):
        a, b = random.sample(words, 2)
        n = random.randint(2, 5)
        f.write(json.dumps({"prompt": f"Repeat {a} {n} times, then say {b}. ({i})",
                            "chosen": " ".join([a] * n) + " and " + b + ".",
                            "rejected": " ".join(random.sample(words, n)) + "?"}) + "\n")
PY
"$data" prepare --format preference --input "$work/pairs.jsonl=pref" --vocab 400 --valid-fraction 0.1 \
  --out "$work/ds" >/dev/null 2>"$work/prepare.log" || fail "prepare failed: $(tail -n1 "$work/prepare.log")"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2
  --model.seq_len=64 --model.vocab=400 --data.dataset="$work/ds")
"$train" "$src/configs/tiny.ini" --run.dir="$work/base" "${model[@]}" --run.steps=20 --ckpt.milestone_every=20 \
  2>"$work/base.log" || fail "base run failed: $(tail -n1 "$work/base.log")"
base=$(ls -d "$work"/base/checkpoints/milestone/step-* | tail -n1)
dpo=("${model[@]}" --run.objective=dpo --ckpt.init_from="$base" --dpo.beta=0.5 --optim.weight_decay=0
  --optim.lr=2e-3 --ckpt.recovery_every=5)

"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${dpo[@]}" --run.steps=30 2>"$work/a.log" ||
  fail "dpo run failed: $(tail -n1 "$work/a.log")"
grep -q "reference log-probabilities of [0-9]* pairs" "$work/a.log" || fail "no reference pass reported"
refs=$(ls "$work"/ds/references/*.logps 2>/dev/null)
[ -n "$refs" ] && [ -s "$refs.json" ] || fail "no reference log-probabilities kept beside the dataset"
python3 - "$work/a/metrics/rank-0.jsonl" <<'PY' || fail "the DPO metrics are wrong"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0], rows[-1]
assert abs(first["loss"] - math.log(2)) < 1e-6, ("step 1 is not ln 2", first["loss"])
assert abs(first["reward_margin"]) < 1e-5, first
assert last["loss"] < 0.8 * first["loss"], ("the loss did not fall", first["loss"], last["loss"])
assert last["reward_margin"] > 0.2 and last["accuracy"] > 0.7, last
assert all(r["scored_tokens"] == 4 for r in rows), "not normalised by the pairs (data.batch = 4)"
PY

# Lineage: every checkpoint of the run names the model it started from and that model's dataset version,
# also after a resume (run c below).
lineage_of() {
  python3 - "$1" "$base" <<'PY'
import glob, json, os, sys
run, base = sys.argv[1], sys.argv[2]
manifests = sorted(glob.glob(f"{run}/checkpoints/*/step-*/manifest.json"))
assert manifests, "no checkpoint"
parent_version = json.load(open(f"{base}/manifest.json"))["dataset_version"]
for m in manifests:
    lineage = json.load(open(m))["extra"].get("lineage")
    assert lineage and lineage["parent"] == os.path.normpath(os.path.abspath(base)), (m, lineage)
    assert lineage["parent_dataset_version"] == parent_version and parent_version, (m, lineage)
PY
}
lineage_of "$work/a" || fail "the DPO run's checkpoints do not name their parent"

# A second run finds the stored values instead of computing them.
"$train" "$src/configs/tiny.ini" --run.dir="$work/b" "${dpo[@]}" --run.steps=30 2>"$work/b.log" ||
  fail "second dpo run failed: $(tail -n1 "$work/b.log")"
grep -q "reference log-probabilities of" "$work/b.log" && fail "the second run computed the reference again"
cmp -s <(grep -o '"loss":[^,]*' "$work/a/metrics/rank-0.jsonl") <(grep -o '"loss":[^,]*' "$work/b/metrics/rank-0.jsonl") ||
  fail "stored reference: other losses"

# Context parallelism (MPIEXEC given): each pair's row cut into 2 x cp chunks over cp2 ranks (ring; all-to-all
# with dp2 too), its replies' log-probabilities summed over the ranks: run a's losses and margins.
if [ -n "$mpiexec" ]; then
  source "$src/test/parallel/common.sh"
  for layout in "2 --parallel.cp=2" "4 --parallel.cp=2 --parallel.dp=2 --data.batch=2 --parallel.cp_comm=a2a"; do
    read -r np args <<<"$layout"
    # shellcheck disable=SC2086
    "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/cp$np" "${dpo[@]}" \
      --run.steps=30 $args 2>"$work/cp$np.log" || fail "dpo over cp: $(grep -i error "$work/cp$np.log" | head -2)"
    compare "$work/a" "$work/cp$np"
  done
fi

# Preempted at step ~6 and resumed: every loss equals the uninterrupted run's.
preempt_and_resume "$work/c" 6 "$work/c.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${dpo[@]}" \
  --run.steps=30 || fail "the preempted DPO run"
for key in loss reward_margin accuracy; do
  cmp -s <(grep -o "\"$key\":[^,]*" "$work/a/metrics/rank-0.jsonl") <(grep -o "\"$key\":[^,]*" "$work/c/metrics/rank-0.jsonl") ||
    fail "the resumed DPO run's $key differs from the uninterrupted run's"
done
lineage_of "$work/c" || fail "the resumed DPO run's checkpoints lost their lineage"

# A live reference (dpo.reference_mode = live): a frozen copy of the reference computes the log-probabilities
# as batches are read, without the pass; step 1 is exactly ln 2 and the losses are the stored reference's up
# to rounding (the pass sums another arrangement of rows), and a preempted live run
# resumes with exactly the uninterrupted live run's losses.
live=("${dpo[@]}" --dpo.reference_mode=live --run.steps=30)
"$train" "$src/configs/tiny.ini" --run.dir="$work/f" "${live[@]}" 2>"$work/f.log" ||
  fail "live-reference dpo run failed: $(tail -n1 "$work/f.log")"
grep -q "a frozen copy computes its log-probabilities every step" "$work/f.log" || fail "no live reference reported"
grep -q "reference log-probabilities of" "$work/f.log" && fail "the live run ran the reference pass"
python3 - "$work/a/metrics/rank-0.jsonl" "$work/f/metrics/rank-0.jsonl" <<'PY' || fail "live and stored references train differently"
import json, sys
stored, live = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert live[0] == float.fromhex("0x1.62e430p-1"), ("step 1 is not ln 2 in FP32", live[0])
assert len(live) == 30 and all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(stored, live)), (stored, live)
PY
preempt_and_resume "$work/g" 6 "$work/g.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/g" "${live[@]}" ||
  fail "the preempted live-reference run"
cmp -s <(grep -o '"loss":[^,]*' "$work/f/metrics/rank-0.jsonl") <(grep -o '"loss":[^,]*' "$work/g/metrics/rank-0.jsonl") ||
  fail "the resumed live-reference run's losses differ from the uninterrupted run's"

# A damaged or foreign reference file: 65, naming it.
cp "$refs.json" "$work/sidecar"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["dataset_version"]="0"*64; json.dump(m, open(sys.argv[1], "w"))' "$refs.json"
"$train" "$src/configs/tiny.ini" --run.dir="$work/d" "${dpo[@]}" --run.steps=2 >"$work/d.log" 2>&1
rc=$?
[ $rc -eq 65 ] && grep -q "reference log-probabilities for dataset_version" "$work/d.log" ||
  fail "a foreign reference file: exit $rc: $(tail -n1 "$work/d.log")"
cp "$work/sidecar" "$refs.json"
printf 'x' >>"$refs"
"$train" "$src/configs/tiny.ini" --run.dir="$work/d" "${dpo[@]}" --run.steps=2 >"$work/d.log" 2>&1
rc=$?
[ $rc -eq 65 ] && grep -q "damaged reference log-probabilities" "$work/d.log" ||
  fail "a damaged reference file: exit $rc: $(tail -n1 "$work/d.log")"

# What dpo needs: a reference model, a preference dataset, the reference's architecture.
expect64() {
  local what=$1 pattern=$2
  shift 2
  "$train" "$src/configs/tiny.ini" --run.dir="$work/e" "$@" --run.steps=2 >"$work/e.log" 2>&1
  local rc=$?
  [ $rc -eq 64 ] && grep -q -- "$pattern" "$work/e.log" || fail "$what: exit $rc: $(tail -n1 "$work/e.log")"
  [ ! -e "$work/e/checkpoints" ] || fail "$what: a refused run left checkpoints"
}
expect64 "dpo without a reference" "dpo needs a reference model" "${model[@]}" --run.objective=dpo
expect64 "sft on preference data" "sft needs a chat or image-text dataset" "${model[@]}" --run.objective=sft
expect64 "dpo on the synthetic stream" "dpo needs a preference dataset" --model.vocab=400 --run.objective=dpo \
  --ckpt.init_from="$base"
expect64 "a reference of another architecture" "d_model" "${model[@]}" --model.d_model=64 --run.objective=dpo \
  --ckpt.init_from="$base"
echo "PASS: dpo from ln 2 to $(tail -n1 "$work/a/metrics/rank-0.jsonl" | grep -o '"loss":[0-9.]*'), reference kept and reused, exact resume, bad input refused"
