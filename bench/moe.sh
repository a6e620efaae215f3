#!/usr/bin/env bash
# Mixture-of-Experts benchmark through forge-train on the trainer benchmark config (configs/bench-cpu.ini:
# 6 layers, d_model 384, batch 8 x 256, FP32): an MoE model of the same active parameters (4 experts of
# the dense MLP's shape in every block, top-1; + the routers) against the dense model on one rank x 2
# threads (issue goal: >= 0.7x its tokens/s); then EP2 against EP1 on 2 ranks x 1 thread (dp2, the same
# global batch) and the exposed all-to-all time of EP2. Median tokens/s of steps 3..STEPS.
#   bench/moe.sh [BUILD_DIR]    (STEPS=8 by default)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
train=$build/launcher/forge-train
[[ -x $train ]] || { echo "bench/moe.sh: $train missing (cmake --build $build --target forge-train)" >&2; exit 64; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1
steps=${STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
moe=(--model.ffn=moe --model.experts=4 --model.top_k=1)
run() {  # NAME NP THREADS overrides...
  local name=$1 np=$2 threads=$3
  shift 3
  OMP_NUM_THREADS=$threads mpirun --oversubscribe --bind-to none -np "$np" "$train" "$root/configs/bench-cpu.ini" \
    --run.dir="$work/$name" --run.steps="$steps" --run.threads="$threads" --run.peak_gflops=100 \
    --ckpt.recovery_every=0 --ckpt.milestone_every=0 "$@" 2>"$work/$name.log" ||
    { tail -n3 "$work/$name.log" >&2; exit 1; }
}
machine
run dense 1 2
run moe 1 2 "${moe[@]}"
run ep1 2 1 "${moe[@]}" --data.batch=4 --parallel.dp=2
run ep2 2 1 "${moe[@]}" --data.batch=4 --parallel.dp=2 --parallel.ep=2
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
def recs(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics/rank-0.jsonl")][2:steps]
def tps(name):
    return statistics.median(r["tokens_per_s"] for r in recs(name))
summary = {n: json.load(open(f"{work}/{n}/summary.json"))["parameters"] for n in ("dense", "moe")}
for n, p in summary.items():
    print(f"{n}: {p['total'] / 1e6:.2f} M parameters, {p['active'] / 1e6:.2f} M active, {tps(n):.0f} tokens/s (1 rank x 2 threads)")
print(f"MoE / dense tokens/s: {tps('moe') / tps('dense'):.3f} (goal >= 0.7)")
for n in ("ep1", "ep2"):
    print(f"{n}: {tps(n):.0f} tokens/s (2 ranks x 1 thread, dp2)")
print(f"EP2 / EP1 tokens/s: {tps('ep2') / tps('ep1'):.3f}")
r = recs("ep2")
a2a = statistics.median(x["expert_comm_ms"] for x in r)
step = statistics.median(x["step_ms"] for x in r)
mb = statistics.median(x["expert_comm_bytes"] for x in r) / 2**20
print(f"EP2 all-to-all: {a2a:.1f} ms of a {step:.0f} ms step exposed ({100 * a2a / step:.1f}%), {mb:.1f} MiB sent per rank and step")
PY
