#!/usr/bin/env bash
# A checkpoint written by an earlier release keeps resuming: fixtures/ed0aa34 holds the step-4 milestone
# that release ed0aa34 wrote for fixtures/ed0aa34/spec.ini (one process, synthetic data), and the losses
# that release logged for all 6 steps of that run. The current forge-train resumes from it (its
# verification batch, stored as token rows before batches carried targets and weights, must reproduce the
# recorded loss) and its steps 5 and 6 must log exactly the losses the old release logged.
# Usage: old_checkpoint_test.sh FORGE_TRAIN SOURCE_DIR
set -uo pipefail
train=$1 src=$2
fixture=$src/test/launcher/fixtures/ed0aa34
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"

mkdir -p "$work/run/checkpoints"
cp -r "$fixture/checkpoints/milestone" "$work/run/checkpoints/"
"$train" "$fixture/spec.ini" --run.dir="$work/run" 2>"$work/log" || fail "resume failed: $(tail -n1 "$work/log")"
grep -q "resumed from .*step-00000004 (step 4); verification loss .* matches" "$work/log" \
  || fail "did not resume from the old checkpoint with its verification step: $(grep -m1 -i 'resum\|verif' "$work/log")"
want=$(python3 -c "import json; l = json.load(open('$fixture/losses.json'))['losses']; [print(s, l[s]) for s in ('5', '6')]")
diff <(echo "$want") <(losses "$work/run/metrics/rank-0.jsonl") \
  || fail "steps 5-6 after resuming the old checkpoint differ from the old release's run"
echo "PASS: release ed0aa34's checkpoint resumed; steps 5-6 equal its losses"
