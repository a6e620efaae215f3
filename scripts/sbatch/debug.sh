#!/usr/bin/env bash
# Interactive debugging of SlurmForge jobs (docs/DEVCLUSTER.md, "Debugging a run").
#   debug.sh step SPEC.ini [--layout tpX,ppY,dpZ] [--team T --tier TIER] [--section.key=value ...]
#       one training step, ranks labelled, on the layout the job would use, in a scratch run directory
#   debug.sh stacks JOBID [--program NAME]
#       every thread's backtrace (gdb) of each forge-train rank of a running (hung) job, node by node
#   debug.sh env [SALLOC_OPTIONS ...]
#       SLURM_*, FORGE_*, CUDA_VISIBLE_DEVICES, OMPI_*/PMIX_* of every rank, grouped by rank
#   debug.sh shell [SALLOC_OPTIONS ...]
#       an allocation with an interactive shell on its first node (salloc + srun --pty)
# step and env run in the current allocation when there is one (inside salloc), otherwise they make one.
# Programs come from FORGE_BUILD_DIR (or PATH), as in the batch scripts.
set -euo pipefail
self=$(readlink -f "$0")
here=$(dirname "$self")
# shellcheck source=common.sh
source "$here/common.sh"

die() {
  echo "debug.sh: $*" >&2
  exit 64
}
usage() { sed -n '2,12p' "$self" | sed 's/^# \{0,1\}//'; }

# Variables that explain a rank's view of the job: placement, the plugin's FORGE_* choices, devices, and
# the MPI/PMIx bootstrap.
env_pattern='^(SLURM_|SLURMD_|FORGE_|CUDA_VISIBLE_DEVICES=|OMPI_|PMIX_)'

cmd_env() {
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    exec salloc "$@" "$self" env
  fi
  [ $# -eq 0 ] || die "env: salloc options are for use outside an allocation (this is job $SLURM_JOB_ID)"
  # -l prefixes each line with the rank; a stable sort by that prefix groups each rank's lines.
  srun --mpi="${FORGE_SRUN_MPI:-pmix}" -l bash -c \
    "echo \"== rank \$SLURM_PROCID on \$SLURMD_NODENAME (pid \$\$)\"; env | grep -E '$env_pattern' | LC_ALL=C sort" |
    sort -s -n -k1,1
}

cmd_shell() {
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    exec salloc "$@" srun --pty --overlap -N1 -n1 bash -i
  fi
  exec srun --pty --overlap -N1 -n1 bash -i
}

cmd_step() {
  [ $# -ge 1 ] || die "step: need SPEC.ini (see --help)"
  local spec layout="" team="" tier="" overrides=()
  spec=$(readlink -f "$1") || die "step: $1: no such file"
  [ -f "$spec" ] || die "step: $1: no such file"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --layout) [ $# -ge 2 ] || die "step: --layout needs tpX,ppY,dpZ"; layout=$2; shift ;;
      --layout=*) layout=${1#*=} ;;
      --team=*) team=${1#*=} ;;
      --team) [ $# -ge 2 ] || die "step: --team needs a name"; team=$2; shift ;;
      --tier=*) tier=${1#*=} ;;
      --tier) [ $# -ge 2 ] || die "step: --tier needs a name"; tier=$2; shift ;;
      --*.*=*) overrides+=("$1") ;;
      *) die "step: unexpected argument '$1' (options: --layout, --team, --tier, --section.key=value)" ;;
    esac
    shift
  done
  local train
  train=$(forge_bin forge-train)
  # The layout: as given, else the spec's own [parallel] (what the job would run).
  if [ -z "$layout" ]; then
    layout=$("$train" "$spec" "${overrides[@]}" --print-config | awk -F' = ' '
      /^\[/ { s = substr($0, 2, length($0) - 2) }
      s == "parallel" && $1 ~ /^(tp|cp|ep|dp|pp)$/ { v[$1] = $2 }
      END { printf "tp%s,pp%s,dp%s,cp%s,ep%s", v["tp"], v["pp"], v["dp"], v["cp"], v["ep"] }')
  fi
  # Its dimensions from the one layout parser (forge-quota layout prints tp= cp= ep= dp= pp= ranks=).
  local facts kv tp cp ep dp pp ranks
  facts=$("$(forge_bin forge-quota)" layout "$layout" 2>&1) || die "step: --layout: ${facts#forge-quota: error: }"
  for kv in $facts; do
    case ${kv%%=*} in tp | cp | ep | dp | pp | ranks) printf -v "${kv%%=*}" %s "${kv#*=}" ;; esac
  done
  # A scratch run directory: the step must neither resume from nor write into the real run's checkpoints.
  local scratch=${FORGE_DEBUG_DIR:-${TMPDIR:-/tmp}}/forge-debug-step.$$
  local args=("$spec" "${overrides[@]}" --parallel.tp="$tp" --parallel.cp="$cp" --parallel.ep="$ep"
    --parallel.pp="$pp" --parallel.dp="$dp"
    --run.steps=1 --run.dir="$scratch" --ckpt.recovery_every=0 --ckpt.milestone_every=0)

  if [ -z "${SLURM_JOB_ID:-}" ]; then
    # Allocate the way submit-pipeline does: one task per rank, FORGE_GPUS_PER_NODE ranks per node.
    local per_node=${FORGE_GPUS_PER_NODE:-8} nodes tasks_per_node alloc=()
    nodes=$(((ranks + per_node - 1) / per_node))
    tasks_per_node=$(((ranks + nodes - 1) / nodes))
    # A time limit: under GrpTRESMins with AccountingStorageEnforce=safe, a GPU job without one never starts.
    alloc=(-N "$nodes" --ntasks-per-node="$tasks_per_node" --gres=gpu:"$tasks_per_node" -J forge-debug-step
      -t "${FORGE_DEBUG_TIME:-30}")
    if [ -n "$team$tier" ]; then
      [ -n "$team" ] && [ -n "$tier" ] || die "step: give --team and --tier together"
      alloc+=(--train-team="$team" --train-tier="$tier" --train-layout="$layout")
    fi
    exec salloc "${alloc[@]}" "$self" step "$spec" --layout="$layout" "${overrides[@]}"
  fi

  mkdir -p "$scratch"
  echo "debug.sh: job $SLURM_JOB_ID on ${SLURM_JOB_NODELIST:-?}: one step of $spec, layout $layout ($ranks ranks)"
  echo "debug.sh: resolved spec:"
  "$train" "${args[@]}" --print-config | sed 's/^/  /'
  local rc=0
  # -v: srun reports the launch (nodes, tasks, step id); -l: every output line carries its rank; every
  # rank logs at debug level.
  FORGE_LOG_LEVEL=${FORGE_LOG_LEVEL:-debug} FORGE_LOG_ALL_RANKS=1 srun -v -l --mpi="${FORGE_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 -n "$ranks" "$train" "${args[@]}" || rc=$?
  echo "debug.sh: forge-train exit $rc ($(forge_exit_class "$rc"))"
  local f
  for f in "$scratch"/metrics/rank-*.jsonl "$scratch/summary.json"; do
    [ -f "$f" ] && { echo "debug.sh: ${f#"$scratch"/}:"; awk '{ print "  " $0 }' "$f"; }
  done
  if [ "${FORGE_DEBUG_KEEP:-0}" = 1 ]; then
    echo "debug.sh: scratch run directory kept: $scratch"
  else
    rm -rf "$scratch"
  fi
  return "$rc"
}

cmd_stacks() {
  [ $# -ge 1 ] || die "stacks: need JOBID (see --help)"
  local job=$1 program=forge-train
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --program=*) program=${1#*=} ;;
      --program) [ $# -ge 2 ] || die "stacks: --program needs a name"; program=$2; shift ;;
      *) die "stacks: unexpected argument '$1'" ;;
    esac
    shift
  done
  [[ $job =~ ^[0-9]+$ ]] || die "stacks: JOBID must be a number, not '$job'"
  command -v gdb >/dev/null || { echo "debug.sh: gdb not found (scripts/install-deps.sh)" >&2; exit 69; }
  local state nodelist
  state=$(squeue -h -j "$job" -o %T 2>/dev/null) || true
  [ "$state" = RUNNING ] || die "stacks: job $job is not running (state: ${state:-unknown to squeue})"
  nodelist=$(squeue -h -j "$job" -o %N)
  local node found=0 out
  for node in $(scontrol show hostnames "$nodelist"); do
    # An extra step inside the job (--overlap shares the job's resources) on that node. Processes are
    # picked by their environment, so only this job's ranks on this node are attached to, even where
    # several jobs or (as on the dev cluster) several nodes share one host.
    out=$(srun --overlap --jobid "$job" -w "$node" -N1 -n1 --mpi=none bash -s "$job" "$node" "$program" <<'SH'
job=$1 node=$2 program=$3
for pid in $(pgrep -x "$program"); do
  environ=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null) || continue
  grep -qx "SLURM_JOB_ID=$job" <<<"$environ" || continue
  grep -qx "SLURMD_NODENAME=$node" <<<"$environ" || continue
  rank=$(sed -n 's/^SLURM_PROCID=//p' <<<"$environ")
  echo "== job $job node $node rank ${rank:-?} pid $pid ($program)"
  timeout 60 gdb -p "$pid" -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 |
    grep -vE '^(\[New LWP|\[Thread debugging|Using host libthread_db|warning: )'
done
SH
    ) || echo "debug.sh: srun into job $job on $node failed" >&2
    [ -n "$out" ] && { echo "$out"; found=1; }
  done
  [ "$found" -eq 1 ] || { echo "debug.sh: no '$program' process of job $job on $nodelist" >&2; exit 1; }
}

[ $# -ge 1 ] || { usage >&2; exit 64; }
sub=$1
shift
case $sub in
  step) cmd_step "$@" ;;
  stacks) cmd_stacks "$@" ;;
  env) cmd_env "$@" ;;
  shell) cmd_shell "$@" ;;
  -h | --help | help) usage ;;
  *) die "unknown subcommand '$sub' (step, stacks, env, shell; see --help)" ;;
esac
