#!/usr/bin/env bash
# PII and safety stages of `forge-data prepare` on one core (bench_pii): ~100 MB of generated prose and code
# with sparse planted PII, in memory, scanned by PII alone, safety alone and both, against the issue's goal
# of 100 MB/s per core for both; the peer in the same run is a loop of std::regex searches over the same
# PII patterns on a 1 MB slice (why the stages use a multi-pattern engine, Hyperscan).
#
# usage: bench/pii.sh [BUILD_DIR] [MB]   (default build/release and 100; configured and bench_pii built if
#                                         needed). JOBS=N sets the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
mb=${2:-100}

# Build what is missing or stale (ninja makes this a no-op when it is up to date).
if [ ! -f "$build/CMakeCache.txt" ]; then
  log=$(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release 2>&1) || { echo "$log" >&2; exit 1; }
fi
log=$(cmake --build "$build" --target bench_pii ${JOBS:+-j "$JOBS"} 2>&1) || { echo "$log" >&2; exit 1; }

"$build/bench/bench_pii" "$mb"
