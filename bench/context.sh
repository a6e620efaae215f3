#!/usr/bin/env bash
# Context-parallelism benchmark (issue 41; docs/PERFORMANCE.md "Context parallelism"), one thread per rank
# on this machine's cores, a Llama-family model (configs/bench-cpu.ini with 2 blocks of 256, 4 query heads
# sharing 2 key/value heads, vocab 4096) on one sequence per step, no documents (full causal attention):
#   - at 8K positions, cp1 on one rank against cp2 on two (ring attention): tokens/s against twice cp1's
#     (goal >= 0.85), the ring's exposed time as a fraction of the step (goal <= 10%), activation memory per
#     rank against cp1's (goal <= 0.55x), bytes per step against the analytic count; and cp2 with a2a;
#   - the same in BF16 (cp1 against cp2 ring): scaling, exposed ring time, activation memory;
#   - selective and full recompute at 8K on cp1: activation memory and step time against keeping them;
#   - the same blocks x 8 on 4 x 1024 positions: selective and full recompute on one rank, sequence
#     parallelism (also with full recompute) at tp2 against tp2 without it;
#   - sequence parallelism at tp2 (SP_SEQ positions, default 4096): activation memory per rank and tokens/s
#     against tp2 without it (goal <= 0.6x the memory);
#   - at 32K positions, under a memory cap halfway between cp1's and cp2's plans: forge-train --plan refuses
#     cp1 (exit 64, naming what would fit) and accepts cp2, which then trains within it (peak RSS per rank).
#   bench/context.sh [BUILD_DIR]   (targets bench_parallel and forge-train)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
bin=$build/bench/bench_parallel train=$build/launcher/forge-train
for b in "$bin" "$train"; do
  [[ -x $b ]] || { echo "bench/context.sh: $b missing (cmake --build $build --target bench_parallel forge-train)" >&2; exit 64; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
spec=$root/configs/bench-cpu.ini
model=(--model.family=llama --model.d_model=256 --model.heads=4 --model.kv_heads=2 --model.ffn_hidden=688
  --model.vocab=4096 --run.threads=1 --run.device=cpu)
run() {  # [LAYERS=2] [BATCH=1] run NP SEQ STEPS overrides...
  local np=$1 seq=$2 steps=$3
  shift 3
  mpirun --oversubscribe --bind-to core -np "$np" "$bin" "$spec" "${model[@]}" --model.layers="${LAYERS:-2}" \
    --data.batch="${BATCH:-1}" --model.seq_len="$seq" --run.steps="$steps" "$@"
}
machine
echo "# 8K positions: cp1 on 1 rank, cp2 on 2 ranks (1 thread each; 2 warm-up steps, then ${STEPS:-3})"
cp1=$(run 1 8192 $((2 + ${STEPS:-3})))
echo "$cp1"
cp2=$(run 2 8192 $((2 + ${STEPS:-3})) --parallel.cp=2)
echo "$cp2"
a2a=$(run 2 8192 $((2 + ${STEPS:-3})) --parallel.cp=2 --parallel.cp_comm=a2a)
echo "$a2a"
python3 - "$cp1" "$cp2" "$a2a" <<'PY'
import json, sys
one, two, a2a = (json.loads(a) for a in sys.argv[1:])
print(f"cp2 tokens/s / (2 x cp1): {two['tokens_per_s'] / (2 * one['tokens_per_s']):.3f}   (goal >= 0.85)")
print(f"cp2 ring time exposed: {100 * two['cp_comm_fraction']:.1f}% of the step   (goal <= 10%)")
print(f"activation memory per rank, cp2 / cp1: {two['activation_mib_per_rank'] / one['activation_mib_per_rank']:.3f}"
      f"   ({two['activation_mib_per_rank']:.1f} / {one['activation_mib_per_rank']:.1f} MiB; goal <= 0.55)")
print(f"cp2 bytes per step: {two['comm_mb_per_step']:.3f} MB, analytic {two['analytic_mb_per_step']:.3f} MB")
print(f"cp2 a2a tokens/s / (2 x cp1): {a2a['tokens_per_s'] / (2 * one['tokens_per_s']):.3f}, communication "
      f"{100 * a2a['cp_comm_fraction']:.1f}% of the step, activation memory / cp1 "
      f"{a2a['activation_mib_per_rank'] / one['activation_mib_per_rank']:.3f}")
PY

echo "# BF16 at 8K: cp1 on 1 rank, cp2 ring on 2 (q, k, v widened for the chunk ops, the output rounded once)"
cp1_16=$(run 1 8192 $((2 + ${STEPS:-3})) --precision.dtype=bf16)
echo "$cp1_16"
cp2_16=$(run 2 8192 $((2 + ${STEPS:-3})) --parallel.cp=2 --precision.dtype=bf16)
echo "$cp2_16"
python3 - "$cp1_16" "$cp2_16" "$cp1" <<'PY'
import json, sys
one, two, fp32 = (json.loads(a) for a in sys.argv[1:])
print(f"BF16 cp2 tokens/s / (2 x BF16 cp1): {two['tokens_per_s'] / (2 * one['tokens_per_s']):.3f}, ring time exposed "
      f"{100 * two['cp_comm_fraction']:.1f}% of the step, activation memory per rank cp2 / cp1 "
      f"{two['activation_mib_per_rank'] / one['activation_mib_per_rank']:.3f} ({two['activation_mib_per_rank']:.1f} / "
      f"{one['activation_mib_per_rank']:.1f} MiB; FP32 cp1: {fp32['activation_mib_per_rank']:.1f} MiB)")
PY

echo "# activation recompute (model.recompute = selective, full), cp1 at 8K: activation memory and step time"
re=$(run 1 8192 $((2 + ${STEPS:-3})) --model.recompute=selective)
echo "$re"
full=$(run 1 8192 $((2 + ${STEPS:-3})) --model.recompute=full)
echo "$full"
python3 - "$cp1" "$re" "$full" <<'PY'
import json, sys
kept, re, full = (json.loads(a) for a in sys.argv[1:])
for name, r, goal in (("selective", re, "(goals <= 0.60, <= 1.05)"), ("full", full, "")):
    print(f"{name} / none: activations {r['activation_mib_per_rank'] / kept['activation_mib_per_rank']:.3f} "
          f"({r['activation_mib_per_rank']:.1f} / {kept['activation_mib_per_rank']:.1f} MiB), step time "
          f"{r['step_ms'] / kept['step_ms']:.3f} {goal}")
PY

echo "# the same blocks x 8, 4 x 1024 positions: recompute on one rank, sequence parallelism at tp2"
deep() { LAYERS=8 BATCH=4 run "$1" 1024 $((2 + ${STEPS:-3})) "${@:2}"; }
d_none=$(deep 1)
d_sel=$(deep 1 --model.recompute=selective)
d_full=$(deep 1 --model.recompute=full)
d_tp2=$(deep 2 --parallel.tp=2)
d_sp=$(deep 2 --parallel.tp=2 --parallel.sequence_parallel=true)
d_sp_full=$(deep 2 --parallel.tp=2 --parallel.sequence_parallel=true --model.recompute=full)
python3 - "$d_none" "$d_sel" "$d_full" "$d_tp2" "$d_sp" "$d_sp_full" <<'PY'
import json, sys
none, sel, full, tp2, sp, sp_full = (json.loads(a) for a in sys.argv[1:])
def ratio(a, b, what):
    return (f"activations {a['activation_mib_per_rank'] / b['activation_mib_per_rank']:.3f} "
            f"({a['activation_mib_per_rank']:.1f} / {b['activation_mib_per_rank']:.1f} MiB), step time "
            f"{a['step_ms'] / b['step_ms']:.3f} ({a['step_ms'] / 1e3:.2f} / {b['step_ms'] / 1e3:.2f} s){what}")
print("8 blocks, selective / none:", ratio(sel, none, ""))
print("8 blocks, full / none:", ratio(full, none, "   (goals <= 0.60, <= 1.05)"))
print("8 blocks tp2, sequence parallel / without:", ratio(sp, tp2, "   (goal <= 0.60)"))
print("8 blocks tp2, sequence parallel + full recompute / neither:", ratio(sp_full, tp2, ""))
PY

echo "# sequence parallelism (parallel.sequence_parallel), tp2 at ${SP_SEQ:-4096}: activation memory and step time"
tp2=$(run 2 "${SP_SEQ:-4096}" $((2 + ${STEPS:-3})) --parallel.tp=2)
echo "$tp2"
sp=$(run 2 "${SP_SEQ:-4096}" $((2 + ${STEPS:-3})) --parallel.tp=2 --parallel.sequence_parallel=true)
echo "$sp"
python3 - "$tp2" "$sp" <<'PY'
import json, sys
tp2, sp = (json.loads(a) for a in sys.argv[1:])
print(f"tp2 with / without: activations {sp['activation_mib_per_rank'] / tp2['activation_mib_per_rank']:.3f} "
      f"({sp['activation_mib_per_rank']:.1f} / {tp2['activation_mib_per_rank']:.1f} MiB; goal <= 0.60), peak RSS "
      f"{sp['peak_rss_mib_per_rank']:.0f} / {tp2['peak_rss_mib_per_rank']:.0f} MiB, tokens/s "
      f"{sp['tokens_per_s'] / tp2['tokens_per_s']:.3f}")
PY

echo "# 32K positions under a memory cap"
plan() { "$train" "$spec" "${model[@]}" --model.layers=2 --data.batch=1 --model.seq_len=32768 --plan --json "$@"; }
total() { python3 -c "import json,sys; print(max(s['bytes']['total'] for s in json.loads(sys.stdin.readline())['stages']))"; }
need1=$(plan | total)
need2=$(plan --parallel.cp=2 | total)
cap=$(python3 -c "print(round(($need1 + $need2) / 2 / 2**30, 3))")
echo "plans: cp1 $need1 bytes per rank, cp2 $need2; cap run.memory_per_rank_gib = $cap"
set +e
msg=$(plan --run.memory_per_rank_gib="$cap" 2>&1 >/dev/null)
rc=$?
set -e
echo "cp1 under the cap: exit $rc: $msg"
[ $rc -eq 64 ] || { echo "bench/context.sh: cp1 was not refused" >&2; exit 1; }
plan --parallel.cp=2 --run.memory_per_rank_gib="$cap" >/dev/null
echo "cp2 under the cap: planned within it; training 3 steps:"
run 2 32768 3 --parallel.cp=2 --run.memory_per_rank_gib="$cap"
