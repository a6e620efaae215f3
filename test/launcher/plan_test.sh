#!/usr/bin/env bash
# forge-train --plan against runs: for configs/tiny.ini and the tiny Llama and Mixtral of configs/families/, at
# layout 1, at tp2 x pp2 (2 micro-batches in flight on the first stage), at dp2 with ZeRO-1 (Mixtral: ep2) and
# (Llama) at cp2 with the ring and with all-to-all attention and at tp2 with sequence parallelism,
# one of them in BF16, the plan's per-rank figures match what each rank of a real run reports (its plan
# table: describe_plan, the trainer's own accounting): parameters exactly, weights + gradients, AdamW's
# moments, activations and their total within 10%; the resident set of a process grows with data.batch as
# the plan says (within 10%). A bad layout exits 64 with the run's own message, and the
# Llama-3.1-8B and Qwen3-30B-A3B shapes plan in a few MiB.
# Usage: plan_test.sh FORGE_TRAIN SOURCE_DIR MPIEXEC
set -uo pipefail
train=$1 src=$2 mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/test/parallel/common.sh"
common=(--run.device=cpu --run.threads=1 --run.peak_gflops=100 --run.steps=1 --ckpt.recovery_every=0
  --ckpt.milestone_every=0)

# check NAME CONFIG RANKS OVERRIDES...: the plan of CONFIG with OVERRIDES against a run of it on RANKS ranks.
check() {
  local name=$1 config=$2 ranks=$3
  shift 3
  "$train" "$src/$config" "${common[@]}" "$@" --plan --json >"$work/$name.plan.json" 2>"$work/$name.plan.err" ||
    fail "$name: --plan failed: $(tail -n1 "$work/$name.plan.err")"
  if [ "$ranks" -eq 1 ]; then
    "$train" "$src/$config" --run.dir="$work/$name" "${common[@]}" "$@" 2>"$work/$name.log"
  else
    "$mpiexec" --oversubscribe -np "$ranks" "$train" "$src/$config" --run.dir="$work/$name" "${common[@]}" "$@" \
      2>"$work/$name.log"
  fi
  [ $? -eq 0 ] || fail "$name: the run failed: $(tail -n3 "$work/$name.log")"
  python3 - "$name" "$work/$name.plan.json" "$work/$name.log" "$ranks" <<'PY' || fail "$name: the plan is not the run's"
import json, re, sys
name, plan_path, log_path, ranks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = json.loads(open(plan_path).read().strip().splitlines()[-1])
mib = 1024.0 * 1024.0
# The run's plan table (ParallelTrainer::describe_plan): rank node tp dp pp blocks params w+g opt act (MiB).
lines = open(log_path).read().splitlines()
head = next(i for i, l in enumerate(lines) if l.strip().startswith("rank node"))
rows = []
for line in lines[head + 1:head + 1 + ranks]:
    f = line.split()
    rows.append(dict(rank=int(f[0]), pp=int(f[4]), blocks=f[5], params=int(f[6]), wg=float(f[7]), opt=float(f[8]),
                     act=float(f[9])))
assert len(rows) == ranks, f"{len(rows)} rows in the run's plan table, want {ranks}"
assert plan["ranks"] == ranks, (plan["ranks"], ranks)
problems = []
def near(what, planned, measured, rank):
    # Within 10%, or the table's rounding (0.05 MiB) for a figure that small.
    ok = abs(planned - measured) <= max(0.10 * measured, 0.05)
    print(f"  {name} rank {rank} {what:12s} plan {planned:9.2f} MiB  run {measured:9.2f} MiB  "
          f"{100.0 * (planned - measured) / measured if measured else 0.0:+5.1f}%  {'ok' if ok else 'FAIL'}")
    if not ok: problems.append(f"rank {rank} {what}")
for r in rows:
    st = plan["stages"][r["pp"]]
    b = st["bytes"]
    first, last = st["blocks"]
    if r["blocks"] != f"{first}-{last}": problems.append(f"rank {r['rank']} blocks {r['blocks']}, plan {first}-{last}")
    print(f"  {name} rank {r['rank']} parameters   plan {st['parameters']}  run {r['params']}  "
          f"{'ok' if st['parameters'] == r['params'] else 'FAIL'}")
    if st["parameters"] != r["params"]: problems.append(f"rank {r['rank']} parameters")
    near("weights+grad", (b["weights"] + b["gradients"]) / mib, r["wg"], r["rank"])
    near("AdamW", b["optimizer"] / mib, r["opt"], r["rank"])
    near("activations", b["activations"] / mib, r["act"], r["rank"])
    near("total", (b["weights"] + b["gradients"] + b["optimizer"] + b["activations"]) / mib,
         r["wg"] + r["opt"] + r["act"], r["rank"])
    print(f"  {name} rank {r['rank']} (the plan's total with what the trainer does not count: BF16 copy "
          f"{b['bf16_copy'] / mib:.2f}, buffers {b['buffers'] / mib:.2f}: {b['total'] / mib:.2f} MiB)")
sys.exit("; ".join(problems) if problems else 0)
PY
}

tp2pp2=(--parallel.tp=2 --parallel.pp=2 --parallel.dp=1 --parallel.microbatches=2 --data.batch=2)
dp2=(--parallel.dp=2 --parallel.zero=1 --data.batch=2)
check tiny-1 configs/tiny.ini 1
check tiny-tp2pp2 configs/tiny.ini 4 "${tp2pp2[@]}"
check tiny-dp2 configs/tiny.ini 2 "${dp2[@]}"
check llama-1 configs/families/llama.ini 1
check llama-tp2pp2-bf16 configs/families/llama.ini 4 "${tp2pp2[@]}" --precision.dtype=bf16
check mixtral-1 configs/families/mixtral.ini 1
check mixtral-tp2pp2 configs/families/mixtral.ini 4 "${tp2pp2[@]}"
check mixtral-ep2 configs/families/mixtral.ini 2 "${dp2[@]}" --parallel.ep=2
# Context parallelism: half the positions a rank, and the ring's (or the all-to-all's) buffers.
check llama-cp2 configs/families/llama.ini 2 --parallel.cp=2
check llama-cp2-a2a configs/families/llama.ini 2 --parallel.cp=2 --parallel.cp_comm=a2a
# Sequence parallelism: the residual stream's half of the rows, and its gather and scatter buffers.
check llama-tp2-sp configs/families/llama.ini 2 --parallel.tp=2 --parallel.sequence_parallel=true

# Measured memory: the resident set of a process grows from data.batch = 4 to 16 by what the plan says the
# larger micro-batch adds (activations and buffers), within 10% (whatever else the process holds, libraries
# and data reader, is the same in both runs).
rss_growth() {
  local name=$1 config=$2
  "$train" "$src/$config" "${common[@]}" --data.batch=16 --plan --json >"$work/$name-16.plan.json" ||
    fail "$name: --plan at data.batch = 16 failed"
  "$train" "$src/$config" --run.dir="$work/$name-16" "${common[@]}" --data.batch=16 2>"$work/$name-16.log" ||
    fail "$name: the run at data.batch = 16 failed: $(tail -n3 "$work/$name-16.log")"
  python3 - "$name" "$work/$name-1" "$work/$name-1.plan.json" "$work/$name-16" "$work/$name-16.plan.json" <<'PY' ||
import json, sys
name = sys.argv[1]
def rss(run):
    return max(json.loads(l)["peak_rss_mib"] for l in open(run + "/metrics/rank-0.jsonl"))
def total(plan):
    return json.loads(open(plan).read().strip().splitlines()[-1])["stages"][0]["bytes"]["total"] / 2**20
measured, planned = rss(sys.argv[4]) - rss(sys.argv[2]), total(sys.argv[5]) - total(sys.argv[3])
ok = abs(planned - measured) <= 0.10 * measured
print(f"  {name} resident set from data.batch 4 to 16: plan +{planned:.1f} MiB, measured +{measured:.1f} MiB, "
      f"{100 * (planned - measured) / measured:+.1f}%  {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
    fail "$name: the plan's growth is not the resident set's"
}
rss_growth tiny configs/tiny.ini
rss_growth llama configs/families/llama.ini
rss_growth mixtral configs/families/mixtral.ini

# A bad layout: exit 64 and the run's own message (the spec's validation, before any rank starts).
"$train" "$src/configs/tiny.ini" --parallel.tp=8 --plan >"$work/bad.out" 2>"$work/bad.plan.err"
[ $? -eq 64 ] || fail "--plan at tp8 of 4 heads: want exit 64"
"$train" "$src/configs/tiny.ini" --run.dir="$work/bad" --parallel.tp=8 >/dev/null 2>"$work/bad.run.err"
[ $? -eq 64 ] || fail "a run at tp8 of 4 heads: want exit 64"
grep -q "parallel.tp.*must divide model.heads" "$work/bad.plan.err" || fail "bad layout: $(cat "$work/bad.plan.err")"
[ "$(grep error "$work/bad.plan.err")" = "$(grep error "$work/bad.run.err")" ] ||
  fail "--plan's message differs from the run's: $(cat "$work/bad.plan.err") vs $(cat "$work/bad.run.err")"
[ ! -s "$work/bad.out" ] || fail "a refused plan printed a plan"
"$train" "$src/configs/tiny.ini" --json >/dev/null 2>&1
[ $? -eq 64 ] || fail "--json without --plan: want exit 64"

# The large shapes: planned without their memory (peak resident set under 256 MiB), each in one JSON line.
for shape in llama3-8b qwen3-30b-a3b; do
  python3 - "$train" "$src/configs/families/$shape.ini" "$shape" <<'PY' || fail "$shape: no plan"
import json, resource, subprocess, sys
out = subprocess.run([sys.argv[1], sys.argv[2], "--plan"], capture_output=True, text=True, check=True).stdout
plan = json.loads(out.strip().splitlines()[-1])
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
gib = 1024.0 ** 3
print(f"  {sys.argv[3]} at {plan['layout']}: {plan['parameters']['total'] / 1e9:.2f} B parameters, "
      f"{plan['parameters']['active'] / 1e9:.2f} B active, {plan['flops_per_token']['total'] / 1e9:.1f} GFLOP per "
      f"token ({100 * plan['flops_per_token']['attention_share']:.1f}% attention), largest rank "
      f"{plan['largest_rank_bytes'] / gib:.1f} GiB; planned in {rss:.0f} MiB")
assert "per token" in out and "activations" in out
assert plan["largest_rank_bytes"] > 10 * gib, "the large shapes need more than 10 GiB per rank"
sys.exit(0 if rss < 256 else f"planning took {rss:.0f} MiB")
PY
done
echo "PASS"
