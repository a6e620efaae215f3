#!/usr/bin/env bash
# Continued pretraining end to end on the real binaries: a model pretrained on one dataset version and
# promoted to a release, then trained further on a new version (the same tokenizer) from that release,
# with its optimizer reset or kept (ckpt.init_optimizer). Both re-warm the learning rate from step 1 of
# their own schedule; keep carries the AdamW moments (the runs part after step 1) and bias correction
# counts the parent's steps, recorded in every checkpoint and restored on resume: a preempted keep run
# resumes with exactly the uninterrupted run's losses. Every checkpoint names its parent and the parent's
# dataset version.
# Usage: continued_test.sh FORGE_TRAIN FORGE_DATA FORGE_CKPT SOURCE_DIR
set -uo pipefail
train=$1 data=$2 ckpt=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
export FORGE_REGISTRY=$work/registry.db  # forge-ckpt promote registers the release
# shellcheck source=test/support/datasets.sh
source "$src/test/support/datasets.sh"
two_dataset_versions "$work" "$data" 30 50 || fail "the two dataset versions"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2 --model.seq_len=64
  --model.vocab=300)
"$train" "$src/configs/tiny.ini" --run.dir="$work/base" "${model[@]}" --data.dataset="$work/v1" --run.steps=20 \
  --ckpt.milestone_every=20 2>"$work/base.log" || fail "base run failed: $(tail -n1 "$work/base.log")"
echo '{"decision": "promote"}' >"$work/verdict.json"
release=$("$ckpt" promote "$work/base/checkpoints/milestone/step-00000020" --verdict "$work/verdict.json" --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["release"])') || fail "promote failed"
more=("${model[@]}" --data.dataset="$work/v2" --ckpt.init_from="$release" --optim.lr=2e-3 --optim.warmup_steps=4
  --run.steps=40 --ckpt.recovery_every=3)
for mode in reset keep; do
  "$train" "$src/configs/tiny.ini" --run.dir="$work/$mode" "${more[@]}" --ckpt.init_optimizer=$mode \
    2>"$work/$mode.log" || fail "continued run ($mode) failed: $(tail -n1 "$work/$mode.log")"
done
grep -q "initialised weights and optimizer moments from $release" "$work/keep.log" || fail "keep did not load the moments"
python3 - "$work" "$release" <<'PY' || fail "continued pretraining is wrong"
import glob, json, sys
work, release = sys.argv[1], sys.argv[2]
rows = {m: [json.loads(l) for l in open(f"{work}/{m}/metrics/rank-0.jsonl")] for m in ("reset", "keep")}
for m, r in rows.items():
    assert abs(r[0]["lr"] - 2e-3 / 4) < 1e-12, (m, "the learning rate does not re-warm", r[0]["lr"])
assert rows["reset"][0]["loss"] == rows["keep"][0]["loss"], "step 1: the same weights and data"
assert rows["reset"][1]["loss"] != rows["keep"][1]["loss"], "keep trained as reset: the moments were not used"
v1 = json.load(open(f"{release}/manifest.json"))["dataset_version"]
v2 = json.load(open(f"{work}/v2/manifest.json"))["version"]
assert v1 and v1 != v2, (v1, v2)
for m in ("reset", "keep"):
    manifests = sorted(glob.glob(f"{work}/{m}/checkpoints/*/step-*/manifest.json"))
    assert manifests, m
    for path in manifests:
        man = json.load(open(path))
        lineage = man["extra"]["lineage"]
        assert lineage["parent"] == release and lineage["parent_dataset_version"] == v1, (path, lineage)
        assert man["dataset_version"] == v2, path
        assert man["extra"].get("moment_steps_before", 0) == (20 if m == "keep" else 0), (path, man["extra"])
PY
# Preempted at step ~6 and resumed: the moments' step count comes back with them.
preempt_and_resume "$work/keep2" 6 "$work/keep2.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/keep2" \
  "${more[@]}" --ckpt.init_optimizer=keep || fail "the preempted continued run"
cmp -s <(grep -o '"loss":[^,]*' "$work/keep/metrics/rank-0.jsonl") <(grep -o '"loss":[^,]*' "$work/keep2/metrics/rank-0.jsonl") ||
  fail "the resumed continued run's losses differ from the uninterrupted run's"
echo "PASS: continued pretraining from a release on a new dataset version, optimizer reset and kept, re-warm-up, lineage, exact resume"
