#!/usr/bin/env bash
# scripts/sbatch/debug.sh on the dev cluster, non-interactively:
#   env    — through salloc on 2 nodes x 2 tasks: every rank prints its own SLURM_PROCID/PMIX_RANK
#   stacks — against a batch job whose ranks sleep: a gdb backtrace from each rank on each node
#   step   — one training step of configs/tiny.ini (needs forge-train in FORGE_BUILD_DIR)
#   bad input — usage errors exit 64 and name the problem
# Exit 0 = pass; one "FAIL: ..." line per failed check. Needs scripts/devcluster/up.
set -uo pipefail

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
DEBUG=$SRC/scripts/sbatch/debug.sh
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ -r "$STATE/env.sh" ] || { echo "FAIL: $STATE/env.sh missing: start the cluster with scripts/devcluster/up"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh"
scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "FAIL: slurmctld not answering (scripts/devcluster/status)"; exit 1; }
unset SLURM_JOB_ID SLURM_JOBID   # ctest may itself run inside an allocation: debug.sh must make its own

WORK=$(mktemp -d /var/tmp/forge-debug-test.XXXXXX)
chmod 755 "$WORK"
job=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
cd "$WORK" || exit 1

# --- env: per-rank dump, grouped by rank -------------------------------------------------------------
out=$(timeout 60 "$DEBUG" env -N2 --ntasks-per-node=2 -t 2 -J forge-debug-env 2>"$WORK/env.err")
rc=$?
[ $rc -eq 0 ] || { fail "debug.sh env exited $rc"; sed 's/^/    /' "$WORK/env.err"; }
for r in 0 1 2 3; do
  grep -qE "^ *$r: == rank $r on node[12] " <<<"$out" || fail "env: no header for rank $r"
  grep -qE "^ *$r: SLURM_PROCID=$r\$" <<<"$out" || fail "env: rank $r lacks SLURM_PROCID=$r"
  grep -qE "^ *$r: PMIX_RANK=$r\$" <<<"$out" || fail "env: rank $r lacks PMIX_RANK=$r (srun --mpi=pmix)"
  grep -qE "^ *$r: OMPI_MCA_btl_tcp_if_include=lo\$" <<<"$out" || fail "env: rank $r lacks the OMPI_* settings"
done
[ "$(grep -oE 'SLURM_JOB_ID=[0-9]+' <<<"$out" | sort -u | wc -l)" -eq 1 ] ||
  fail "env: the ranks disagree on SLURM_JOB_ID (or print none)"
# Grouped: rank 0's lines all come before rank 1's, and so on.
order=$(grep -oE '^ *[0-9]+:' <<<"$out" | tr -d ' :' | uniq | tr '\n' ' ')
[ "$order" = "0 1 2 3 " ] || fail "env: output not grouped by rank (rank order seen: $order)"

# --- stacks: a job whose ranks hang (sleep) ---------------------------------------------------------
job=$(sbatch --parsable -N2 --ntasks-per-node=1 -t 2 -J forge-debug-hang -o "$WORK/hang.out" \
  --wrap 'srun --mpi=none sleep 300')
if [ -z "$job" ]; then
  fail "stacks: sbatch of the sleeping job failed"
else
  # Wait for the ranks themselves (both sleep processes started), not only the batch shell or the step
  # record: on a loaded machine srun may still be launching them.
  for _ in $(seq 1 120); do
    squeue -h -s -j "$job" -o %i 2>/dev/null | grep -q "^$job\.0\$" &&
      [ "$(pgrep -c -f '^[^ ]*sleep 300$')" -ge 2 ] && break
    sleep 0.5
  done
  out=$(timeout 120 "$DEBUG" stacks "$job" --program sleep 2>"$WORK/stacks.err")
  rc=$?
  [ $rc -eq 0 ] || { fail "debug.sh stacks exited $rc"; sed 's/^/    /' "$WORK/stacks.err"; }
  for r in 0 1; do
    grep -qE "^== job $job node node[12] rank $r pid [0-9]+ \(sleep\)" <<<"$out" || fail "stacks: no section for rank $r"
  done
  [ "$(grep -cE '^#0 .*nanosleep' <<<"$out")" -eq 2 ] ||
    fail "stacks: expected one backtrace ending in nanosleep per rank; got: $(head -c 600 <<<"$out")"
  # Attaching must not disturb the job: it is still running afterwards.
  [ "$(squeue -h -j "$job" -o %T)" = RUNNING ] || fail "stacks: the job did not survive gdb attaching"
  # Only the named job's processes: another program name finds nothing and says so.
  "$DEBUG" stacks "$job" --program forge-train-absent >/dev/null 2>"$WORK/none.err"
  rc=$?
  [ $rc -eq 1 ] && grep -q "no 'forge-train-absent' process of job $job" "$WORK/none.err" ||
    fail "stacks --program absent: want exit 1 and a 'no process' line, got $rc: $(cat "$WORK/none.err")"
  scancel "$job"
  for _ in $(seq 1 40); do
    [ -z "$(squeue -h -j "$job" -o %T 2>/dev/null)" ] && break
    sleep 0.5
  done
  job=""
fi

# --- step: one training step on the spec's layout ---------------------------------------------------
train=${FORGE_BUILD_DIR:-$SRC/build/release}/launcher/forge-train
if [ -x "$train" ]; then
  cp "$SRC/configs/tiny.ini" "$WORK/tiny.ini"
  out=$(FORGE_DEBUG_DIR=$WORK timeout 120 "$DEBUG" step "$WORK/tiny.ini" --layout tp1,pp1,dp1 \
    --model.layers=1 2>"$WORK/step.err")
  rc=$?
  [ $rc -eq 0 ] || { fail "debug.sh step exited $rc"; tail -n 20 "$WORK/step.err" | sed 's/^/    /'; }
  grep -q "forge-train exit 0 (ok)" <<<"$out" || fail "step: no 'forge-train exit 0 (ok)' line"
  grep -qE '^  \{.*"step": ?1[,}]' <<<"$out" || fail "step: the metrics line of step 1 is missing"
  grep -q '"step": *2[,}]' <<<"$out" && fail "step: ran more than one step"
  grep -qE '^ *layers = 1$' <<<"$out" || fail "step: the resolved spec does not show the override model.layers = 1"
  ls -d "$WORK"/forge-debug-step.* >/dev/null 2>&1 && fail "step: the scratch run directory was left behind"
  # A bad override is the spec's usage error, reported with its class.
  out=$(FORGE_DEBUG_DIR=$WORK timeout 60 "$DEBUG" step "$WORK/tiny.ini" --layout tp1,pp1,dp1 \
    --model.layers=0 2>&1)
  rc=$?
  [ $rc -eq 64 ] || fail "step with model.layers=0: want exit 64, got $rc"
  grep -q "model.layers" <<<"$out" || fail "step with model.layers=0: the error does not name model.layers"
else
  echo "note: $train not built: step not tested"
fi

# --- bad input ----------------------------------------------------------------------------------------
check_usage() {   # check_usage WANT_TEXT ARGS...
  local want=$1 err rc
  shift
  err=$("$DEBUG" "$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 64 ] && grep -q -- "$want" <<<"$err" || fail "debug.sh $*: want exit 64 and '$want', got $rc: $err"
}
check_usage "unknown subcommand 'frobnicate'" frobnicate
check_usage "JOBID must be a number" stacks abc
check_usage "is not running" stacks 999999999
check_usage "need SPEC.ini" step
check_usage "no such file" step "$WORK/absent.ini"
check_usage "'2x2' is not a layout: unknown part" step "$SRC/configs/tiny.ini" --layout 2x2

if [ $fails -eq 0 ]; then
  echo "PASS: debug.sh env (4 ranks, 2 nodes), stacks (2 ranks, gdb), step, usage errors"
  exit 0
fi
exit 1
