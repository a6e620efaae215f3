#!/usr/bin/env bash
# `forge-data prepare` throughput on the demo corpus, per stage and end to end, on one core
# (prepare.threads=1; every stage but encoding is single-threaded anyway), against a raw read of the same
# input files (cat) measured in the same run, and the 10 MB/s/core goal. Each rate is given per wall second
# and per CPU second of the process: on a shared machine other processes inflate wall time, not CPU time,
# so MB per CPU-second is the per-core figure that survives load.
# Usage: bench/data_prepare.sh BUILD_DIR [CORPUS_DIR] [VOCAB]
# With TOKENIZER=MODEL in the environment that model is used instead of training one (training is excluded
# from the rates either way; this only saves its minutes).
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [CORPUS_DIR] [VOCAB]}
corpus=${2:-/tmp/forge-demo-corpus}
vocab=${3:-8192}
here=$(cd "$(dirname "$0")/.." && pwd)
forge_data=$build/dataio/forge-data
[ -x "$forge_data" ] || { echo "$0: build forge-data first ($forge_data)" >&2; exit 64; }
[ -d "$corpus/code" ] || "$here/scripts/make-demo-corpus.sh" "$corpus" > /dev/null
out=$(mktemp -d)/ds
trap 'rm -rf "$(dirname "$out")"' EXIT

bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
start=$(date +%s.%N)
find "$corpus" -type f -print0 | xargs -0 cat > /dev/null
raw_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')

/usr/bin/time -f '%M' -o "$out.rss" "$forge_data" prepare \
  --input "$corpus/code=code" --input "$corpus/legal=legal" --input "$corpus/docs=docs" \
  --eval-set /usr/share/common-licenses/GPL-3 --out "$out" --prepare.threads=1 \
  $([ -n "${TOKENIZER:-}" ] && echo "--tokenizer $TOKENIZER" || echo "--vocab $vocab") > /dev/null

python3 - "$out/quality.json" "$bytes" "$raw_s" "$(cat "$out.rss")" <<'PY'
import json, sys
q = json.load(open(sys.argv[1])); total_bytes = int(sys.argv[2]); raw_s = float(sys.argv[3]); rss_kb = int(sys.argv[4])
st, s = q["stages"], q["summary"]
raw = total_bytes / 1e6 / raw_s
print(f"input {total_bytes/1e6:.1f} MB, {s['documents_in']} documents -> {s['documents_out']} documents, {s['tokens_out']} tokens")
print(f"raw read of the input (cat, page cache): {raw:8.1f} MB/s")
print(f"{'stage':<14}{'MB in':>8}{'MB/s':>9}{'MB/CPU-s':>10}")
rows = [("ingest", st["ingest"]["bytes_in"], st["ingest"]["mb_per_s"], st["ingest"].get("mb_per_cpu_s", 0))]
for name in ["normalize", "exact_dedup", "near_dedup", "filters", "decontam"]:
    if name in st: rows.append((name, st[name]["bytes_in"], st[name]["mb_per_s"], st[name].get("mb_per_cpu_s", 0)))
tk = st["tokenizer"]
rows.append(("encode", tk["encode_bytes_in"], tk["encode_mb_per_s"], tk.get("encode_mb_per_cpu_s", 0)))
for name, b, r, c in rows: print(f"{name:<14}{b/1e6:8.1f}{r:9.1f}{c:10.1f}")
e2e, e2e_cpu = s["mb_per_s_excluding_tokenizer_training"], s.get("mb_per_cpu_s_excluding_tokenizer_training", 0)
print(f"tokenizer training (excluded): {tk['train_seconds']:.1f} s")
print(f"end to end excluding tokenizer training: {e2e:.1f} MB/s (wall) = {e2e/10:.2f} x the 10 MB/s/core goal, {e2e/raw:.3f} x raw read")
print(f"                                         {e2e_cpu:.1f} MB per CPU-second = {e2e_cpu/10:.2f} x the goal")
print(f"peak memory: {rss_kb/1024:.0f} MB (MinHash index: one signature + {st['near_dedup']['bands']} bucket entries per document)")
PY
