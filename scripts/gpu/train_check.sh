#!/usr/bin/env bash
# forge-train itself on a GPU (docs/GPU.md, "The check", items a-g): what users submit, not a side program.
#   train_check.sh FORGE_TRAIN WORK_DIR [MPIEXEC]
# (a) configs/bench-cpu.ini, one rank on the GPU against forge-train on the CPU, 20 steps: per-step loss within
#     1e-3 (FP32) and 2e-2 (BF16 against the CPU's FP32);
# (b) tp2, tp2 with sequence parallelism (the norms' partial gradients), pp2, dp2 with ZeRO-1 and cp2 (ring
#     attention: the chunk kernels, their merge and the exchanges), each as 2 ranks sharing the GPU over
#     host-staged MPI (parallel.comm = mpi): losses equal to one GPU rank's within the BF16 tolerance; dp2
#     with ZeRO-3 equal to dp2 with ZeRO-1 within 1e-4; pp2 (2 micro-batches) interleaved and ZB-H1 equal to
#     1F1B within 1e-6 (the same sums in the same order);
# (c) NCCL on one rank, and dp2 over NCCL where the machine has two GPUs or more;
# (d) saved on the GPU at step 10, resumed for 2 steps on the CPU and for 2 on the GPU: the uninterrupted
#     run's losses within tolerance;
# (e) SIGUSR1 during a GPU run: a checkpoint, then exit 75;
# (f) the GPT-2-124M-class config (configs/gpt2-124m.ini) through forge-train: tokens/s, MFU;
# (g) the peer, karpathy/llm.c's CUDA trainer on the same model and batch (../shared/anchors/llmc/run.sh),
#     and the ratio of tokens/s.
# One line per item, "train_check: <item> PASS|FAIL|SKIP ...", and a table last; exit 1 when an item failed.
# FORGE_TRAIN_CHECK_DEVICE=cpu runs every "GPU" run on the CPU instead: the script's own check on a machine
# without a GPU (test/launcher/gpu_train_check_test.sh). FORGE_TRAIN_CHECK_ARGS adds forge-train arguments to
# every run of (a)-(e) (a smaller model there); FORGE_TRAIN_CHECK_SKIP lists items to skip ("f g").
set -uo pipefail

train=$1 work=$2 mpiexec=${3:-$(command -v mpirun || true)}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
device=${FORGE_TRAIN_CHECK_DEVICE:-cuda}
read -r -a extra <<<"${FORGE_TRAIN_CHECK_ARGS:-}"
skip=" ${FORGE_TRAIN_CHECK_SKIP:-} "
mkdir -p "$work"
failed=0
table=()

say() { echo "train_check: $*"; }
result() { # ITEM PASS|FAIL|SKIP TEXT
  say "$1 $2 $3"
  [ "$2" = FAIL ] && failed=1
  return 0
}
skipped() { [[ $skip == *" $1 "* ]]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# run NAME [forge-train arguments...]: the bench config in WORK/NAME (kept when $resume is set), $steps
# steps (20), a recovery checkpoint every $recovery steps (0: none), on $np MPI ranks when set.
run() {
  local name=$1 launch=()
  shift
  [ -n "${np:-}" ] && launch=("$mpiexec" -np "$np")
  [ -n "${resume:-}" ] || rm -rf "${work:?}/$name" "$work/$name.log"
  "${launch[@]}" "$train" "$root/configs/bench-cpu.ini" --run.dir="$work/$name" --run.steps="${steps:-20}" \
    --run.peak_gflops=1000 --ckpt.recovery_every="${recovery:-0}" --ckpt.milestone_every=0 "${extra[@]}" "$@" \
    >>"$work/$name.log" 2>&1
}
# compare A B TOL [FIRST]: per-step losses of two run directories (rank 0's metrics) from step FIRST on;
# prints the largest difference, fails beyond TOL or when a run lacks steps.
compare() {
  python3 - "$work/$1/metrics/rank-0.jsonl" "$work/$2/metrics/rank-0.jsonl" "$3" "${4:-1}" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r: out[r["step"]] = r["loss"]
    return out
a, b, tol, first = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
steps = [s for s in sorted(a) if s >= first]
if not steps or any(s not in b for s in steps):
    sys.exit(f"steps differ: {sorted(a)} vs {sorted(b)}")
worst = max(abs(a[s] - b[s]) for s in steps)
print(f"max |loss diff| {worst:.2e} over steps {steps[0]}-{steps[-1]} (tol {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}
ok_or_fail() { # ITEM NAME...: the runs' exit status was 0, else FAIL naming the log's last error line
  local item=$1
  shift
  for n in "$@"; do
    if [ ! -s "$work/$n/summary.json" ] || ! grep -q '"exit_code": *0' "$work/$n/summary.json"; then
      result "$item" FAIL "$n: $(grep -m1 'error' "$work/$n.log" || tail -n1 "$work/$n.log")"
      return 1
    fi
  done
}
check() { # ITEM A B TOL [FIRST]
  local text
  if text=$(compare "$2" "$3" "$4" "${5:-1}" 2>&1); then
    result "$1" PASS "$2 vs $3: $text"
  else
    result "$1" FAIL "$2 vs $3: $text"
  fi
}

# --- (a) one rank, GPU against CPU
if ! skipped a; then
  run cpu --run.device=cpu --precision.dtype=fp32
  run gpu32 --run.device="$device" --precision.dtype=fp32
  run gpu16 --run.device="$device" --precision.dtype=bf16
  ok_or_fail a cpu gpu32 gpu16 && {
    check a.fp32 gpu32 cpu 1e-3
    check a.bf16 gpu16 cpu 2e-2
    grep -q "\"device\": *\"$device\"" "$work/gpu16/summary.json" || result a.device FAIL "summary.json of gpu16 names no $device"
  }
fi

# --- (b) 2 ranks sharing the GPU over host-staged MPI, against one GPU rank
if ! skipped b && [ -n "$mpiexec" ]; then
  [ -s "$work/gpu16/summary.json" ] || run gpu16 --run.device="$device" --precision.dtype=bf16
  for layout in "tp2 --parallel.tp=2 --data.batch=8" "sp2 --parallel.tp=2 --parallel.sequence_parallel=true --data.batch=8" \
    "pp2 --parallel.pp=2 --data.batch=8" \
    "dp2 --parallel.dp=2 --parallel.zero=1 --data.batch=4" "cp2 --parallel.cp=2 --data.batch=8"; do
    read -r name args <<<"$layout"
    # shellcheck disable=SC2086
    np=2 run "mpi-$name" --run.device="$device" --precision.dtype=bf16 --parallel.comm=mpi $args
    ok_or_fail "b.$name" "mpi-$name" && check "b.$name" "mpi-$name" gpu16 2e-2
  done
  # ZeRO-3 (weights gathered per layer, gradients reduce-scattered, both released between uses: the
  # device's granules unmapped and mapped again) against ZeRO-1 on the same 2 ranks.
  np=2 run mpi-z3 --run.device="$device" --precision.dtype=bf16 --parallel.comm=mpi --parallel.dp=2 \
    --parallel.zero=3 --data.batch=4
  ok_or_fail b.z3 mpi-z3 && check b.z3 mpi-z3 mpi-dp2 1e-4
  # The pipeline schedules: interleaved (three model chunks of one block a stage: the last stage's output
  # goes round to the first) and ZB-H1 (weight gradients queued by the products and formed in their own
  # passes) against 1F1B on the same 2 micro-batches.
  for sched in 1f1b "interleaved --parallel.pp_virtual=3" zb-h1; do
    # shellcheck disable=SC2086
    np=2 run "mpi-pp2-${sched%% *}" --run.device="$device" --precision.dtype=bf16 --parallel.comm=mpi \
      --parallel.pp=2 --parallel.microbatches=2 --data.batch=4 --parallel.pp_schedule=$sched
  done
  for sched in interleaved zb-h1; do
    ok_or_fail "b.pp2-$sched" mpi-pp2-1f1b "mpi-pp2-$sched" && check "b.pp2-$sched" "mpi-pp2-$sched" mpi-pp2-1f1b 1e-6
  done
elif ! skipped b; then
  result b SKIP "no mpirun"
fi

# --- (c) NCCL: one rank; dp2 where two GPUs exist
if ! skipped c && [ "$device" = cuda ]; then
  run nccl1 --run.device=cuda --precision.dtype=bf16 --parallel.comm=nccl
  ok_or_fail c.one nccl1 && check c.one nccl1 gpu16 1e-6
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  if [ "$gpus" -ge 2 ] && [ -n "$mpiexec" ]; then
    np=2 run nccl-dp2 --run.device=cuda --precision.dtype=bf16 --parallel.comm=nccl --parallel.dp=2 \
      --parallel.zero=1 --data.batch=4
    ok_or_fail c.dp2 nccl-dp2 && check c.dp2 nccl-dp2 gpu16 2e-2
  else
    result c.dp2 SKIP "$gpus GPU(s): dp2 over NCCL needs two"
  fi
elif ! skipped c; then
  result c SKIP "run.device = $device: NCCL needs a GPU"
fi

# --- (d) saved on the GPU at step 10 of 12, resumed from there on the CPU and on the GPU for 2 steps
if ! skipped d; then
  steps=12 recovery=10 run whole --run.device="$device" --precision.dtype=fp32
  if ok_or_fail d whole; then
    for to in cpu gpu; do
      rm -rf "${work:?}/from-$to" && cp -a "$work/whole" "$work/from-$to"
      rm -rf "$work/from-$to"/checkpoints/milestone # the final save: resume from step 10's
      on=$device
      [ $to = cpu ] && on=cpu
      steps=12 recovery=10 resume=1 run "from-$to" --run.device="$on" --precision.dtype=fp32
    done
    if grep -q "resumed from .*step-00000010 (step 10); verification loss .* matches" "$work/from-cpu.log" &&
      grep -q "resumed from .*step-00000010 (step 10); verification loss .* matches" "$work/from-gpu.log"; then
      check d.cpu from-cpu whole 1e-3 11
      check d.gpu from-gpu whole 1e-4 11
    else
      result d FAIL "a resume from step 10 did not verify: $(grep -h -m1 -E 'error|resumed' "$work"/from-*.log)"
    fi
  fi
fi

# --- (e) SIGUSR1 during a GPU run: checkpoint, exit 75
if ! skipped e; then
  rm -rf "${work:?}/usr1"
  "$train" "$root/configs/bench-cpu.ini" --run.dir="$work/usr1" --run.steps=100000 --run.device="$device" \
    --run.peak_gflops=1000 --ckpt.recovery_every=0 --ckpt.milestone_every=0 "${extra[@]}" >"$work/usr1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ -s "$work/usr1/metrics/rank-0.jsonl" ] && break
    sleep 0.1
  done
  kill -USR1 "$pid"
  wait "$pid"
  rc=$?
  if [ "$rc" -eq 75 ] && ls "$work"/usr1/checkpoints/recovery/step-* >/dev/null 2>&1; then
    result e PASS "exit 75, $(find "$work/usr1/checkpoints/recovery" -maxdepth 1 -name 'step-*' -printf '%f ')saved"
  else
    result e FAIL "exit $rc ($(grep -m1 error "$work/usr1.log"))"
  fi
fi

# --- (f) GPT-2-124M class through forge-train, and (g) llm.c on the same model and batch
forge_tps=""
if ! skipped f; then
  rm -rf "${work:?}/gpt2"
  "$train" "$root/configs/gpt2-124m.ini" --run.dir="$work/gpt2" --run.device="$device" --run.steps=30 \
    --optim.warmup_steps=10 --ckpt.recovery_every=0 --ckpt.milestone_every=0 >"$work/gpt2.log" 2>&1
  if ok_or_fail f gpt2; then
    read -r forge_tps mfu wall <<<"$(python3 -c "
import json, statistics
rs = [json.loads(l) for l in open('$work/gpt2/metrics/rank-0.jsonl')]
rs = [r for r in rs if 'tokens_per_s' in r][3:]  # warm-up steps out
print(statistics.median(r['tokens_per_s'] for r in rs), statistics.median(r['mfu'] for r in rs),
      statistics.median(r['step_ms'] for r in rs))")"
    result f PASS "gpt2-124m bf16: $forge_tps tokens/s, MFU $mfu, step $wall ms (median after 3 warm-up steps)"
    table+=("forge-train gpt2-124m bf16 tokens/s $forge_tps MFU $mfu")
  fi
fi
if ! skipped g && [ -f "$root/../shared/anchors/llmc/run.sh" ] && [ "$device" = cuda ]; then
  line=$(bash "$root/../shared/anchors/llmc/run.sh" 2>"$work/llmc.log" | tail -1)
  llmc_tps=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
  if [ -n "$llmc_tps" ]; then
    result g PASS "$line"
    table+=("llm.c gpt2-124m bf16 tokens/s $llmc_tps")
    [ -n "$forge_tps" ] && table+=("forge/llm.c tokens/s $(python3 -c "print(f'{$forge_tps / $llmc_tps:.3f}')")")
  else
    result g FAIL "llm.c did not report: $(tail -n 3 "$work/llmc.log" | tr '\n' ' ')"
  fi
elif ! skipped g; then
  result g SKIP "no llm.c anchor or no GPU"
fi

for row in "${table[@]}"; do say "table: $row"; done
exit "$failed"
