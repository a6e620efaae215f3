#!/usr/bin/env bash
# What tracing costs (forge-train --trace, run.trace_steps; common/include/forge/common/trace.h): the
# benchmark's training step (bench/trainer_cpu.sh's config, 2 threads) untraced and traced in alternating
# rounds in one process, and the off path (trace points per step x the cost of one that is off).
#
# usage: bench/trace_overhead.sh [BUILD_DIR] [ROUNDS]    (default build/release, 5 rounds)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
rounds=${2:-5}
bin=$build/bench/bench_trainer_cpu
if [ ! -x "$bin" ]; then
  echo "trace_overhead.sh: $bin not found; build it: cmake --build $build --target bench_trainer_cpu" >&2
  exit 64
fi
machine
"$bin" --threads 2 --steps 3 --no-profile --trace-rounds "$rounds" \
  --layers 6 --dmodel 384 --heads 6 --vocab 8192 --seq 256 --batch 8
load_after
