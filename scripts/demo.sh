#!/usr/bin/env bash
# The end-to-end demo on the embedded dev cluster. Each stage prints a progress line; a failure exits
# non-zero naming the stage. Usage: scripts/demo.sh [--fast]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
fast=0
[ "${1:-}" = "--fast" ] && fast=1

current=""
stage() {
  current="$*"
  printf '\n[demo %s] == %s ==\n' "$(date -u +%H:%M:%S)" "$current"
}
trap 'rc=$?; [ $rc -ne 0 ] && echo "demo: FAILED in stage \"$current\" (exit $rc)" >&2' EXIT

stage "install dependencies"
scripts/install-deps.sh

stage "build"
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
bin=$root/build/release

stage "dev cluster up"
export FORGE_DEVCLUSTER_DIR=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
scripts/devcluster/up
# shellcheck source=/dev/null
source "$FORGE_DEVCLUSTER_DIR/env.sh"

work=${FORGE_DEMO_DIR:-/var/tmp/forge-demo}
mkdir -p "$work"

stage "a 2-node MPI job through sbatch + srun --mpi=pmix"
out=$work/mpi-probe.out
job=$(sbatch --parsable -N2 --ntasks-per-node=2 --gres=gpu:8 -o "$out" --wait \
  --wrap "srun --mpi=pmix $bin/test/common/mpi_allreduce_probe")
cat "$out"
sacct -X -P -n -j "$job" -o JobID,State,AllocTRES

stage "done"
echo "demo: finished; outputs under $work"
