#!/usr/bin/env bash
# The node-local shard cache against the shared copy, printed as ratios, in one run (bench_cache; see its
# header), with the machine it ran on. Root drops the page cache between passes so "cold" reads the disk.
#   bench/cache.sh [BUILD_DIR] [MTOKENS]     (default build/release, 128 million tokens = 256 MiB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build/release}")
[ -x "$build/bench/bench_cache" ] || { echo "cache.sh: $build/bench/bench_cache missing (build target bench_cache)" >&2; exit 64; }
echo "$(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(df -h "${TMPDIR:-/tmp}" | awk 'NR==2 {print $1}') under ${TMPDIR:-/tmp}"
"$build/bench/bench_cache" "${TMPDIR:-/tmp}/forge-bench-cache" "${2:-128}"
