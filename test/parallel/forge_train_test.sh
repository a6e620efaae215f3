#!/usr/bin/env bash
# forge-train on real MPI ranks: the tp2,pp2,dp2 run reproduces the single-process losses; a run saved on
# one layout resumes on another and continues the same loss curve; bad layouts exit 64 on every rank; a
# hung rank makes every rank exit 69 within the watchdog timeout; a sample trained by two data-parallel
# replicas stops the run (65).
# Usage: forge_train_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
mpi() { local np=$1; shift; "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" "$@"; }
common=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=64
  --model.heads=4 --model.vocab=256 --model.seq_len=32 --ckpt.recovery_every=0 --ckpt.milestone_every=0)

# The reference: one process (MPI singleton), 4 sequences per step.
"$train" "$src/configs/tiny.ini" --run.dir="$work/ref" "${common[@]}" --run.steps=8 --data.batch=4 2>"$work/ref.log" \
  || fail "single-process run failed: $(tail -n1 "$work/ref.log")"

# tp2,pp2,dp2 with ZeRO-1 on 8 ranks: the same 4 sequences per step (2 per data-parallel rank).
mpi 8 --run.dir="$work/l8" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.tp=2 --parallel.pp=2 --parallel.dp=2 \
  --parallel.zero=1 --parallel.microbatches=1 2>"$work/l8.log" || fail "tp2,pp2,dp2 run failed: $(tail -n3 "$work/l8.log")"
compare "$work/ref" "$work/l8"
grep -q "stage 1: blocks 1-1" "$work/l8.log" || fail "rank 0 printed no plan"
for k in 0 1 2 3 4 5 6 7; do [ -s "$work/l8/metrics/rank-$k.jsonl" ] || fail "no metrics/rank-$k.jsonl"; done
python3 -c "
import json, sys
r = json.loads(open('$work/l8/metrics/rank-0.jsonl').readline())
missing = [k for k in ('comm_ms', 'bubble_ms', 'data_wait_ms', 'tokens_per_s', 'mfu', 'comm_bytes') if k not in r]
# pp2 with one micro-batch: 1F1B's bubble (pp - 1) / (m + pp - 1) = 1/2, next to the measured fraction.
if abs(r.get('bubble_analytic', 0) - 0.5) > 1e-12 or not 0 <= r.get('bubble_fraction', -1) <= 1:
    missing.append(f\"bubble_analytic 0.5 and bubble_fraction ({r.get('bubble_analytic')}, {r.get('bubble_fraction')})\")
sys.exit('metrics lack ' + ', '.join(missing) if missing else 0)" || fail "metrics record incomplete"

# Saved on tp1,pp2,dp2 after 4 steps, resumed on tp2,pp1,dp2 (4 ranks each) to step 8.
mpi 4 --run.dir="$work/x" "${common[@]}" --run.steps=4 --data.batch=2 --parallel.pp=2 --parallel.dp=2 \
  --parallel.zero=1 2>"$work/x1.log" || fail "first half failed: $(tail -n3 "$work/x1.log")"
mpi 4 --run.dir="$work/x" "${common[@]}" --run.steps=8 --data.batch=2 --parallel.tp=2 --parallel.dp=2 --parallel.zero=1 \
  2>"$work/x2.log" || fail "resume on another layout failed: $(tail -n3 "$work/x2.log")"
grep -q "verification loss .* matches" "$work/x2.log" || fail "cross-layout resume skipped the verification step"
compare "$work/ref" "$work/x" 5

# A grouped-query Llama-family model (2 key/value heads) saved on tp4 -- each head held by two ranks --
# resumed on tp2,pp2, against one process: the shared heads' parameters and moments are written once and
# read back by whichever ranks hold them.
llama=(--model.family=llama --model.kv_heads=2 --model.ffn_hidden=128)
"$train" "$src/configs/tiny.ini" --run.dir="$work/lref" "${common[@]}" "${llama[@]}" --run.steps=8 --data.batch=4 \
  2>"$work/lref.log" || fail "single-process llama run failed: $(tail -n1 "$work/lref.log")"
mpi 4 --run.dir="$work/lx" "${common[@]}" "${llama[@]}" --run.steps=4 --data.batch=4 --parallel.tp=4 \
  2>"$work/lx1.log" || fail "llama tp4 failed: $(tail -n3 "$work/lx1.log")"
mpi 4 --run.dir="$work/lx" "${common[@]}" "${llama[@]}" --run.steps=8 --data.batch=4 --parallel.tp=2 --parallel.pp=2 \
  2>"$work/lx2.log" || fail "llama resume on tp2,pp2 failed: $(tail -n3 "$work/lx2.log")"
grep -q "verification loss .* matches" "$work/lx2.log" || fail "llama resume skipped the verification step"
compare "$work/lref" "$work/lx" 5

# Bad layouts: exit 64 with one line naming the rule (mpirun returns the ranks' code).
mpi 3 --run.dir="$work/bad1" "${common[@]}" --parallel.tp=2 >/dev/null 2>"$work/bad1.log"
[ $? -eq 64 ] || fail "3 ranks for tp2: want exit 64"
grep -q "needs 2 ranks but 3 were started" "$work/bad1.log" || fail "world-size message: $(grep error "$work/bad1.log" | head -1)"
mpi 2 --run.dir="$work/bad2" "${common[@]}" --parallel.tp=8 >/dev/null 2>"$work/bad2.log"
[ $? -eq 64 ] || fail "heads not divisible by tp: want exit 64"
grep -q "parallel.tp.*must divide model.heads" "$work/bad2.log" || fail "heads message: $(grep error "$work/bad2.log" | head -1)"
FORGE_LAYOUT=tp2,pp1,dp1 "$train" "$src/configs/tiny.ini" --run.dir="$work/bad3" "${common[@]}" >/dev/null 2>"$work/bad3.log"
[ $? -eq 64 ] || fail "FORGE_LAYOUT mismatch: want exit 64"
grep -q "train-layout=tp2,pp1,dp1" "$work/bad3.log" || fail "FORGE_LAYOUT message: $(tail -n1 "$work/bad3.log")"

# A rank that hangs (injected on rank 1 at step 3): every rank exits 69 within the watchdog timeout.
start=$(date +%s)
mpi 2 --run.dir="$work/hang" "${common[@]}" --data.batch=2 --parallel.dp=2 --guard.watchdog_s=3 \
  --guard.inject_hang_step=3 --guard.inject_hang_rank=1 >/dev/null 2>"$work/hang.log"
rc=$?
[ $rc -eq 69 ] || fail "hung rank: exit $rc, want 69 ($(grep error "$work/hang.log" | head -2))"
[ $(( $(date +%s) - start )) -lt 60 ] || fail "the hang took over a minute to detect"
grep -q "rank 0: no progress for" "$work/hang.log" || fail "rank 0 did not name the hang: $(grep error "$work/hang.log" | head -2)"
# Rank 0 waited for rank 1 in a collective; rank 1, stuck in its own work, names itself: the record says comm
# and names rank 1 and its host.
python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
assert d['class'] == 'comm' and [s['rank'] for s in d['suspects']] == [1] and d['suspects'][0]['host'], d" \
  "$work/hang/failures/local-0.json" || fail "the hang's failure record does not name rank 1"

# The duplicate-sample guard, with the ids the ranks exchange after every step: at tp2,dp2 steps 1-2 pass
# (each replica trained its own samples), and in step 3, where every replica claims sample 0 of epoch 0, the
# run stops with exit 65 naming the step, the data-parallel ranks and the sample.
mpi 4 --run.dir="$work/dup" "${common[@]}" --data.batch=2 --parallel.tp=2 --parallel.dp=2 \
  --guard.inject_duplicate_step=3 >/dev/null 2>"$work/dup.log"
rc=$?
[ $rc -eq 65 ] || fail "duplicate sample: exit $rc, want 65 ($(grep error "$work/dup.log" | head -2))"
grep -q "step 3: data-parallel ranks 0 and 1 both trained sample 0 of epoch 0" "$work/dup.log" ||
  fail "duplicate sample message: $(grep error "$work/dup.log" | head -1)"
[ "$(wc -l <"$work/dup/metrics/rank-0.jsonl")" -eq 2 ] || fail "the duplicate-sample guard did not pass steps 1-2"

# parallel.elastic: a dp4 run that loses a rank resumes on 3 ranks as dp2 (the largest dp that divides its
# 4 micro-batches per step) with 2 micro-batches each; the third rank idles. The verification step passes
# and the loss curve is the uninterrupted dp4 run's.
elastic=("${common[@]/--ckpt.recovery_every=0/--ckpt.recovery_every=4}" --data.batch=1 --parallel.dp=4)
mpi 4 --run.dir="$work/e-ref" "${elastic[@]}" --run.steps=8 2>"$work/e-ref.log" || fail "dp4 reference failed: $(tail -n2 "$work/e-ref.log")"
mpi 4 --run.dir="$work/e" "${elastic[@]}" --run.steps=4 --parallel.elastic=true 2>"$work/e1.log" ||
  fail "elastic dp4 failed: $(tail -n2 "$work/e1.log")"
FORGE_LOG_ALL_RANKS=1 mpi 3 --run.dir="$work/e" "${elastic[@]}" --run.steps=8 --parallel.elastic=true 2>"$work/e2.log" ||
  fail "elastic resume on 3 ranks failed: $(tail -n2 "$work/e2.log")"
grep -q "resumed on tp1,pp1,dp2" "$work/e2.log" || fail "the elastic resume did not run dp2: $(grep -m1 plan: "$work/e2.log")"
grep -q "micro-batches 2 of 1 sequences" "$work/e2.log" || fail "the elastic resume did not double the micro-batches"
grep -q "verification loss .* matches" "$work/e2.log" || fail "the elastic resume skipped the verification step"
grep -q "rank 2 idle" "$work/e2.log" || fail "rank 2 did not idle"
compare "$work/e-ref" "$work/e" 5
mpi 1 --run.dir="$work/e3" "${elastic[@]}" --parallel.tp=2 --parallel.elastic=true >/dev/null 2>"$work/e3.log"
[ $? -eq 64 ] || fail "elastic with fewer ranks than one replica: want exit 64"
grep -q "parallel.elastic: 1 ranks cannot hold one model replica" "$work/e3.log" || fail "elastic message: $(grep error "$work/e3.log")"
echo "PASS"
