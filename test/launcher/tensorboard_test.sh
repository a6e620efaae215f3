#!/usr/bin/env bash
# forge-train's TensorBoard events (<run>/tb/), read back by an independent decoder (read_tfevents.py,
# written from the TFRecord and protobuf specs): every tag at every step, the loss equal to the metrics
# file's, per-rank timings under rank/, a resume marked so TensorBoard shows one curve, and an unwritable
# tb/ costing one warning while training completes.
# Usage: tensorboard_test.sh FORGE_TRAIN SOURCE_DIR
set -uo pipefail
train=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
read_events() { python3 "$src/test/launcher/read_tfevents.py" "$@"; }
common=(--run.threads=1 --run.peak_gflops=50 --model.layers=1 --model.d_model=32 --model.heads=2
  --model.seq_len=32 --model.vocab=128 --ckpt.recovery_every=3)

"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${common[@]}" --run.steps=6 2>"$work/a.log" ||
  fail "run failed: $(tail -n2 "$work/a.log")"
files=("$work"/a/tb/events.out.tfevents.*)
[ ${#files[@]} -eq 1 ] && [ -s "${files[0]}" ] || fail "want one event file in $work/a/tb, found: ${files[*]}"
read_events "${files[0]}" >"$work/a.events" || fail "the event file does not decode"
read_events "$work"/a/tb/rank-00000/events.out.tfevents.* >"$work/a.rank" || fail "the rank's event file does not decode"
python3 - "$work/a.events" "$work/a.rank" "$work/a/metrics/rank-0.jsonl" <<'PY' || fail "events are wrong"
import json, struct, sys
events = [json.loads(l) for l in open(sys.argv[1])]
assert events[0].get("file_version") == "brain.Event:2", events[0]
want_tags = ["train/loss", "train/grad_norm", "train/lr", "train/tokens", "throughput/tokens_per_s",
             "throughput/mfu", "time/step_ms", "time/compute_ms", "time/comm_ms", "time/bubble_ms",
             "time/data_wait_ms", "time/ckpt_stall_ms", "memory/peak_rss_mib", "memory/state_mib"]
seen = {}
for e in events:
    for tag, v in e.get("scalars", {}).items():
        seen.setdefault(tag, {})[e["step"]] = v
for tag in want_tags:
    assert sorted(seen.get(tag, {})) == [1, 2, 3, 4, 5, 6], (tag, sorted(seen.get(tag, {})))
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
for r in map(json.loads, open(sys.argv[3])):
    assert seen["train/loss"][r["step"]] == f32(r["loss"]), (r["step"], seen["train/loss"][r["step"]], r["loss"])
    assert seen["train/lr"][r["step"]] == f32(r["lr"])
texts = [e for e in events if "texts" in e]
assert any("events/ckpt_events" in e["texts"] for e in texts), "no checkpoint event as text"
rank = {}
for e in map(json.loads, open(sys.argv[2])):
    for tag, v in e.get("scalars", {}).items():
        rank.setdefault(tag, []).append(e["step"])
assert sorted(rank) == ["rank/comm_ms", "rank/compute_ms", "rank/data_wait_ms", "rank/state_mib", "rank/step_ms"], sorted(rank)
assert rank["rank/step_ms"] == [1, 2, 3, 4, 5, 6]
PY
echo "ok: every tag at every step, losses equal to the metrics file's, per-rank timings"

# Resumed: a second event file, opened by a SessionLog START at the checkpoint's step.
"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${common[@]}" --run.steps=9 2>"$work/b.log" ||
  fail "resumed run failed: $(tail -n2 "$work/b.log")"
newest=$(ls -t "$work"/a/tb/events.out.tfevents.* | head -n1)
[ "$newest" != "${files[0]}" ] || fail "the resumed run wrote no event file of its own"
read_events "$newest" | python3 -c '
import json, sys
events = [json.loads(l) for l in sys.stdin]
assert events[1].get("session_log") == "START" and events[1]["step"] == 6, events[1]
steps = sorted({e["step"] for e in events if "train/loss" in e.get("scalars", {})})
assert steps == [7, 8, 9], steps' || fail "the resume is not marked or its steps are wrong"
echo "ok: a resume starts a new event file with SessionLog START at the checkpoint"

# Unwritable tb/: one warning, the run completes.
mkdir -p "$work/c" && echo "not a directory" >"$work/c/tb"
"$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${common[@]}" --run.steps=3 2>"$work/c.log" ||
  fail "a run with an unwritable tb/ failed: $(tail -n2 "$work/c.log")"
[ "$(grep -c "TensorBoard" "$work/c.log")" -eq 1 ] || fail "want one TensorBoard warning: $(grep TensorBoard "$work/c.log")"
[ "$(wc -l <"$work/c/metrics/rank-0.jsonl")" -eq 3 ] || fail "the run with an unwritable tb/ did not train 3 steps"
echo "PASS: TensorBoard events"
