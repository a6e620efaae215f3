#!/usr/bin/env bash
# Hugging Face tokenizer.json encode throughput on one core: the Unicode test corpus of the tokenizer tests
# (test/dataio/fixtures/hf_tokenizers/cases.json: emoji, CJK, Arabic, Devanagari, combining marks, digits,
# whitespace runs, contractions, special tokens), its lines repeated to MB megabytes, encoded by forge
# (bench_tokenizer: with the per-thread pre-token cache prepare uses, and without) and, in the same run, by
# the Python reference (test/dataio/reference/bpe_reference.py, with a dict cache per pre-token), for each
# fixture family. Prints MB/s per core and forge's ratio to the reference. The issue's goal: >= 10 MB/s per
# core with the cache.
#
# usage: bench/tokenizer.sh [BUILD_DIR] [MB]   (default build/release and 4; configured and bench_tokenizer
#                                              built if needed). JOBS=N sets the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
mb=${2:-4}
fixtures=$root/test/dataio/fixtures/hf_tokenizers

if [ ! -f "$build/CMakeCache.txt" ]; then
  log=$(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release 2>&1) || { echo "$log" >&2; exit 1; }
fi
log=$(cmake --build "$build" --target bench_tokenizer ${JOBS:+-j "$JOBS"} 2>&1) || { echo "$log" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$fixtures/cases.json" "$mb" "$work/corpus.txt" <<'PY'
import json, sys
cases = [c for c in json.load(open(sys.argv[1], encoding="utf-8")) if c]
unit = "\n".join(cases) + "\n"
n = max(1, int(float(sys.argv[2]) * 1e6) // len(unit.encode("utf-8")))
open(sys.argv[3], "w", encoding="utf-8").write(unit * n)
PY

machine
echo "corpus: $(wc -c < "$work/corpus.txt") bytes ($(wc -l < "$work/corpus.txt") lines), the test cases repeated"
printf '%-13s %14s %14s %10s %12s %10s\n' tokenizer "forge cached" "forge no-cache" decode "reference" ratio
for name in gpt2 llama3 qwen2 bytefallback; do
  forge=$("$build/bench/bench_tokenizer" "$fixtures/$name.json" "$work/corpus.txt" --json)
  ref=$(/usr/bin/python3 "$root/test/dataio/reference/bpe_reference.py" bench "$fixtures/$name.json" "$work/corpus.txt")
  /usr/bin/python3 - "$name" "$forge" "$ref" <<'PY'
import json, sys
f, r = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print("%-13s %9.1f MB/s %9.1f MB/s %5.0f MB/s %7.2f MB/s %9.0fx" % (
    sys.argv[1], f["encode_cached_mb_per_s"], f["encode_uncached_mb_per_s"], f["decode_mb_per_s"], r["mb_per_s"],
    f["encode_cached_mb_per_s"] / r["mb_per_s"]))
PY
done
echo "ratio: forge with its cache / the reference with its cache, both one core (CPU time)"
load_after
