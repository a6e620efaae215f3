#!/usr/bin/env bash
# Trainer CPU benchmark, in one invocation: the sgemm peak on the benchmark's thread count, our training
# step (bench_trainer_cpu) and the PyTorch peer, for two blocks at the bench size (6 layers, d_model 384,
# 6 heads, vocab 8192, seq 256, batch 8, FP32, AdamW, 2 threads):
#   gpt2:  the GPT-2 block against shared/bench/torch_gpt_cpu.py;
#   llama: the Llama block (RMSNorm, SwiGLU with ffn_hidden 1024, rotary positions, grouped-query attention
#          with kv_heads = heads / 2 = 3, untied head) against bench/torch_llama_cpu.py.
# Prints per model tokens/s of both, the ratio, MFU against the measured peak and the share of the peak
# our matrix products reach (per-op profile of bench_trainer_cpu). The peers run on Debian's python3-torch,
# installed here if missing.
#
# usage: bench/trainer_cpu.sh [BUILD_DIR]      (default build/; needs the target bench_trainer_cpu)
#   THREADS=2 STEPS=8 MODELS="gpt2 llama" TORCH_GPT_SCRIPT=path TORCH_LLAMA_SCRIPT=path override the
#   defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
threads=${THREADS:-2}
steps=${STEPS:-8}
models=${MODELS:-gpt2 llama}
bin=$build/bench/bench_trainer_cpu
torch_gpt=${TORCH_GPT_SCRIPT:-$root/../shared/bench/torch_gpt_cpu.py}
torch_llama=${TORCH_LLAMA_SCRIPT:-$root/bench/torch_llama_cpu.py}
config=(--layers 6 --dmodel 384 --heads 6 --vocab 8192 --seq 256 --batch 8)
# The Llama block's keys beyond the family's defaults (ours), and the same shapes for the peer.
llama_ours=(--model.family=llama --model.kv_heads=3 --model.ffn_hidden=1024)
llama_peer=(--kv-heads 3 --ffn-hidden 1024 --rope-theta 500000)

if [ ! -x "$bin" ]; then
  echo "trainer_cpu.sh: $bin not found; build it: cmake --build $build --target bench_trainer_cpu" >&2
  exit 64
fi
for m in $models; do
  case $m in
    gpt2) peer=$torch_gpt var=TORCH_GPT_SCRIPT ;;
    llama) peer=$torch_llama var=TORCH_LLAMA_SCRIPT ;;
    *) echo "trainer_cpu.sh: unknown model '$m' in MODELS (gpt2, llama)" >&2; exit 64 ;;
  esac
  if [ ! -f "$peer" ]; then
    echo "trainer_cpu.sh: PyTorch peer $peer not found; set $var" >&2
    exit 64
  fi
done

# The peers' dependency, idempotently (bench/lib.sh).
source "$(dirname "$0")/lib.sh"
ensure_torch trainer-cpu || exit 1

machine
summary=()
for m in $models; do
  if [ "$m" = gpt2 ]; then
    ours_args=() peer=$torch_gpt peer_args=()
  else
    ours_args=("${llama_ours[@]}") peer=$torch_llama peer_args=("${llama_peer[@]}")
  fi
  echo
  echo "== $m"
  ours=$("$bin" --threads "$threads" --steps "$steps" "${config[@]}" "${ours_args[@]}")
  echo "$ours"
  peak=$(sed -n 's/^sgemm_peak_gflops=//p' <<<"$ours")
  theirs=$(OMP_NUM_THREADS=$threads /usr/bin/python3 "$peer" "${config[@]}" "${peer_args[@]}" \
    --threads "$threads" --steps "$steps" --peak-gflops "$peak")
  echo "pytorch $theirs"
  load_after

  our_tps=$(sed -n 's/^forge .*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$ours")
  our_mfu=$(sed -n 's/^forge .*mfu=\([0-9.]*\)%.*/\1/p' <<<"$ours")
  products=$(sed -n 's/^products_of_peak=\([0-9.]*\)%.*/\1/p' <<<"$ours")
  torch_tps=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$theirs")
  torch_mfu=$(sed -n 's/.*mfu=\([0-9.]*\)%.*/\1/p' <<<"$theirs")
  echo
  printf '%-10s %12s %8s\n' "$m" "tokens/s" "MFU"
  printf '%-10s %12s %7s%%\n' "forge" "$our_tps" "$our_mfu"
  printf '%-10s %12s %7s%%\n' "pytorch" "$torch_tps" "$torch_mfu"
  # Goals: the ratio for both; MFU for GPT-2; the products' share of the peak for Llama (issue 39).
  mfu_goal="" products_goal=""
  if [ "$m" = gpt2 ]; then mfu_goal=" (goal >= 55%)"; else products_goal=" (goal >= 85%)"; fi
  line=$(awk -v a="$our_tps" -v b="$torch_tps" -v m="$our_mfu" -v p="$peak" -v name="$m" 'BEGIN {
    printf "%s: ratio forge/pytorch = %.2fx (goal >= 2.0x); forge MFU %.1f%% of the measured %.0f GFLOP/s sgemm peak",
      name, a / b, m, p }')
  line+=$mfu_goal
  if [ -n "$products" ]; then line+="; matrix products at $products% of the peak$products_goal"; fi
  echo "$line"
  summary+=("$line")
done
echo
printf '%s\n' "${summary[@]}"
