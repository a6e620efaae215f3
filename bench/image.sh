#!/usr/bin/env bash
# A rank inside a container image against the same rank outside it (docs/IMAGES.md), interleaved in one
# allocation of the running dev cluster (2 ranks on one node, PMIx), N rounds:
#   runtime   srun of `forge-train --help` alone: what crun adds to a task's start;
#   start     srun of a 2-rank training of one step of a small model: MPI start, model, one step;
#   train     tokens/s of the 2-rank training of configs/bench-cpu.ini (its steps after the first 3).
# Usage: bench/image.sh [BUILD_DIR] [N]  (default build/release, 5 rounds). Builds the image it measures.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
BUILD=$(cd "${1:-$SRC/build/release}" && pwd)
N=${2:-5}
STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
# shellcheck source=/dev/null
source "$STATE/env.sh"
[ -f "$STATE/etc/oci.conf" ] || { echo "image bench: the dev cluster has no oci.conf (crun: scripts/install-deps.sh)" >&2; exit 69; }

# Everything the ranks read or write is where the image shows it (/var/tmp).
work=$(mktemp -d /var/tmp/forge-image-bench.XXXXXX)
trap '[ -n "${FORGE_KEEP:-}" ] || rm -rf "$work"' EXIT
chmod 755 "$work"
cp "$SRC/configs/bench-cpu.ini" "$SRC/configs/tiny.ini" "$work/"
start=$SECONDS
digest=$("$SRC/scripts/forge-image" build --build-dir "$BUILD" "$work/image" 2>/dev/null | tail -n1)
echo "image: $digest ($(du -sm "$work/image" | cut -f1) MiB, built in $((SECONDS - start)) s)"

cat >"$work/rounds.sh" <<'SH'
# Runs inside the allocation: one line per measurement, "KIND WHERE VALUE".
set -euo pipefail
train=$1 image=$2 digest=$3 work=$4 n=$5
# wall CMD...: CMD's wall time in seconds; a failing CMD ends the benchmark with its output.
wall() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >"$work/out" 2>&1 || { tail -n5 "$work/out" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
# A rank in the image checks it runs in the one its job asked for (what the batch scripts export).
in_image=(env FORGE_IMAGE_DIGEST="$digest" "$train" in-image "$image" /opt/forge/bin/forge-train)
tokens() {  # tokens RUN_DIR: median tokens/s of the steps after the third
  python3 -c "import json,sys,statistics as s; r=[json.loads(l) for l in open(sys.argv[1])][3:]; print(s.median(x['tokens_per_s'] for x in r))" "$1/metrics/rank-0.jsonl"
}
small=(--run.threads=1 --run.steps=1 --parallel.dp=2 --data.batch=2 --model.d_model=32 --model.seq_len=32 --ckpt.milestone_every=0)
bench=(--run.threads=1 --run.steps=12 --parallel.dp=2 --data.batch=4 --ckpt.milestone_every=0 --ckpt.recovery_every=0)
for ((i = 0; i < n; i++)); do
  echo "runtime outside $(wall srun -n1 --mpi=none "$train" --help)"
  echo "runtime inside $(wall srun -n1 --mpi=none "${in_image[@]}" --help)"
  echo "start outside $(wall srun -n2 --mpi=pmix "$train" "$work/tiny.ini" --run.dir="$work/s-out-$i" "${small[@]}")"
  echo "start inside $(wall srun -n2 --mpi=pmix "${in_image[@]}" "$work/tiny.ini" --run.dir="$work/s-in-$i" "${small[@]}")"
  wall srun -n2 --mpi=pmix "$train" "$work/bench-cpu.ini" --run.dir="$work/t-out-$i" "${bench[@]}" >/dev/null
  echo "train outside $(tokens "$work/t-out-$i")"
  wall srun -n2 --mpi=pmix "${in_image[@]}" "$work/bench-cpu.ini" --run.dir="$work/t-in-$i" "${bench[@]}" >/dev/null
  echo "train inside $(tokens "$work/t-in-$i")"
done
SH
cd "$work"
salloc --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp2 -N1 -n2 --gres=gpu:2 -Q \
  bash "$work/rounds.sh" "$BUILD/launcher/forge-train" "$work/image" "$digest" "$work" "$N" >"$work/results" 2>"$work/salloc.log" ||
  { tail -n5 "$work/salloc.log" >&2; exit 1; }

median() { awk -v k="$1" -v w="$2" '$1 == k && $2 == w { print $3 }' "$work/results" | sort -g |
  awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "2 ranks on one node of the dev cluster, $N interleaved rounds, medians; load average $(cut -d' ' -f1 /proc/loadavg)"
for kind in runtime start train; do
  out=$(median "$kind" outside) in=$(median "$kind" inside)
  case $kind in
    runtime) what="srun of forge-train --help (s)" ;;
    start) what="srun of a 1-step 2-rank training (s)" ;;
    train) what="tokens/s, bench-cpu 2 ranks" ;;
  esac
  awk -v w="$what" -v o="$out" -v i="$in" 'BEGIN { printf "  %-40s outside %9.3f  inside %9.3f  inside/outside %.3f\n", w, o, i, i / o }'
done
