#!/usr/bin/env bash
# The code sandbox's start from a process holding 0, 1 and 2 GiB (bench_sandbox): a sandboxed python3 against
# the same program started bare from the same process, per run.
# usage: bench/sandbox.sh [BUILD_DIR] [RUNS]   (default build/release, 20; bench_sandbox is built if needed).
#   JOBS=N sets the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
run_bench sandbox.sh "$build" bench_sandbox "${2:-20}"
