#!/usr/bin/env bash
# scripts/gpu/train_check.sh (the forge-train half of the GPU check) run here with every "GPU" run on the CPU
# (FORGE_TRAIN_CHECK_DEVICE=cpu) and a small model: the script itself must work before a GPU session spends
# its minutes on it. Items a (GPU against CPU), b (2 ranks over MPI against one), d (save, resume on both
# devices) and e (SIGUSR1, exit 75) must pass; c (NCCL) and g (llm.c) say SKIP; f (GPT-2-124M) is skipped.
# Usage: gpu_train_check_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

FORGE_TRAIN_CHECK_DEVICE=cpu FORGE_TRAIN_CHECK_SKIP="f" \
  FORGE_TRAIN_CHECK_ARGS="--run.threads=1 --model.layers=6 --model.d_model=64 --model.heads=4 --model.vocab=256 --model.seq_len=32" \
  bash "$src/scripts/gpu/train_check.sh" "$train" "$work/check" "$mpiexec" >"$work/out.txt" 2>&1
rc=$?
cat "$work/out.txt"
[ "$rc" -eq 0 ] || fail "train_check.sh exit $rc"
for item in a.fp32 a.bf16 b.tp2 b.sp2 b.pp2 b.dp2 b.cp2 b.z3 b.pp2-interleaved b.pp2-zb-h1 d.cpu d.gpu e; do
  grep -q "^train_check: $item PASS" "$work/out.txt" || fail "item $item did not pass"
done
grep -q "^train_check: c SKIP" "$work/out.txt" || fail "NCCL on cpu was not skipped"
grep -q "^train_check: g SKIP" "$work/out.txt" || fail "llm.c without a GPU was not skipped"
grep -q "FAIL" "$work/out.txt" && fail "a line says FAIL"
echo "PASS"
