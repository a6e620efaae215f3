#!/usr/bin/env bash
# Trainer CPU benchmark, in one invocation: the sgemm peak on the benchmark's thread count, our training
# step (bench_trainer_cpu), and the PyTorch peer (shared/bench/torch_gpt_cpu.py, Debian python3-torch) on
# the same GPT config; prints tokens/s of both, the ratio, and MFU against the measured peak.
#
# usage: bench/trainer_cpu.sh [BUILD_DIR]      (default build/; needs the target bench_trainer_cpu)
#   THREADS=2 STEPS=8 TORCH_GPT_SCRIPT=path override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
threads=${THREADS:-2}
steps=${STEPS:-8}
bin=$build/bench/bench_trainer_cpu
torch_script=${TORCH_GPT_SCRIPT:-$root/../shared/bench/torch_gpt_cpu.py}
config=(--layers 6 --dmodel 384 --heads 6 --vocab 8192 --seq 256 --batch 8)

if [ ! -x "$bin" ]; then
  echo "trainer_cpu.sh: $bin not found; build it: cmake --build $build --target bench_trainer_cpu" >&2
  exit 64
fi
if [ ! -f "$torch_script" ]; then
  echo "trainer_cpu.sh: PyTorch peer $torch_script not found; set TORCH_GPT_SCRIPT" >&2
  exit 64
fi

echo "machine: $(nproc) cores, $(uname -m), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
ours=$("$bin" --threads "$threads" --steps "$steps" "${config[@]}")
echo "$ours"
peak=$(sed -n 's/^sgemm_peak_gflops=//p' <<<"$ours")
theirs=$(OMP_NUM_THREADS=$threads /usr/bin/python3 "$torch_script" "${config[@]}" --threads "$threads" \
  --steps "$steps" --peak-gflops "$peak")
echo "pytorch $theirs"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

our_tps=$(sed -n 's/^forge .*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$ours")
our_mfu=$(sed -n 's/^forge .*mfu=\([0-9.]*\)%.*/\1/p' <<<"$ours")
torch_tps=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$theirs")
torch_mfu=$(sed -n 's/.*mfu=\([0-9.]*\)%.*/\1/p' <<<"$theirs")
echo
printf '%-10s %12s %8s\n' "" "tokens/s" "MFU"
printf '%-10s %12s %7s%%\n' "forge" "$our_tps" "$our_mfu"
printf '%-10s %12s %7s%%\n' "pytorch" "$torch_tps" "$torch_mfu"
awk -v a="$our_tps" -v b="$torch_tps" -v m="$our_mfu" -v p="$peak" 'BEGIN {
  printf "ratio forge/pytorch = %.2fx (goal >= 2.0x); forge MFU %.1f%% of the measured %.0f GFLOP/s sgemm peak (goal >= 55%%)\n", a / b, m, p }'
