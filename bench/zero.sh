#!/usr/bin/env bash
# ZeRO benchmark (issue 42; docs/PERFORMANCE.md "ZeRO-2 and ZeRO-3"), one thread per rank on this machine's
# cores, a Llama-family model (8 blocks of 512, 8 query heads sharing 4 key/value heads, vocab 8192, one
# 512-position sequence per rank and step) on dp2:
#   - tokens/s of ZeRO-2 and ZeRO-3 (prefetch on, and off) against ZeRO-1's in the same run (goal for
#     ZeRO-3 with prefetch >= 0.9x), the time ZeRO-3's passes waited for gathers, and the training state's
#     peak per rank (state_mib, resident pages) against ZeRO-1's;
#   - BF16: ZeRO-3 against ZeRO-1, both BF16; a pass gathers the BF16 working copy (2 bytes a weight, not
#     FP32's 4) and keeps only the rank's part of the FP32 weights;
#   - from the plan: the most blocks of that width that fit dp4 ranks sharing this machine's available
#     memory, ZeRO-1 against ZeRO-3.
# The runs alternate ROUNDS times (default 1); each ratio is taken within a round, and with more than one
# round their median is printed beside them (a shared VM's speed drifts by more than the stages differ).
# RUNS picks some of z1 z2 z3 z3-noprefetch z1-bf16 z3-bf16 (default all; z1 is every ratio's base), e.g.
# RUNS="z1 z3" ROUNDS=8 for the FP32 goal alone; PLAN=0 leaves out the plan's search.
#   [ROUNDS=N] [STEPS=N] [RUNS=...] [PLAN=0] bench/zero.sh [BUILD_DIR]   (target forge-train)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
train=$build/launcher/forge-train
[[ -x $train ]] || { echo "bench/zero.sh: $train missing (cmake --build $build --target forge-train)" >&2; exit 64; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--model.family=llama --model.d_model=512 --model.heads=8 --model.kv_heads=4
  --model.vocab=8192 --model.seq_len=512 --data.batch=1 --run.threads=1 --run.device=cpu --run.peak_gflops=100
  --ckpt.recovery_every=0 --ckpt.milestone_every=0)
steps=${STEPS:-8} rounds=${ROUNDS:-1}
machine
echo "# dp2, 2 warm-up steps then $steps measured, $rounds round(s)"
declare -A keys=([z1]="--parallel.zero=1" [z2]="--parallel.zero=2" [z3]="--parallel.zero=3"
  [z3-noprefetch]="--parallel.zero=3 --parallel.prefetch=false" [z1-bf16]="--parallel.zero=1 --precision.dtype=bf16"
  [z3-bf16]="--parallel.zero=3 --precision.dtype=bf16")
read -ra runs <<<"${RUNS:-z1 z2 z3 z3-noprefetch z1-bf16 z3-bf16}"
for run in "${runs[@]}"; do
  [[ -v keys[$run] ]] || { echo "bench/zero.sh: RUNS: no run $run (${!keys[*]})" >&2; exit 64; }
done
[[ " ${runs[*]} " == *" z1 "* ]] || { echo "bench/zero.sh: RUNS must hold z1, every ratio's base" >&2; exit 64; }
for round in $(seq 1 "$rounds"); do
  for run in "${runs[@]}"; do
    name=$run-$round
    read -ra args <<<"${keys[$run]}"
    mpirun --oversubscribe --bind-to core -np 2 "$train" "$root/configs/tiny.ini" --run.dir="$work/$name" "${model[@]}" \
      --model.layers=8 --parallel.dp=2 --run.steps=$((steps + 2)) "${args[@]}" 2>"$work/$name.log" ||
      { echo "bench/zero.sh: $name failed: $(grep -i error "$work/$name.log" | head -2)" >&2; exit 1; }
  done
done
python3 - "$work" "$rounds" "${runs[@]}" <<'PY'
import functools, json, statistics, sys
rounds = range(1, int(sys.argv[2]) + 1)
ran = set(sys.argv[3:])
@functools.cache  # each run's metrics read once
def figures(name, r):
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}-{r}/metrics/rank-0.jsonl")][2:]
    return {"tps": statistics.median(x["tokens_per_s"] for x in recs),
            "state": max(x["state_mib"] for x in recs),
            "gather": statistics.median(x.get("gather_ms", 0) for x in recs),
            "gathered": statistics.median(x.get("gather_bytes", 0) for x in recs) / 1e6,
            "step": statistics.median(x["step_ms"] for x in recs)}
def ratio(name, base):  # tokens/s against base's in the same round: each round's, and their median
    per = [figures(name, r)["tps"] / figures(base, r)["tps"] for r in rounds]
    out = f"{statistics.median(per):.3f}"
    if len(per) > 1:
        out += f" (rounds: {' '.join(f'{x:.3f}' for x in per)}"
        if len(per) > 2:  # the mean and its standard error: how far the rounds' noise leaves the ratio
            out += f"; mean {statistics.mean(per):.3f} +- {statistics.stdev(per) / len(per) ** 0.5:.3f}"
        out += ")"
    return out
def median(name, key):
    return statistics.median(figures(name, r)[key] for r in rounds)
z1 = {k: median("z1", k) for k in ("tps", "step", "state")}
print(f"ZeRO-1: {z1['tps']:.0f} tokens/s, step {z1['step']:.0f} ms, training state {z1['state']:.1f} MiB per rank")
for name in [n for n in ("z2", "z3", "z3-noprefetch") if n in ran]:
    goal = "   (goal >= 0.9)" if name == "z3" else ""
    gather, step, state = median(name, "gather"), median(name, "step"), median(name, "state")
    print(f"{name}: tokens/s / ZeRO-1 {ratio(name, 'z1')}{goal}; gathers waited {gather:.0f} ms "
          f"({100 * gather / step:.1f}% of the step); training state {state:.1f} MiB "
          f"({state / z1['state']:.2f}x); gathered {median(name, 'gathered'):.1f} MB a step")
if not {"z1-bf16", "z3-bf16", "z3"} <= ran:
    sys.exit(0)
b1, b3 = {k: median("z1-bf16", k) for k in ("tps", "state")}, {k: median("z3-bf16", k) for k in ("gather", "step", "gathered", "state")}
print(f"BF16 ZeRO-1: {b1['tps']:.0f} tokens/s, training state {b1['state']:.1f} MiB; BF16 ZeRO-3: tokens/s / BF16 "
      f"ZeRO-1 {ratio('z3-bf16', 'z1-bf16')}; gathers waited {b3['gather']:.0f} ms ({100 * b3['gather'] / b3['step']:.1f}%); "
      f"gathered {b3['gathered']:.1f} MB a step ({b3['gathered'] / median('z3', 'gathered'):.2f}x FP32 ZeRO-3's); "
      f"training state {b3['state']:.1f} MiB ({b3['state'] / b1['state']:.2f}x)")
PY
[ "${PLAN:-1}" = 0 ] && exit 0
available=$(awk '/MemAvailable/ {print $2 * 1024}' /proc/meminfo)
cap=$(python3 -c "print(f'{$available / 4 / 2**30:.3f}')")
echo "# the plan: the most blocks of 512 that fit 4 ranks in $((available >> 20)) MiB available ($cap GiB per rank)"
for zero in 1 3; do
  layers=8
  while "$train" "$root/configs/tiny.ini" "${model[@]}" --model.layers=$((layers * 2)) --parallel.dp=4 \
      --parallel.zero=$zero --run.memory_per_rank_gib="$cap" --plan --json >/dev/null 2>&1; do
    layers=$((layers * 2))
  done
  lo=$layers hi=$((layers * 2))
  while [ $((hi - lo)) -gt 1 ]; do
    mid=$(((lo + hi) / 2))
    if "$train" "$root/configs/tiny.ini" "${model[@]}" --model.layers=$mid --parallel.dp=4 --parallel.zero=$zero \
        --run.memory_per_rank_gib="$cap" --plan --json >/dev/null 2>&1; then lo=$mid; else hi=$mid; fi
  done
  params=$("$train" "$root/configs/tiny.ini" "${model[@]}" --model.layers=$lo --parallel.dp=4 --parallel.zero=$zero \
    --plan --json | python3 -c "import json, sys; print(f\"{json.load(sys.stdin)['parameters']['total'] / 1e6:.0f}\")")
  echo "ZeRO-$zero: $lo blocks ($params M parameters) fit dp4"
done
