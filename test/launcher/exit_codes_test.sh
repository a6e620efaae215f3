#!/usr/bin/env bash
# forge-train's exit codes (docs/ARCHITECTURE.md, "Exit codes"), each provoked on the real binary: bad spec 64,
# a device it cannot have 64, a checkpoint of another spec 64 (and --force-new, and a change of precision),
# corrupt shard 65, hang 69 (watchdog), persisting NaN 71 (and the skip and rewind policies recovering
# from a single one), unwritable checkpoint directory 74, SIGUSR1 75.
# Every failure prints one line "forge-train: error: ..." and writes summary.json with its exit class, and
# failures/local-0.json with its failure class (launcher/src/failure_record.h); an impossible memory plan
# is class oom_host; `forge-train failure` completes a record from srun's lines and the nodes lost.
# Usage: exit_codes_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR
set -uo pipefail
train=$1 forge_data=$2 src=$3
work=$(mktemp -d)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
base=(--run.threads=1 --run.peak_gflops=50 --model.layers=1 --model.d_model=32 --model.heads=2
  --model.seq_len=32)
tiny=("${base[@]}" --model.vocab=128)
# record_is DIR CLASS: the run's failure record (outside Slurm: job "local", restart 0) has that class.
record_is() {
  local got
  got=$(json "$1/failures/local-0.json" "d['class']" 2>/dev/null)
  [ "$got" = "$2" ] || fail "$1: failure record class '$got', want '$2'"
}

# expect NAME CODE PATTERN -- forge-train arguments...: exit code, and the last stderr line is the one
# error line and contains PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3 rc=0
  shift 4
  "$train" "$@" > "$work/$name.out" 2> "$work/$name.err" || rc=$?
  [ "$rc" -eq "$want" ] || { tail -n5 "$work/$name.err" >&2; fail "$name: exit $rc, want $want"; }
  last=$(tail -n1 "$work/$name.err")
  case "$last" in
    "forge-train: error: "*"$pattern"*) ;;
    *) fail "$name: last line '$last' lacks 'forge-train: error: ...$pattern'" ;;
  esac
}
summary_class() { json "$1/summary.json" "d['exit_class']"; }

# 64: a spec rule broken, before anything is written.
expect bad-spec 64 "optim.min_lr = 1: must be in [0, optim.lr]" -- \
  "$src/configs/tiny.ini" --run.dir="$work/bad" "${tiny[@]}" --run.steps=8 --optim.min_lr=1
[ ! -e "$work/bad" ] || fail "bad spec: the run directory was created"
expect bad-guard 64 "guard.nonfinite = rewind: rewind needs recovery checkpoints" -- \
  "$src/configs/tiny.ini" --run.dir="$work/bad" "${tiny[@]}" --run.steps=8 --guard.nonfinite=rewind
record_is "$work/bad" config

# 64: the device keys (docs/GPU.md). This machine trains on CPU: run.device = cuda names why it cannot
# (a build without CUDA, a plugin that does not load, or no GPU or driver), nccl needs a GPU; nothing is
# written. auto trains on CPU (what the dev cluster's fake GPUs get) and the summary says so (below).
expect cuda-absent 64 "run.device = cuda, but" -- \
  "$src/configs/tiny.ini" --run.dir="$work/cuda" "${tiny[@]}" --run.steps=2 --run.device=cuda
[ ! -e "$work/cuda" ] || fail "run.device = cuda: the run directory was created"
FORGE_CUDA_PLUGIN=$work/none.so expect cuda-plugin 64 "cannot load the CUDA plugin $work/none.so" -- \
  "$src/configs/tiny.ini" --run.dir="$work/cuda" "${tiny[@]}" --run.steps=2 --run.device=cuda
expect nccl-on-cpu 64 "parallel.comm = nccl, but run.device = auto chose cpu" -- \
  "$src/configs/tiny.ini" --run.dir="$work/nccl" "${tiny[@]}" --run.steps=2 --parallel.comm=nccl
[ ! -e "$work/nccl" ] || fail "parallel.comm = nccl: the run directory was created"

# 64: resuming a run directory whose checkpoints another spec wrote names the keys; keys that may change
# on resume (run.steps, ckpt.*, guard.*) do not count; --force-new moves the old run aside.
"$train" "$src/configs/tiny.ini" --run.dir="$work/spec" "${tiny[@]}" --ckpt.recovery_every=2 --run.steps=4 \
  2>/dev/null || fail "spec run failed"
expect spec-differs 64 "optim.lr: 0.003 -> 0.001" -- \
  "$src/configs/tiny.ini" --run.dir="$work/spec" "${tiny[@]}" --ckpt.recovery_every=2 --run.steps=6 --optim.lr=0.001
grep -q -- "--force-new" "$work/spec-differs.err" || fail "the refusal does not mention --force-new"
record_is "$work/spec" config
json "$work/spec/failures/local-0.json" "d['evidence'][0]" | grep -q "optim.lr: 0.003 -> 0.001" ||
  fail "the config record does not carry the error line as evidence"
grep -q "run.steps" "$work/spec-differs.err" && fail "run.steps reported as a difference"
"$train" "$src/configs/tiny.ini" --run.dir="$work/spec" "${tiny[@]}" --ckpt.recovery_every=3 --run.steps=6 \
  --guard.spike_z=9 2>"$work/spec-ok.err" || fail "resume with only resumable keys changed failed: $(tail -n1 "$work/spec-ok.err")"
grep -q "resumed from" "$work/spec-ok.err" || fail "the resumable change did not resume"
# Another precision resumes from the FP32 master weights with one warning line (its verification loss
# within BF16's tolerance); the summary names device and precision.
"$train" "$src/configs/tiny.ini" --run.dir="$work/spec" "${tiny[@]}" --ckpt.recovery_every=3 --run.steps=7 \
  --precision.dtype=bf16 2>"$work/bf16.err" || fail "resume in bf16 failed: $(tail -n1 "$work/bf16.err")"
[ "$(grep -c "was trained in fp32 on cpu; continuing in bf16 on cpu" "$work/bf16.err")" = 1 ] ||
  fail "resume in bf16: no single warning line ($(grep -i warn "$work/bf16.err" | head -2))"
grep -q "verification loss .* matches" "$work/bf16.err" || fail "resume in bf16 skipped the verification step"
[ "$(json "$work/spec/summary.json" "d['device'] + ' ' + d['dtype']")" = "cpu bf16" ] ||
  fail "summary.json lacks device and dtype of the run"
"$train" "$src/configs/tiny.ini" --run.dir="$work/spec" "${tiny[@]}" --run.steps=3 --optim.lr=0.001 --force-new \
  2>"$work/force.err" || fail "--force-new failed: $(tail -n1 "$work/force.err")"
grep -q "moved the previous run" "$work/force.err" || fail "--force-new did not say where the old run went"
ls "$work"/spec/superseded/*/checkpoints/milestone/step-00000006 > /dev/null || fail "old checkpoints not kept"
[ "$(json "$work/spec/summary.json" "d['steps']")" = 3 ] || fail "--force-new did not start afresh"

# 65: a corrupt shard of a prepared dataset.
mkdir -p "$work/corpus"
for d in $(seq 1 30); do
  awk -v d="$d" 'BEGIN { srand(d); n = split("the cat sat on a warm mat and then ran off to see what it could find in the big old house by the river", w, " ");
    for (i = 0; i < 400; i++) printf "%s%s", w[1 + int(rand() * n)], (i % 12 == 11) ? ".\n" : " " }' \
    > "$work/corpus/doc$d.txt"
done
"$forge_data" prepare --input "$work/corpus" --out "$work/ds" --vocab 300 --shard-tokens 4000 \
  > "$work/prepare.log" 2>&1 || { cat "$work/prepare.log" >&2; fail "forge-data prepare failed"; }
"$train" "$src/configs/tiny.ini" --run.dir="$work/data-ok" "${base[@]}" --model.vocab=300 --run.steps=2 --data.dataset="$work/ds" \
  2>"$work/data-ok.err" || fail "training on the prepared dataset failed: $(tail -n1 "$work/data-ok.err")"
shard=$(ls "$work"/ds/shards/*.h5 | head -n1)
size=$(stat -c %s "$shard")
printf 'CORRUPTCORRUPTCORRUPT' | dd of="$shard" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect corrupt-shard 65 "$(basename "$shard")" -- \
  "$src/configs/tiny.ini" --run.dir="$work/data" "${base[@]}" --model.vocab=300 --run.steps=8 --data.dataset="$work/ds"

# 69: a step that hangs; the watchdog names the operation and exits 69, summary says comm.
expect hang 69 "rank 0: no progress for" -- \
  "$src/configs/tiny.ini" --run.dir="$work/hang" "${tiny[@]}" --run.steps=8 --guard.inject_hang_step=3 --guard.watchdog_s=1
grep -q "in forward_backward — aborting (exit 69)" "$work/hang.err" || fail "hang line does not name the operation"
record_is "$work/hang" comm
[ "$(summary_class "$work/hang")" = comm ] || fail "hang: summary.json does not say comm"
[ "$(json "$work/hang/summary.json" "d['steps']")" = 2 ] || fail "hang: summary does not count the 2 steps done"

# 71: NaN for more consecutive steps than guard.max_bad_steps.
expect nan 71 "step 5: loss NaN, gradient norm NaN: 3 consecutive non-finite steps, more than guard.max_bad_steps = 2" -- \
  "$src/configs/tiny.ini" --run.dir="$work/nan" "${tiny[@]}" --run.steps=8 --guard.inject_nan_step=3 --guard.inject_nan_count=5 \
  --guard.max_bad_steps=2 --ckpt.recovery_every=1
[ "$(summary_class "$work/nan")" = numeric ] || fail "NaN: summary.json does not say numeric"
record_is "$work/nan" numeric
[ "$(json "$work/nan/failures/local-0.json" "d['step']")" = 4 ] || fail "NaN: the record's last finished step is not 4"
# Its segment keeps the step time up to the last committed checkpoint (step 2: the NaN steps 3-5 were
# skipped, not saved) and counts the rest as lost (the cost report's waste and ETTR).
json "$work/nan/summary.json" "(lambda g: 0 < g['kept_train_s'] < g['train_s'] and 0 < g['lost_s'] < g['end'] - g['start'])(d['segments'][-1])" |
  grep -qx True || fail "NaN: the segment's kept/lost time is wrong: $(json "$work/nan/summary.json" "d['segments']")"
# A single NaN under skip: the run finishes, the step is marked skipped and counted.
"$train" "$src/configs/tiny.ini" --run.dir="$work/skip" "${tiny[@]}" --run.steps=8 --guard.inject_nan_step=3 2>"$work/skip.err" \
  || fail "skip policy: a single NaN stopped the run: $(tail -n1 "$work/skip.err")"
[ "$(python3 -c "import json; r=[json.loads(l) for l in open('$work/skip/metrics/rank-0.jsonl')]; print(r[2].get('skipped'), r[2]['guard_events'][0]['action'], len(r))")" = "True skip 8" ] \
  || fail "skip policy: step 3 not recorded as skipped"
[ "$(json "$work/skip/summary.json" "d['guard']['skipped_steps']")" = 1 ] || fail "skip policy: not counted in summary"
# Rewind: back to the recovery checkpoint; the replay is exact, so the losses equal an uninterrupted run's.
"$train" "$src/configs/tiny.ini" --run.dir="$work/clean" "${tiny[@]}" --run.steps=8 --ckpt.recovery_every=2 2>/dev/null || fail "clean run failed"
"$train" "$src/configs/tiny.ini" --run.dir="$work/rewind" "${tiny[@]}" --run.steps=8 --ckpt.recovery_every=2 --guard.nonfinite=rewind \
  --guard.inject_nan_step=5 2>"$work/rewind.err" || fail "rewind policy failed: $(tail -n1 "$work/rewind.err")"
grep -q "rewound to .*step-00000004" "$work/rewind.err" || fail "rewind did not reload the step-4 checkpoint"
diff <(losses "$work/clean/metrics/rank-0.jsonl") <(losses "$work/rewind/metrics/rank-0.jsonl") \
  || fail "losses after a rewind differ from the uninterrupted run"
[ "$(json "$work/rewind/summary.json" "d['guard']['rewinds']")" = 1 ] || fail "rewind not counted in summary"
# Rewinding into the same NaN again and again is a persisting NaN.
expect nan-rewind 71 "guard.nonfinite = rewind" -- \
  "$src/configs/tiny.ini" --run.dir="$work/nan-rewind" "${tiny[@]}" --run.steps=8 --ckpt.recovery_every=2 --guard.nonfinite=rewind \
  --guard.inject_nan_step=5 --guard.inject_nan_count=10 --guard.max_bad_steps=2

# 74: the checkpoint directory cannot be created (a file in its place; chmod does not stop root).
mkdir -p "$work/io"
echo "not a directory" > "$work/io/checkpoints"
expect unwritable 74 "checkpoint" -- \
  "$src/configs/tiny.ini" --run.dir="$work/io" "${tiny[@]}" --run.steps=8 --ckpt.recovery_every=2
[ "$(summary_class "$work/io")" = io ] || fail "unwritable: summary.json does not say io"
record_is "$work/io" io

# An impossible memory plan: stopped before the first step, exit 64, class oom_host, saying what to change.
# Twice this host's available memory in activations (0.118 MiB per sequence of this model): in buffers
# that each fit, so the plan is what refuses it, not the first allocation.
rows=$(awk '/^MemAvailable:/ { printf "%d", $2 / 1024 * 2 / 0.118 }' /proc/meminfo)
expect memory-plan 64 "lower data.batch" -- \
  "$src/configs/tiny.ini" --run.dir="$work/oom" "${tiny[@]}" --run.steps=8 --data.batch="$rows"
record_is "$work/oom" oom_host
[ ! -e "$work/oom/metrics/rank-0.jsonl" ] || [ ! -s "$work/oom/metrics/rank-0.jsonl" ] || fail "memory plan: a step ran"

# forge-train failure: what the batch script adds (docs/ARCHITECTURE.md, "Failures").
decide() { SLURM_JOB_ID=${job:-77} SLURM_RESTART_COUNT=${restart:-0} FORGE_STEP_ATTEMPT=${attempt:-0} SLURM_JOB_NODELIST=node[1-2] "$train" failure "$@"; }
mkdir -p "$work/fr"
# Tasks 0-1 die after srun began ending the step: its doing, not suspects.
printf 'srun: error: node2: tasks 2-3: Killed\nsrun: Terminating StepId=77.0\nsrun: error: node1: tasks 0-1: Killed\n' >"$work/fr/killed.log"
# Communication failures in a row: the first runs again in the allocation, the second (the same nodes: after
# the deep check) is requeued, the third stops. The count runs across attempts and requeues.
out=$(decide "$work/fr" --exit 137 --srun-log "$work/fr/killed.log")
grep -qx "class=comm" <<<"$out" && grep -qx "restart=1" <<<"$out" && grep -qx "requeue=0" <<<"$out" &&
  grep -qx "drain=" <<<"$out" || fail "a killed task without a record is not a comm failure run again in place: $out"
json "$work/fr/failures/77-0.json" "[(s['rank'], s['host']) for s in d['suspects']]" | grep -qF "[(2, 'node2'), (3, 'node2')]" ||
  fail "the killed tasks are not the suspects: $(cat "$work/fr/failures/77-0.json")"
out=$(attempt=1 decide "$work/fr" --exit 137 --srun-log "$work/fr/killed.log")
grep -qx "deep_check=1" <<<"$out" && grep -qx "requeue=1" <<<"$out" && grep -qx "restart=0" <<<"$out" ||
  fail "two comm failures in a row on the same nodes: want a deep check and a requeue: $out"
[ "$(json "$work/fr/failures/77-0.1.json" "d['attempt']")" = 1 ] || fail "the second attempt's record is not its own"
out=$(restart=1 decide "$work/fr" --exit 137 --srun-log "$work/fr/killed.log" --max-comm-retries 2)
grep -qx "requeue=0" <<<"$out" && grep -qx "restart=0" <<<"$out" &&
  grep -q "^advice=communication failed 3 times in a row" <<<"$out" || fail "a third comm failure in a row runs again: $out"
out=$(job=81 decide "$work/fr" --exit 137 --srun-log "$work/fr/killed.log" --max-comm-retries 0)
grep -qx "requeue=0" <<<"$out" && grep -qx "restart=0" <<<"$out" || fail "--max-comm-retries 0 runs again: $out"
# A stop the ranks got and the job did not (a late kill of an earlier step): carry on in the allocation; a
# stop the job got too is a preemption, requeued.
out=$(job=82 decide "$work/fr" --exit 75 --job-signalled 0)
grep -qx "class=preempted" <<<"$out" && grep -qx "restart=1" <<<"$out" && grep -qx "requeue=0" <<<"$out" ||
  fail "a stop signal the job did not get is not carried on in place: $out"
grep -q "a late kill of an earlier step" "$work/fr/failures/82-0.json" || fail "the stray stop is not in the record"
out=$(job=83 decide "$work/fr" --exit 75 --job-signalled 1)
grep -qx "restart=0" <<<"$out" && grep -qx "requeue=1" <<<"$out" || fail "a preemption is not requeued: $out"
out=$(job=78 decide "$work/fr" --exit 69 --srun-log "$work/fr/killed.log" --lost-node node2)
grep -qx "class=node_lost" <<<"$out" && grep -qx "drain=node2" <<<"$out" && grep -qx "requeue=1" <<<"$out" ||
  fail "a node that does not answer is not node_lost, drained and requeued: $out"
printf 'slurmstepd: error: Detected 1 oom_kill event in StepId=79.0. Some of the step tasks have been OOM Killed.\n' >"$work/fr/oom.log"
out=$(job=79 decide "$work/fr" --exit 137 --srun-log "$work/fr/oom.log")
grep -qx "class=oom_host" <<<"$out" && grep -qx "requeue=0" <<<"$out" && grep -q "^advice=.*lower data.batch" <<<"$out" ||
  fail "an OOM kill is not oom_host without requeue and advice: $out"
# A record another job left under this job's name is not believed: the exit code decides.
sed 's/"job_id": "78"/"job_id": "12345"/' "$work/fr/failures/78-0.json" >"$work/fr/failures/80-0.json"
out=$(job=80 decide "$work/fr" --exit 65 2>"$work/fr/foreign.err")
grep -qx "class=data" <<<"$out" || fail "a foreign record was believed: $out"
grep -q "not of this job; ignored" "$work/fr/foreign.err" || fail "a foreign record was ignored silently"
out=$(decide "$work/fr" --exit 0)
grep -qx "class=ok" <<<"$out" || fail "exit 0 is not ok: $out"

# 75: SIGUSR1 mid-run saves a recovery checkpoint and exits 75.
"$train" "$src/configs/tiny.ini" --run.dir="$work/sig" "${tiny[@]}" --run.steps=100000 2>"$work/sig.err" &
pid=$!
wait_for_steps "$work/sig" 2 500 0.02
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 75 ] || fail "SIGUSR1: exit $rc, want 75"
tail -n1 "$work/sig.err" | grep -q "^forge-train: stopped: preempted (signal 10) after step .*recovery checkpoint saved" \
  || fail "SIGUSR1: last line '$(tail -n1 "$work/sig.err")'"
[ "$(summary_class "$work/sig")" = preempted ] || fail "SIGUSR1: summary.json does not say preempted"
record_is "$work/sig" preempted
ls "$work"/sig/checkpoints/recovery/step-* > /dev/null || fail "SIGUSR1: no recovery checkpoint"
echo "exit code test passed"
