#!/usr/bin/env bash
# A vision-language model through forge-train on real MPI ranks, on image-text data prepared here from the
# demo's rendered shapes (scripts/make-demo-images.py, python3-pil): dp2, pp2 (the tower on the first
# stage) and tp2 (also with the final norm) against one process, step by step; the encoder frozen on dp2
# (ZeRO-1) from the one-process run's checkpoint, its tensors bit for bit as they went in (forge-ckpt
# export); bad layouts for a tower (exit 64).
# A vision-language model started from a text-only one: its language model bit for bit under
# train.freeze = lm, on dp2 and pp2 as on one process, and no gradients held for it. The gate's picture
# suites on one and two ranks.
# Usage: vision_test.sh FORGE_TRAIN FORGE_DATA FORGE_CKPT FORGE_GATE SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 data=$2 ckpt=$3 gate=$4 src=$5 mpiexec=$6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
/usr/bin/python3 "$src/scripts/make-demo-images.py" "$work/images" 120 >/dev/null || fail "make-demo-images"
"$data" prepare --format image-text --input "$work/images/train.jsonl" --image.size=32 --image.patch=8 \
  --vocab 300 --out "$work/ds" >"$work/prepare.log" 2>&1 || fail "prepare: $(tail -n1 "$work/prepare.log")"
vlm=(--run.threads=1 --run.peak_gflops=100 --data.dataset="$work/ds" --model.layers=2 --model.d_model=64
  --model.seq_len=64 --model.vocab=300 --vision.width=32 --vision.projector_hidden=48 --ckpt.recovery_every=0
  --guard.watchdog_s=300)
# [steps=N] run NP DIR ARGS...: configs/vlm.ini on NP ranks for N steps (6), a milestone at the end.
run() { local np=$1 dir=$2; shift 2
  "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/vlm.ini" --run.dir="$work/$dir" "${vlm[@]}" \
    --run.steps="${steps:-6}" --ckpt.milestone_every="${steps:-6}" "$@" \
    2>"$work/$dir.log" || fail "$dir failed: $(grep -i error "$work/$dir.log" | head -3)"; }
run 1 one --data.batch=4
run 2 dp2 --data.batch=2 --parallel.dp=2
run 2 pp2 --data.batch=2 --parallel.pp=2 --parallel.microbatches=2
run 2 tp2 --data.batch=4 --parallel.tp=2
compare "$work/one" "$work/dp2"
compare "$work/one" "$work/pp2"
compare "$work/one" "$work/tp2"
# (configs/vlm.ini's tower has no final norm, as LLaVA's; with one, tp2 equals one process too)
run 1 one-post --data.batch=4 --vision.post_norm=on
run 2 tp2-post --data.batch=4 --parallel.tp=2 --vision.post_norm=on
compare "$work/one-post" "$work/tp2-post"

# The encoder frozen, from the one-process run's checkpoint: on dp2 with ZeRO-1, and on tp2 (its split
# products loaded from and saved to whole tensors).
start=$(ls -d "$work/one/checkpoints/milestone/step-"*) || fail "one: no checkpoint"
"$ckpt" export "$start" --out "$work/start.h5" >/dev/null || fail "export failed"
for layout in "dp2 --data.batch=2 --parallel.dp=2 --parallel.zero=1" "tp2 --data.batch=4 --parallel.tp=2"; do
  read -r name args <<<"$layout"
  # shellcheck disable=SC2086 # the layout's options, one word each
  run 2 "frozen-$name" $args --ckpt.init_from="$start" --train.freeze=vision
  end=$(ls -d "$work/frozen-$name/checkpoints/milestone/step-"*) || fail "frozen-$name: no checkpoint"
  "$ckpt" export "$end" --out "$work/end.h5" >/dev/null || fail "export failed"
  /usr/bin/python3 - "$work/start.h5" "$work/end.h5" "$name" <<'PY' || fail "frozen-$name: the frozen encoder moved, or kept moments"
import sys
import h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
encoder = [k for k in a["param"] if k.startswith("vision.")]
trained = [k for k in a["param"] if not k.startswith("vision.")]
assert encoder and all(np.array_equal(a["param"][k][()], b["param"][k][()]) for k in encoder)
assert all(not np.array_equal(a["param"][k][()], b["param"][k][()]) for k in trained if not k.endswith("norm.weight"))
assert not any(k.startswith("vision.") for k in b["adam_m"]) and any(k.startswith("projector.") for k in b["adam_m"])
print(f"frozen on {sys.argv[3]}: {len(encoder)} encoder tensors bit for bit, no encoder moments; {len(trained)} others trained")
PY
done

# A vision-language model started from a text-only one (the same language model, the dataset's tokenizer):
# the encoder and projector trained, the language model frozen (train.freeze = lm) comes out bit for bit.
"$data" prepare --input "$src/docs=docs" --tokenizer "$work/ds/tokenizer.model" --out "$work/text" \
  >"$work/prepare-text.log" 2>&1 || fail "prepare text: $(tail -n1 "$work/prepare-text.log")"
textual=("${vlm[@]/--data.dataset=*/--data.dataset=$work/text}")
"$train" "$src/configs/vlm.ini" --run.dir="$work/text-run" "${textual[@]}" --run.steps=6 --ckpt.milestone_every=6 \
  --data.batch=4 --run.objective=lm --vision.layers=0 2>"$work/text.log" \
  || fail "text failed: $(grep -i error "$work/text.log" | head -3)"
text=$(ls -d "$work/text-run/checkpoints/milestone/step-"*) || fail "text: no checkpoint"
run 2 aligned --data.batch=2 --parallel.dp=2 --ckpt.init_from="$text" --train.freeze=lm
grep -q "its language model; the vision tower and projector start fresh" "$work/aligned.log" \
  || fail "aligned: no word of a fresh tower in its log"
aligned=$(ls -d "$work/aligned/checkpoints/milestone/step-"*) || fail "aligned: no checkpoint"
"$ckpt" export "$text" --out "$work/text.h5" >/dev/null && "$ckpt" export "$aligned" --out "$work/aligned.h5" \
  >/dev/null || fail "export failed"
/usr/bin/python3 - "$work/text.h5" "$work/aligned.h5" <<'PY' || fail "the aligned model's language model moved"
import sys
import h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
lm = list(a["param"])
new = [k for k in b["param"] if k not in a["param"]]
assert lm and all(np.array_equal(a["param"][k][()], b["param"][k][()]) for k in lm)
assert sorted({k.split(".")[0] for k in new}) == ["projector", "vision"], new
assert not any(k in lm for k in b["adam_m"]) and all(k in b["adam_m"] for k in new)
print(f"aligned: {len(lm)} language-model tensors bit for bit from the text model, {len(new)} new ones trained")
PY
# The same on one process, step by step; and on two pipeline stages, the second wholly frozen.
run 1 aligned-one --data.batch=4 --ckpt.init_from="$text" --train.freeze=lm
run 2 aligned-pp2 --data.batch=2 --parallel.pp=2 --parallel.microbatches=2 --ckpt.init_from="$text" \
  --train.freeze=lm
compare "$work/aligned-one" "$work/aligned"
compare "$work/aligned-one" "$work/aligned-pp2"
# A frozen language model holds no gradients: under a wider one (8 blocks of 256), the training state a
# process peaks at (weights, gradients, AdamW's moments: the backend's resident pages) is the language
# model's weights, 4 bytes a parameter of the 16 a trained one holds, and the tower's whole state.
wide=("${vlm[@]/--model.layers=2/--model.layers=8}")
wide=("${wide[@]/--model.d_model=64/--model.d_model=256}")
mem() { "$train" "$src/configs/vlm.ini" --run.dir="$work/$1" "${wide[@]}" --data.batch=4 --run.steps=2 \
  --ckpt.milestone_every=0 "${@:2}" 2>"$work/$1.log" || fail "$1 failed: $(grep -i error "$work/$1.log" | head -3)"; }
mem mem-all
mem mem-lm --train.freeze=lm
/usr/bin/python3 - "$work/mem-all/metrics/rank-0.jsonl" "$work/mem-lm/metrics/rank-0.jsonl" <<'PY' \
  || fail "a frozen language model's training state"
import json, sys
whole, frozen = (max(json.loads(l)["state_mib"] for l in open(p)) for p in sys.argv[1:3])
print(f"training state: {whole:.1f} MiB trained, {frozen:.1f} MiB with the language model frozen ({frozen / whole:.2f}x)")
assert frozen <= 0.35 * whole, (whole, frozen)
PY
rc=0
"$train" "$src/configs/vlm.ini" --run.dir="$work/keep" "${vlm[@]}" --data.batch=4 --ckpt.init_from="$text" \
  --ckpt.init_optimizer=keep >"$work/keep.log" 2>&1 || rc=$?
[ "$rc" -eq 64 ] && grep -q "ckpt.init_optimizer = keep: .*text-only model" "$work/keep.log" \
  || fail "keep moments for a new tower: exit $rc, $(head -n1 "$work/keep.log")"

# The gate's picture suites (the held-out pictures: vqa, multiple choice with the picture, captions by
# CIDEr-D) on a model trained 200 steps (its captions share words with the references), on one and on two
# ranks: every task's score the same either way (a caption's n-gram weights are the whole suite's, whichever
# rank scores it).
steps=200 run 1 taught --data.batch=4
taught=$(ls -d "$work/taught/checkpoints/milestone/step-"*) || fail "taught: no checkpoint"
for np in 1 2; do
  "$mpiexec" --oversubscribe -np "$np" "$gate" evaluate --checkpoint "$taught" --dataset "$work/ds" --baseline none \
    --policy "$src/configs/gate.vlm.ini" --suites "$work/images/suites" --out "$work/gate$np" --no-promote \
    --threads 1 >"$work/gate$np.log" 2>&1
  [ -f "$work/gate$np/verdict.json" ] || fail "gate on $np ranks: $(grep -i error "$work/gate$np.log" | head -2)"
done
/usr/bin/python3 - "$work/gate1/verdict.json" "$work/gate2/verdict.json" <<'PY' || fail "the picture suites differ"
import json, sys
one, two = (json.load(open(p))["suites"] for p in sys.argv[1:3])
def metrics(suites):
    return {(s["name"], m): v for s in (suites if isinstance(suites, list) else suites.values())
            for m, v in s["metrics"].items()}
a, b = metrics(one), metrics(two)
assert set(n for n, _ in a) == {"shapes", "shapes-choice", "shapes-captions"}, a.keys()
for key, m in a.items():
    assert m["per_task"] == b[key]["per_task"], key
    lo, hi = (0, 10) if key[1] == "cider_d" else (0, 1)
    assert all(lo <= v <= hi for v in m["per_task"].values()) and m["lo"] <= m["value"] <= m["hi"], key
cider = a[("shapes-captions", "cider_d")]
assert cider["interval"] == "bootstrap" and len(set(cider["per_task"].values())) > 2, cider["per_task"]
print("gate:", ", ".join(f"{n} {k} {m['value']:.3f}" for (n, k), m in sorted(a.items())))
PY

# What the tower does not take yet: exit 64 naming the key, on every rank.
for bad in "--parallel.cp=2" "--parallel.tp=2 --parallel.sequence_parallel=true" "--parallel.tp=2 --vision.heads=1"; do
  rc=0
  # shellcheck disable=SC2086 # the options, one word each
  "$mpiexec" --oversubscribe -np 2 "$train" "$src/configs/vlm.ini" --run.dir="$work/bad" "${vlm[@]}" \
    --data.batch=4 $bad >"$work/bad.log" 2>&1 || rc=$?
  [ "$rc" -eq 64 ] || fail "$bad: exit $rc, not 64"
  grep -qE "(parallel.cp = 2|sequence_parallel = true): a vision-language model|must divide vision.heads = 1" \
    "$work/bad.log" || fail "$bad: $(head -n1 "$work/bad.log")"
done
echo "vision: dp2, pp2 and tp2 equal one process; frozen encoder (dp2, tp2) and frozen language model bit for bit (one, dp2, pp2) and holding no gradients; picture suites alike on 1 and 2 ranks; cp2, sequence parallelism and a width tp2 does not divide refused"
