#!/usr/bin/env bash
# run.objective = distill end to end on the real binaries: a teacher (two blocks of width 64) trained on a
# text dataset, then a smaller student (one block of width 32) distilled from it: the KL to the teacher
# falls, the teacher's tokenizer is recorded in its checkpoints, and a preempted distillation run resumes with
# exactly the uninterrupted run's losses, and the same losses with the rows shared out over context-parallel
# ranks; a teacher that is not a checkpoint, of another vocabulary or of another tokenizer is refused with 64
# naming both hashes, and one whose heads all-to-all cannot share out, naming them.
# Usage: distill_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR [MPIEXEC]
set -uo pipefail
train=$1 data=$2 src=$3 mpiexec=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
mkdir -p "$work/corpus"
python3 - "$work/corpus" <<'PY'
import random, sys
random.seed(5)
words = "the cat sat on a warm mat and then ran off to see what it could find in the big old house".split()
for d in range(40):
    with open(f"{sys.argv[1]}/doc{d}.txt", "w") as f:
        for s in range(60):  # sentences that walk the word list, so a model can learn them
            i = random.randrange(len(words))
            f.write(" ".join(words[(i + k) % len(words)] for k in range(random.randint(4, 9))) + ".\n")
PY
"$data" prepare --input "$work/corpus" --out "$work/ds" --vocab 300 --valid-fraction 0.1 >/dev/null \
  2>"$work/prepare.log" || fail "prepare failed: $(tail -n1 "$work/prepare.log")"
common=(--run.threads=1 --run.peak_gflops=100 --model.heads=2 --model.seq_len=64 --model.vocab=300
  --data.dataset="$work/ds")
"$train" "$src/configs/tiny.ini" --run.dir="$work/teacher" "${common[@]}" --model.layers=2 --model.d_model=64 \
  --run.steps=40 --optim.lr=3e-3 --ckpt.milestone_every=40 2>"$work/teacher.log" ||
  fail "teacher run failed: $(tail -n1 "$work/teacher.log")"
teacher=$(ls -d "$work"/teacher/checkpoints/milestone/step-* | tail -n1)
python3 - "$teacher/manifest.json" "$work/ds/manifest.json" <<'PY' || fail "the teacher's checkpoint does not record its tokenizer"
import json, sys
extra, ds = json.load(open(sys.argv[1]))["extra"], json.load(open(sys.argv[2]))
assert extra["tokenizer_sha256"] == ds["tokenizer"]["sha256"], (extra.get("tokenizer_sha256"), ds["tokenizer"])
PY
student=("${common[@]}" --model.layers=1 --model.d_model=32 --optim.lr=3e-3)
distill=("${student[@]}" --run.steps=24 --ckpt.recovery_every=4 --run.objective=distill --distill.teacher="$teacher" --distill.alpha=0.8
  --distill.temperature=2)

"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${distill[@]}" 2>"$work/a.log" ||
  fail "distillation run failed: $(tail -n1 "$work/a.log")"
grep -q "distillation teacher $teacher (2 layers, d_model 64" "$work/a.log" || fail "the teacher is not reported"
python3 - "$work/a/metrics/rank-0.jsonl" <<'PY' || fail "the distillation metrics are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all("kl_teacher" in r for r in rows), rows[0]
print([round(r["kl_teacher"], 3) for r in rows], file=sys.stderr)
first, last = rows[0], rows[-1]
assert first["kl_teacher"] > 0.1, ("a fresh student is far from its teacher", first)
assert last["kl_teacher"] < 0.5 * first["kl_teacher"], ("the KL to the teacher did not fall", first, last)
assert last["loss"] < first["loss"], (first["loss"], last["loss"])
PY

# Preempted at step ~6 and resumed: every loss and KL equals the uninterrupted run's.
preempt_and_resume "$work/c" 6 "$work/c.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${distill[@]}" ||
  fail "the preempted distillation run"
for key in loss kl_teacher; do
  cmp -s <(grep -o "\"$key\":[^,]*" "$work/a/metrics/rank-0.jsonl") <(grep -o "\"$key\":[^,]*" "$work/c/metrics/rank-0.jsonl") ||
    fail "the resumed distillation run's $key differs from the uninterrupted run's"
done

# Context parallelism (MPIEXEC given): the student's rows and the teacher's cut alike into 2 x cp chunks over
# cp2 ranks (ring; all-to-all with dp2 too), the teacher's attention shared out as the student's: run a's
# losses and KL. A teacher whose heads a2a cannot share out is refused (below).
if [ -n "$mpiexec" ]; then
  source "$src/test/parallel/common.sh"
  for layout in "2 --parallel.cp=2" "4 --parallel.cp=2 --parallel.dp=2 --data.batch=2 --parallel.cp_comm=a2a"; do
    read -r np args <<<"$layout"
    # shellcheck disable=SC2086
    "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" --run.dir="$work/cp$np" "${distill[@]}" \
      $args 2>"$work/cp$np.log" || fail "distill over cp: $(grep -i error "$work/cp$np.log" | head -2)"
    compare "$work/a" "$work/cp$np"
  done
fi

# What a teacher must be: a checkpoint, of the student's vocabulary and tokenizer.
expect64() {
  local what=$1 pattern=$2
  shift 2
  "$train" "$src/configs/tiny.ini" --run.dir="$work/e" "${student[@]}" --run.objective=distill "$@" --run.steps=2 \
    >"$work/e.log" 2>&1
  local rc=$?
  [ $rc -eq 64 ] && grep -q -- "$pattern" "$work/e.log" || fail "$what: exit $rc: $(tail -n1 "$work/e.log")"
  [ ! -e "$work/e/checkpoints" ] || fail "$what: a refused run left checkpoints"
}
expect64 "distill without a teacher" "distill.teacher.*needs the teacher's checkpoint"
expect64 "a teacher that is not a checkpoint" "distill.teacher.*is not a checkpoint" --distill.teacher="$work/ds"
"$train" "$src/configs/tiny.ini" --run.dir="$work/other" --run.threads=1 --run.peak_gflops=100 --model.heads=2 \
  --model.seq_len=64 --model.layers=1 --model.d_model=32 --model.vocab=300 --run.steps=2 --ckpt.milestone_every=2 \
  2>"$work/other.log" || fail "synthetic teacher run failed: $(tail -n1 "$work/other.log")"
other=$(ls -d "$work"/other/checkpoints/milestone/step-* | tail -n1)
hash=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokenizer"]["sha256"])' "$work/ds/manifest.json")
expect64 "a teacher of another tokenizer" "trained with tokenizer none (synthetic stream), this run's dataset uses $hash" \
  --distill.teacher="$other"
"$train" "$src/configs/tiny.ini" --run.dir="$work/wide" --run.threads=1 --run.peak_gflops=100 --model.heads=2 \
  --model.seq_len=64 --model.layers=1 --model.d_model=32 --model.vocab=512 --run.steps=1 --ckpt.milestone_every=1 \
  2>"$work/wide.log" || fail "wide-vocabulary run failed: $(tail -n1 "$work/wide.log")"
expect64 "a teacher of another vocabulary" "vocabulary of 512 tokens" \
  --distill.teacher="$(ls -d "$work"/wide/checkpoints/milestone/step-* | tail -n1)"
if [ -n "$mpiexec" ]; then
  "$train" "$src/configs/tiny.ini" --run.dir="$work/three" --run.threads=1 --model.heads=3 --model.seq_len=64 \
    --model.vocab=300 --data.dataset="$work/ds" --model.layers=1 --model.d_model=48 --run.steps=1 \
    --ckpt.milestone_every=1 2>"$work/three.log" ||
    fail "three-head teacher run failed: $(tail -n1 "$work/three.log")"
  three=$(ls -d "$work"/three/checkpoints/milestone/step-* | tail -n1)
  "$mpiexec" --oversubscribe -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/e3" "${student[@]}" \
    --run.objective=distill --distill.teacher="$three" --run.steps=2 --parallel.cp=2 --parallel.cp_comm=a2a \
    >/dev/null 2>"$work/e3.log"
  rc=$?
  [ $rc -eq 64 ] && grep -q "distill.teacher.*3 query and 3 key/value heads, which parallel.cp_comm = a2a cannot" \
    "$work/e3.log" || fail "a teacher a2a cannot split: exit $rc: $(grep -m1 -i error "$work/e3.log")"
fi
echo "PASS: distillation KL $(head -n1 "$work/a/metrics/rank-0.jsonl" | grep -o '"kl_teacher":[0-9.]*') -> $(tail -n1 "$work/a/metrics/rank-0.jsonl" | grep -o '"kl_teacher":[0-9.]*'), exact resume, bad teachers refused"
