#!/usr/bin/env bash
# The node-local shard cache through forge-train on 2 MPI ranks of one node: the first run stages every
# shard once between its ranks (misses) and reads the other rank's (hits), the second run reads them all
# from the cache, both with exactly the losses of a run without a cache; a cache directory that cannot be
# created costs a warning and the run reads the shared copy; forge-data cache status, evict and stage.
# Usage: cache_train_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 data=$2 src=$3 mpiexec=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
mpi() { "$mpiexec" --oversubscribe -np 2 "$train" "$src/configs/tiny.ini" --parallel.dp=2 "$@"; }

python3 - "$work" <<'PY' || fail "corpus"
import os, random, sys
random.seed(5)
words = "the cat sat on a warm mat and then ran off to see what it could find in the big old house".split()
os.makedirs(f"{sys.argv[1]}/text")
for d in range(40):
    with open(f"{sys.argv[1]}/text/doc{d}.txt", "w") as f:
        for s in range(40):
            f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 9))) + ".\n")
PY
"$data" prepare --input "$work/text" --out "$work/ds" --vocab 300 --shard-tokens 4000 >/dev/null 2>"$work/prepare.log" ||
  fail "prepare: $(tail -n1 "$work/prepare.log")"
shards=$(python3 -c 'import json,sys; print(sum(s["split"] == "train" for s in json.load(open(sys.argv[1]))["shards"]))' \
  "$work/ds/manifest.json")
[ "$shards" -ge 4 ] || fail "the dataset has only $shards training shards"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2 --model.vocab=300
  --model.seq_len=64 --data.batch=4 --data.dataset="$work/ds" --run.steps=10)
losses() { grep -o '"loss":[^,]*' "$1/metrics/rank-0.jsonl"; }
# cache_stats RUN HITS MISSES FALLBACKS: summary.json's data_cache, summed over the ranks.
cache_stats() {
  python3 - "$1/summary.json" "$2" "$3" "$4" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["data_cache"]
want = {"hits": int(sys.argv[2]), "misses": int(sys.argv[3]), "fallbacks": int(sys.argv[4])}
got = {k: c[k] for k in want}
assert got == want, (got, want)
assert (c["bytes_staged"] > 0) == (want["misses"] > 0), c
PY
}

mpi --run.dir="$work/plain" "${model[@]}" 2>"$work/plain.log" || fail "run without cache: $(tail -n3 "$work/plain.log")"
mpi --run.dir="$work/first" "${model[@]}" --data.cache_dir="$work/cache" 2>"$work/first.log" ||
  fail "first cached run: $(tail -n3 "$work/first.log")"
cache_stats "$work/first" "$shards" "$shards" 0 || fail "first run: each shard staged once by one rank, read by the other"
grep -q "data cache $work/cache: $shards shards read from the cache, $shards staged" "$work/first.log" ||
  fail "rank 0 did not report the cache"
mpi --run.dir="$work/second" "${model[@]}" --data.cache_dir="$work/cache" 2>"$work/second.log" ||
  fail "second cached run: $(tail -n3 "$work/second.log")"
cache_stats "$work/second" $((2 * shards)) 0 0 || fail "second run: every shard should come from the cache"
for run in first second; do
  cmp -s <(losses "$work/plain") <(losses "$work/$run") || fail "the $run cached run's losses differ from the run without cache"
done
python3 -c 'import json,sys; r = json.loads(open(sys.argv[1]).readline()); assert r["data_cache"]["hits"] >= 0, r' \
  "$work/second/metrics/rank-1.jsonl" || fail "rank 1's first metrics record has no data_cache"

# A cache directory that cannot be created: a warning, the shared copy, the same losses.
mpi --run.dir="$work/unwritable" "${model[@]}" --data.cache_dir=/proc/forge-no-cache 2>"$work/unwritable.log" ||
  fail "a run with an unusable cache failed: $(tail -n3 "$work/unwritable.log")"
grep -q "warn.*data cache /proc/forge-no-cache: cannot create" "$work/unwritable.log" ||
  fail "no warning for the unusable cache: $(grep -m1 warn "$work/unwritable.log")"
cache_stats "$work/unwritable" 0 0 $((2 * shards)) || fail "an unusable cache: every shard from the shared copy"
cmp -s <(losses "$work/plain") <(losses "$work/unwritable") || fail "losses differ with an unusable cache"

# The admin's commands: status lists the entries (none in use now), evict empties the cache, stage fills it.
"$data" cache status --cache-dir "$work/cache" >"$work/status.txt" || fail "cache status"
grep -q "$shards entries, .* bytes, 0 in use; 0 temporary files" "$work/status.txt" || fail "status: $(tail -n1 "$work/status.txt")"
"$data" cache evict --cache-dir "$work/cache" | grep -q "evicted $shards entries" || fail "evict"
"$data" cache status --cache-dir "$work/cache" | grep -q ": 0 entries" || fail "evict left entries"
"$data" cache stage "$work/ds" --cache-dir "$work/cache" --split train | grep -q "$shards staged" || fail "stage"
"$data" cache stage "$work/ds" --cache-dir "$work/cache" --split train | grep -q "0 staged .* $shards already there" ||
  fail "a second stage copied again"
"$data" cache stage "$work/ds" --cache-dir "$work/cache" --max-bytes 1000 >/dev/null 2>"$work/full.log"
rc=$?
[ $rc -eq 74 ] || fail "stage into a cache too small: exit $rc, want 74"
echo "PASS: shards staged once per node, reused by the next run, identical losses; unusable cache falls back; cache status/evict/stage"
