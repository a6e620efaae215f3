#!/usr/bin/env bash
# forge-train preemption and resume: SIGUSR1 mid-run saves a recovery checkpoint and exits 75; the
# restarted run resumes from it (verification step included) and its per-step losses equal those of an
# uninterrupted run exactly. Also on a prepared dataset (the reader's cursor), a corrupt newest checkpoint
# falls back to the previous one, and a process lost between a checkpoint's commit and its step's metrics
# record leaves the resumed run the record to restore.
# Usage: resume_test.sh FORGE_TRAIN SOURCE_DIR
set -uo pipefail
train=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
common=(--run.threads=1 --run.peak_gflops=100 --ckpt.recovery_every=5 --model.layers=1
  --model.d_model=64 --model.heads=2 --model.seq_len=64)

"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${common[@]}" --run.steps=40 2>/dev/null || fail "uninterrupted run failed"

# Interrupt run b once a few steps are done.
"$train" "$src/configs/tiny.ini" --run.dir="$work/b" "${common[@]}" --run.steps=40 2>"$work/b.log" &
pid=$!
wait_for_steps "$work/b" 7 400 0.02
kill -USR1 "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 75 ] || fail "SIGUSR1: exit $rc, want 75 ($(tail -n1 "$work/b.log"))"
grep -q "recovery checkpoint saved" "$work/b.log" || fail "no one-line message on preemption"
[ "$(python3 -c "import json; print(json.load(open('$work/b/summary.json'))['exit_class'])")" = preempted ] \
  || fail "summary.json does not say preempted"
stopped=$(wc -l < "$work/b/metrics/rank-0.jsonl")
[ "$stopped" -lt 40 ] || fail "run finished before the signal arrived"

"$train" "$src/configs/tiny.ini" --run.dir="$work/b" "${common[@]}" --run.steps=40 2>"$work/b2.log" || fail "resumed run failed"
grep -q "verification loss .* matches" "$work/b2.log" || fail "resume did not run the verification step"
! grep -q '"restored"' "$work/b/metrics/rank-0.jsonl" || fail "a record was restored where the step's own was kept"
diff <(losses "$work/a/metrics/rank-0.jsonl") <(losses "$work/b/metrics/rank-0.jsonl") \
  || fail "resumed loss trajectory differs from the uninterrupted run"
# summary.json keeps both processes as segments: the preempted one lost nothing after its checkpoint at
# the signal (kept = its step time), the resumed one finished (the cost report's waste and ETTR).
python3 - "$work/b/summary.json" <<'PY' || fail "summary.json segments are wrong: $(cat "$work/b/summary.json")"
import json, sys
segments = json.load(open(sys.argv[1]))["segments"]
assert [g["exit_class"] for g in segments] == ["preempted", "ok"], segments
first, second = segments
assert first["resumed_from"] == 0 and second["resumed_from"] > 0, segments
assert first["kept_train_s"] == first["train_s"] > 0 and first["lost_s"] < first["end"] - first["start"], first
assert second["lost_s"] == 0 and second["kept_train_s"] == second["train_s"], second
assert first["end"] <= second["start"] and second["startup_s"] > 0, segments
PY

# A damaged newest checkpoint: resume falls back to the one before it and still ends on the same losses.
# Run b is complete now; damage its newest recovery checkpoint, drop the final milestone, and run again.
newest=$(ls -d "$work"/b/checkpoints/recovery/step-* | sort | tail -n1)
for f in "$newest"/rank-*.bin; do printf 'XXXXXXXX' | dd of="$f" bs=1 seek=64 conv=notrunc 2>/dev/null; done
rm -rf "$work/b/checkpoints/milestone"
"$train" "$src/configs/tiny.ini" --run.dir="$work/b" "${common[@]}" --run.steps=40 2>"$work/b3.log" || fail "resume past a damaged checkpoint failed"
grep -qi "damaged\|fall" "$work/b3.log" || fail "no log line about the damaged checkpoint"
diff <(losses "$work/a/metrics/rank-0.jsonl") <(losses "$work/b/metrics/rank-0.jsonl") \
  || fail "losses after falling back differ from the uninterrupted run"

# A process lost after its checkpoint of step S committed and before it wrote step S's record (the record
# waits for the ranks' status exchange, the commit does not): the newest checkpoint, and records up to S-1.
cp -r "$work/a" "$work/c"
rm -rf "$work/c/checkpoints/milestone" "$(ls -d "$work"/c/checkpoints/recovery/step-* | sort | tail -n1)"
saved=$(basename "$(ls -d "$work"/c/checkpoints/recovery/step-* | sort | tail -n1)")
saved=$((10#${saved#step-}))
python3 - "$work/c/metrics/rank-0.jsonl" "$saved" <<'PY'
import json, sys
kept = [l for l in open(sys.argv[1]) if json.loads(l)["step"] < int(sys.argv[2])]
open(sys.argv[1], "w").writelines(kept)
PY
"$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${common[@]}" --run.steps=40 2>"$work/c.log" || fail "resume without the checkpoint's record failed"
diff <(losses "$work/a/metrics/rank-0.jsonl") <(losses "$work/c/metrics/rank-0.jsonl") \
  || fail "the restored record or the steps after it differ from the uninterrupted run"
python3 - "$work/c/metrics/rank-0.jsonl" "$saved" <<'PY' || fail "step $saved's record was not restored (marked) from its checkpoint"
import json, sys
restored = [r for r in map(json.loads, open(sys.argv[1])) if r.get("restored")]
assert [r["step"] for r in restored] == [int(sys.argv[2])], restored
assert "step_ms" not in restored[0], restored  # the outcome only: no timing the checkpoint never saw
PY
# TensorBoard gets it too: the resumed process's own event file holds the restored step's loss.
python3 "$src/test/launcher/read_tfevents.py" "$(ls -t "$work"/c/tb/events.out.tfevents.* | head -n1)" >"$work/c.events"
python3 - "$work/c.events" "$work/c/metrics/rank-0.jsonl" "$saved" <<'PY' || fail "TensorBoard lacks the restored step $saved"
import json, struct, sys
saved = int(sys.argv[3])
loss = next(r["loss"] for r in map(json.loads, open(sys.argv[2])) if r["step"] == saved)
logged = {e["step"]: e["scalars"]["train/loss"] for e in map(json.loads, open(sys.argv[1]))
          if "train/loss" in e.get("scalars", {})}
assert logged.get(saved) == struct.unpack("<f", struct.pack("<f", loss))[0], (saved, loss, logged)
PY
echo "resume test passed"
