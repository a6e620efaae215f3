#!/usr/bin/env bash
# Bytes of token data each rank reads per step, at DP 1 and DP 4 on the same global batch: each rank
# reads only its data-parallel slice, so the bytes per rank fall by the DP size (before runtime v2 every
# rank read the whole global batch, i.e. the DP 1 figure on every rank).
#   bench/data_per_rank.sh [BUILD_DIR]     (default build/release; needs forge-train and forge-data)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build/release}")
for p in launcher/forge-train dataio/forge-data; do
  [ -x "$build/$p" ] || { echo "data_per_rank.sh: $build/$p missing" >&2; exit 64; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/scripts/make-demo-corpus.sh" "$work/corpus" 1 >/dev/null
"$build/dataio/forge-data" prepare --input "$work/corpus/code=code" --input "$work/corpus/docs=docs" \
  --vocab 1000 --out "$work/ds" >/dev/null
# Global batch 16 sequences of 256 tokens per step, 2 micro-batches: data.batch x dp = 8.
common=("$root/configs/tiny.ini" --model.vocab=1000 --model.seq_len=256 --data.dataset="$work/ds"
  --parallel.microbatches=2 --run.steps=4 --run.threads=1 --run.peak_gflops=100)
mpirun --oversubscribe -np 1 "$build/launcher/forge-train" "${common[@]}" --run.dir="$work/dp1" \
  --data.batch=8 --parallel.dp=1 2>/dev/null
mpirun --oversubscribe -np 4 "$build/launcher/forge-train" "${common[@]}" --run.dir="$work/dp4" \
  --data.batch=2 --parallel.dp=4 --parallel.zero=1 2>/dev/null
python3 - "$work" <<'PY'
import glob, json, sys
work = sys.argv[1]
def per_rank(run):
    out = {}
    for f in sorted(glob.glob(f"{work}/{run}/metrics/rank-*.jsonl")):
        recs = [json.loads(l) for l in open(f)]
        out[f.split("rank-")[1].split(".")[0]] = sum(r["data_bytes"] for r in recs) / len(recs)
    return out
dp1, dp4 = per_rank("dp1"), per_rank("dp4")
print("token bytes read per step, per rank (global batch 16 x 257 tokens, uint16):")
print(f"  dp 1: rank 0 {dp1['0']:.0f}")
print("  dp 4: " + ", ".join(f"rank {r} {b:.0f}" for r, b in dp4.items()))
print(f"  ratio dp1 / dp4 rank: {dp1['0'] / max(dp4.values()):.2f} (the DP size: 4)")
PY
