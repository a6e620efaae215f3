#!/usr/bin/env bash
# The vision tower's cost in a vision-language training step on the CPU (bench_vision: the trainer benchmark's
# Llama shape with a 6-block, 384-wide ViT over 16 pictures of 112 x 112 in 14-pixel patches, 2 threads) and
# the same tower in PyTorch (torch_vision_cpu.py, Debian's python3-torch, installed if missing), in one
# invocation: the tower's share of the step, its GFLOP/s against the sgemm peak, and forge/torch time; and
# the step with the language model frozen (train.freeze = lm) against the trained one and their FLOPs' ratio.
#
# usage: bench/vision.sh [BUILD_DIR]   (default build/release; bench_vision is built if needed). JOBS=N sets
#   the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build_targets vision.sh "$build" bench_vision
ensure_torch vision
machine
ours=$("$build/bench/bench_vision" --threads 2 --reps 3)
echo "$ours"
peer=$(/usr/bin/python3 "$root/bench/torch_vision_cpu.py" --pictures 16 --image-size 112 --patch 14 --width 384 \
  --layers 6 --heads 6 --mlp-hidden 1536 --projector 384 --out 384 --threads 2 --reps 5)
echo "$peer"
tower=$(sed -n 's/.*tower_ms=\([0-9.]*\).*/\1/p' <<<"$ours")
torch_ms=$(sed -n 's/.*torch_tower_ms=\([0-9.]*\).*/\1/p' <<<"$peer")
awk -v f="$tower" -v t="$torch_ms" 'BEGIN { printf "tower forward+backward: forge %.1f ms, torch %.1f ms: forge/torch time %.2f\n", f, t, f / t }'
load_after
