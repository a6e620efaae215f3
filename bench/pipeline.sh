#!/usr/bin/env bash
# Pipeline schedules benchmark (issue 42; docs/PERFORMANCE.md "Pipeline schedules"): the trainer benchmark's
# model (configs/bench-cpu.ini) at 8 blocks, one thread per stage; 1F1B, interleaved and ZB-H1 in the same
# run, each twice (alternating; the better kept): tokens/s against 1F1B's, each step's measured bubble (the
# worst stage's time waiting on the pipeline's messages) beside the schedule's analytic one, the bytes a
# stage sends against the analytic volume, and the activation memory (ZB-H1's weight-gradient queues in it).
#   - pp2, 2 micro-batches of 2 sequences, each stage on its own core: interleaved with 2 and 4 chunks;
#   - pp4, 8 micro-batches of one sequence (the issue's shape): 4 ranks on this machine's cores, so
#     oversubscribed where it has fewer than 4 (a stage then waits for a core, not only for its neighbour).
#   bench/pipeline.sh [BUILD_DIR]   (target bench_parallel)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
build_targets bench/pipeline.sh "$build" bench_parallel
bin=$build/bench/bench_parallel
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
steps=${STEPS:-8}
cores=$(OMP_NUM_THREADS='' nproc)
machine "1 thread per rank"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shape PP MICROBATCHES BATCH SCHEDULE...: each schedule (name[:chunks]) twice, alternating.
shape() {
  local pp=$1 m=$2 batch=$3 bind=none
  shift 3
  [ "$pp" -le "$cores" ] && bind=core
  echo "# pp$pp, m = $m of $batch sequences, 2 warm-up steps then $((steps - 2)) measured, bound to $bind"
  for _ in 1 2; do
    for schedule in "$@"; do
      mpirun --oversubscribe --bind-to "$bind" -np "$pp" "$bin" "$root/configs/bench-cpu.ini" --run.steps="$steps" \
        --run.threads=1 --model.layers=8 --data.batch="$batch" --parallel.pp="$pp" --parallel.microbatches="$m" \
        --parallel.pp_schedule="${schedule%%:*}" --parallel.pp_virtual="$([[ $schedule == *:* ]] && echo "${schedule#*:}" || echo 0)" \
        >>"$out"
    done
  done
}
shape 2 2 2 1f1b interleaved:2 interleaved:4 zb-h1
shape 4 8 1 1f1b interleaved:2 zb-h1
load_after
python3 - "$out" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["layout"], r["schedule"], r["chunks"]), []).append(r)
best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
for layout in dict.fromkeys(k[0] for k in best):
    base = best[(layout, "1f1b", 1)]["tokens_per_s"]
    print(f"{layout}, m = {best[(layout, '1f1b', 1)]['microbatches']}:")
    for (lay, name, chunks), r in best.items():
        if lay != layout:
            continue
        label = name + (f" v={chunks}" if chunks > 1 else "")
        print(f"  {label:15s} {r['tokens_per_s']:6.0f} tokens/s ({r['tokens_per_s'] / base:.3f}x 1f1b); bubble measured "
              f"{r['bubble_fraction']:.3f}, analytic {r['bubble_ideal']:.3f} ({100 * (r['bubble_fraction'] - r['bubble_ideal']):+.1f} "
              f"points); sends {r['comm_mb_per_step']:.1f} MB a step (analytic {r['analytic_mb_per_step']:.1f}); "
              f"activations {r['activation_mib_per_rank']:.1f} MiB a rank")
PY
