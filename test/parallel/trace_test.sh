#!/usr/bin/env bash
# forge-train's per-rank traces on real MPI ranks, checked by check_trace.py (balanced events, every
# block's forward and backward, collectives with group and bytes, compute spans = the metrics' compute
# time within 5% on all ranks but at most one, the merged timeline): dp2 x pp2 with ZeRO-1 under ZB-H1 (its
# weight-gradient passes traced as compute) and tp2 x pp2 under 1F1B
# (waits nested in compute), --trace on a resumed run, forge-train trace-merge, a range outside the run
# (exit 64 naming the key) and an unwritable trace directory (one warning, training completes).
# Usage: trace_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
mpi() { local np=$1; shift; "$mpiexec" --oversubscribe -np "$np" "$train" "$src/configs/tiny.ini" "$@"; }
# Four ranks share two cores and a step is a few milliseconds: one rank's median step may hold a preemption
# that its spans and its metrics see differently, as in the demo's check (one outlier rank allowed).
check() { python3 "$src/test/launcher/check_trace.py" "$@" --outliers 1; }
common=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=128 --model.heads=4
  --model.vocab=512 --model.seq_len=64 --data.batch=2 --ckpt.milestone_every=0)

mpi 4 --run.dir="$work/a" "${common[@]}" --run.steps=6 --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 \
  --parallel.microbatches=2 --parallel.pp_schedule=zb-h1 --run.trace_steps=3-5 2>"$work/a.log" \
  || fail "dp2 x pp2 run failed: $(tail -n3 "$work/a.log")"
grep -q "trace of steps 3-5: .*merged.json (4 ranks" "$work/a.log" || fail "rank 0 did not say where the trace is"
check "$work/a/trace/steps-3-5" "$work/a" 3 5 || exit 1
grep -q '"name":"weight gradients 1"' "$work/a/trace/steps-3-5/rank-00000.json" || fail "no weight-gradient pass traced"

mpi 4 --run.dir="$work/b" "${common[@]}" --run.steps=4 --parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2 \
  --ckpt.recovery_every=2 --run.trace_steps=2-4 2>"$work/b.log" || fail "tp2 x pp2 run failed: $(tail -n3 "$work/b.log")"
check "$work/b/trace/steps-2-4" "$work/b" 2 4 || exit 1
grep -q '"name":"all_reduce tp"' "$work/b/trace/steps-2-4/rank-00000.json" || fail "no tensor-parallel sum traced"

# --trace on the resumed run (from step 4): the 3 steps after its first, 6-8; merged again by the CLI.
mpi 4 --run.dir="$work/b" "${common[@]}" --run.steps=9 --parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2 \
  --ckpt.recovery_every=2 --trace 2>"$work/b2.log" || fail "resumed --trace run failed: $(tail -n3 "$work/b2.log")"
check "$work/b/trace/steps-6-8" "$work/b" 6 8 || exit 1
rm "$work/b/trace/steps-6-8/merged.json"
"$train" trace-merge "$work/b/trace/steps-6-8" >"$work/merge.out" || fail "trace-merge failed"
grep -q "4 ranks on one timeline" "$work/merge.out" || fail "trace-merge said: $(cat "$work/merge.out")"
check "$work/b/trace/steps-6-8" "$work/b" 6 8 >/dev/null || exit 1
echo "ok: dp2 x pp2, tp2 x pp2 and a resumed --trace run, merged by forge-train and by trace-merge"

# A range outside the run: exit 64, one line naming the key, nothing trained.
"$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${common[@]}" --run.steps=6 --run.trace_steps=5-9 \
  >/dev/null 2>"$work/c.log"
[ $? -eq 64 ] || fail "run.trace_steps 5-9 of 6 steps: want exit 64"
grep -q "run.trace_steps" "$work/c.log" || fail "the error does not name run.trace_steps: $(cat "$work/c.log")"
[ ! -e "$work/c/metrics/rank-0.jsonl" ] || fail "a rejected spec trained"
"$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${common[@]}" --run.steps=6 --run.trace_steps=x-2 \
  >/dev/null 2>&1
[ $? -eq 64 ] || fail "run.trace_steps x-2: want exit 64"
mkdir -p "$work/empty"
"$train" trace-merge "$work/empty" >/dev/null 2>"$work/m.log"
[ $? -eq 65 ] && grep -q "no rank-.*json traces in" "$work/m.log" || fail "trace-merge of a directory without traces"
echo "ok: a range outside the run exits 64 naming run.trace_steps"

# An unwritable trace directory: one warning, every step trained.
mkdir -p "$work/d" && echo "not a directory" >"$work/d/trace"
"$train" "$src/configs/tiny.ini" --run.dir="$work/d" "${common[@]}" --run.steps=4 --trace 2>"$work/d.log" ||
  fail "a run with an unwritable trace directory failed: $(tail -n2 "$work/d.log")"
[ "$(grep -c "trace not written" "$work/d.log")" -eq 1 ] || fail "want one warning: $(grep -i trace "$work/d.log")"
[ "$(wc -l <"$work/d/metrics/rank-0.jsonl")" -eq 4 ] || fail "the run with an unwritable trace directory did not train 4 steps"
echo "PASS: traces"
