#!/usr/bin/env bash
# Near dedup benchmark, in one invocation: on a planted corpus (unrelated pseudo-English documents, each
# followed by copies with a letter appended to a random fraction of the words), the removal rate per
# band of exact Jaccard similarity next to the analytic S-curve, recall at or above the threshold and the
# false-positive rate below it, for the automatic banding and the former fixed 14 x 8; then the MinHash
# signature throughput of both.
#
# usage: bench/near_dedup.sh [BUILD_DIR] [BASES] [COPIES] [WORDS]
#   (default build/, 2000 documents with 8 copies each, 400 words; needs the target bench_near_dedup)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build}
bin=$build/bench/bench_near_dedup
if [ ! -x "$bin" ]; then
  echo "near_dedup.sh: $bin not found; build it: cmake --build $build --target bench_near_dedup" >&2
  exit 64
fi
machine
"$bin" "${2:-2000}" "${3:-8}" "${4:-400}"
load_after
