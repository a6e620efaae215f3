#!/usr/bin/env bash
# Hybrid-parallel benchmark on the trainer benchmark config (configs/bench-cpu.ini), on this machine's
# cores: DP=2 with one thread per rank against one rank with two threads (same global batch), the PP=2
# bubble against (p-1)/(m+p-1), and each layout's communication bytes against the analytic volume.
#   bench/parallel.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
bin=$build/bench/bench_parallel
[[ -x $bin ]] || { echo "bench/parallel.sh: $bin missing (cmake --build $build --target bench_parallel)" >&2; exit 64; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1
spec=$root/configs/bench-cpu.ini
steps=${STEPS:-8}
run() {  # NP THREADS overrides...
  local np=$1 threads=$2
  shift 2
  OMP_NUM_THREADS=$threads mpirun --oversubscribe --bind-to none -np "$np" "$bin" "$spec" --run.steps="$steps" \
    --run.threads="$threads" "$@"
}
echo "# one rank, 2 threads (global batch 8 = 2 micro-batches of 4)"
base=$(run 1 2 --data.batch=4 --parallel.microbatches=2)
echo "$base"
echo "# DP=2, 1 thread per rank, ZeRO-1 and plain all-reduce (same global batch)"
dp1=$(run 2 1 --data.batch=4 --parallel.microbatches=1 --parallel.dp=2 --parallel.zero=1)
echo "$dp1"
dp0=$(run 2 1 --data.batch=4 --parallel.microbatches=1 --parallel.dp=2 --parallel.zero=0)
echo "$dp0"
echo "# PP=2, 1 thread per stage: bubble for m = 2, 4, 8 micro-batches (global batch 8)"
for m in 2 4 8; do run 2 1 --data.batch=$((8 / m)) --parallel.microbatches=$m --parallel.pp=2; done
echo "# TP=2, 1 thread per rank"
run 2 1 --data.batch=4 --parallel.microbatches=2 --parallel.tp=2
echo "# tp2,pp2,dp2 on 8 ranks (oversubscribed 4x: bytes, not speed)"
run 8 1 --data.batch=2 --parallel.microbatches=2 --parallel.tp=2 --parallel.pp=2 --parallel.dp=2 --parallel.zero=1
python3 - "$base" "$dp1" "$dp0" <<'PY'
import json, sys
base, dp1, dp0 = (json.loads(a) for a in sys.argv[1:])
for name, r in (("ZeRO-1", dp1), ("all-reduce", dp0)):
    print(f"DP=2 x 1 thread ({name}) / 1 rank x 2 threads: tokens/s ratio {r['tokens_per_s'] / base['tokens_per_s']:.3f}")
PY
