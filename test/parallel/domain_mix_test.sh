#!/usr/bin/env bash
# data.domain_weights through forge-train on 2 MPI ranks (dp2) over a prepared two-domain dataset: over one
# epoch the samples trained per domain (summary.json data_domains, the per-step metrics) are the weights'
# largest-remainder shares, computed here from the manifest alone; the checkpoint's data cursor records the
# weights; a resume with the same weights continues and one with other weights exits 64 naming the key;
# malformed weights and a domain the dataset lacks exit 64 naming data.domain_weights.
# Usage: domain_mix_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 data=$2 src=$3 mpiexec=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
mpi() { "$mpiexec" --oversubscribe -np 2 "$train" "$src/configs/tiny.ini" --parallel.dp=2 "$@"; }

python3 - "$work" <<'PY' || fail "corpus"
import os, random, sys
random.seed(3)
words = {"code": "def return if else for while import class self print len range append dict".split(),
         "prose": "the cat sat on a warm mat and then ran off to see what it could find in the old house".split()}
for domain, n in (("code", 30), ("prose", 45)):
    os.makedirs(f"{sys.argv[1]}/{domain}")
    for d in range(n):
        with open(f"{sys.argv[1]}/{domain}/doc{d}.txt", "w") as f:
            for s in range(40):
                f.write(" ".join(random.choice(words[domain]) for _ in range(random.randint(4, 9))) + ".\n")
PY
"$data" prepare --input "$work/code=code" --input "$work/prose=prose" --out "$work/ds" --vocab 300 \
  --shard-tokens 4000 >/dev/null 2>"$work/prepare.log" || fail "prepare: $(tail -n1 "$work/prepare.log")"

seq_len=64 batch=4 gb=8  # 2 data-parallel ranks of 4 sequences
# The epoch (windows of seq_len + 1 tokens per domain stream) and each domain's largest-remainder share of it.
read -r steps want < <(python3 - "$work/ds/manifest.json" "$seq_len" "$gb" <<'PY'
import json, math, sys
m, T, gb = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
tokens = {d: sum(s["tokens"] for s in m["shards"] if s["split"] == "train" and s["domain"] == d) for d in m["domains"]}
epoch = sum((t - 1) // T for t in tokens.values() if t > T)
weights = {"code": 0.2, "prose": 0.8}
exact = {d: w / sum(weights.values()) * epoch for d, w in weights.items()}
share = {d: math.floor(x) for d, x in exact.items()}
for d in sorted(exact, key=lambda d: exact[d] - share[d], reverse=True)[: epoch - sum(share.values())]:
    share[d] += 1
print(math.ceil(epoch / gb), json.dumps(share, separators=(",", ":")))
PY
)
[ -n "${steps:-}" ] || fail "could not compute the epoch"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2 --model.vocab=300
  --model.seq_len="$seq_len" --data.batch="$batch" --data.dataset="$work/ds" --ckpt.recovery_every=0)

mpi --run.dir="$work/mix" "${model[@]}" --run.steps="$steps" --data.domain_weights=code:0.2,prose:0.8 \
  2>"$work/mix.log" || fail "weighted run failed: $(tail -n3 "$work/mix.log")"
python3 - "$work/mix" "$want" "$steps" "$gb" <<'PY' || fail "the realised domain mix does not follow the weights"
import glob, json, sys
run, want, steps, gb = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
got = json.load(open(f"{run}/summary.json"))["data_domains"]
assert sum(got.values()) == steps * gb, got
# One epoch, plus what the last step read of the next (fewer than a step's samples).
for d, n in want.items():
    assert 0 <= got[d] - n <= gb, (d, got[d], n)
print(f"domain samples over one epoch: {got}, largest-remainder shares {want}")
for rank in (0, 1):  # every rank reports the step's samples over the data-parallel group
    per_step = {}
    for rec in map(json.loads, open(f"{run}/metrics/rank-{rank}.jsonl")):
        for d, n in rec["data_domains"].items():
            per_step[d] = per_step.get(d, 0) + n
    assert per_step == got, (rank, per_step, got)
man = json.load(open(sorted(glob.glob(f"{run}/checkpoints/milestone/step-*/manifest.json"))[-1]))
cursor = man["data_cursor"]["reader"]
assert cursor["domain_weights"] == {"code": 0.2, "prose": 0.8}, cursor
assert cursor["samples"] == steps * gb, cursor
PY

# Resume: the same weights continue; other weights are refused before any work, naming the key.
mpi --run.dir="$work/mix" "${model[@]}" --run.steps=$((steps + 2)) --data.domain_weights=code:0.2,prose:0.8 \
  2>"$work/resume.log" || fail "resume with the same weights failed: $(tail -n3 "$work/resume.log")"
grep -q "verification loss .* matches" "$work/resume.log" || fail "the resume skipped the verification step"
mpi --run.dir="$work/mix" "${model[@]}" --run.steps=$((steps + 4)) --data.domain_weights=code:0.5,prose:0.5 \
  2>"$work/other.log"
rc=$?
[ $rc -eq 64 ] || fail "resume with other weights: exit $rc, want 64: $(tail -n3 "$work/other.log")"
grep -q "error: .*data.domain_weights: code:0.2,prose:0.8 -> code:0.5,prose:0.5" "$work/other.log" ||
  fail "the refusal does not name data.domain_weights: $(grep error "$work/other.log" | head -n1)"

# Bad values: one error line naming the key, exit 64, on one process.
for bad in "code:-1" "code:abc" "code" "code:inf" "code:nan" "code:0,prose:0" "code:1,code:2" "poetry:1"; do
  "$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${model[@]}" --run.steps=1 \
    --data.domain_weights="$bad" 2>"$work/bad.log"
  rc=$?
  [ $rc -eq 64 ] || fail "data.domain_weights = $bad: exit $rc, want 64"
  [ "$(grep -c 'error: .*data.domain_weights' "$work/bad.log")" -eq 1 ] ||
    fail "data.domain_weights = $bad: no one error line naming the key: $(tail -n2 "$work/bad.log")"
done
grep -q "domain 'poetry' is not in dataset .* (its domains: code, prose)" "$work/bad.log" ||
  fail "an unknown domain is not named with the dataset's domains: $(tail -n1 "$work/bad.log")"
[ ! -e "$work/bad/checkpoints" ] || fail "a refused spec left checkpoints"
echo "PASS: domain weights followed over an epoch on 2 ranks, recorded in the checkpoint, resume refused with other weights, bad values rejected"
