#!/usr/bin/env bash
# Slurm integration smoke test for the dev cluster (scripts/devcluster): a 2-node, 16-GPU batch job
# runs 4 Open MPI ranks with `srun --mpi=pmix`, every rank checks an MPI_Allreduce, and accounting
# records the job COMPLETED with gres/gpu=16.
#   usage: test/slurm/cluster_smoke.sh [MPI_PROGRAM]
# MPI_PROGRAM (optional) must print "rank=R size=S node=N sum=X" per rank, X = sum of (rank+1).
# Exit 0 = pass; otherwise one "FAIL: ..." line per failed check. Needs a running cluster
# (scripts/devcluster/up); FORGE_DEVCLUSTER_DIR selects it (default /var/lib/forge-devcluster).
set -uo pipefail

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ -r "$STATE/env.sh" ] || { echo "FAIL: $STATE/env.sh missing: start the cluster with scripts/devcluster/up"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh"
scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "FAIL: slurmctld not answering (scripts/devcluster/status)"; exit 1; }

# The controller and the accounting daemon run as a site runs them: as SlurmUser, not root.
slurm_user=$(scontrol show config | sed -n 's/^SlurmUser *= *\([^(]*\)(.*/\1/p')
[ -n "$slurm_user" ] && [ "$slurm_user" != root ] || fail "SlurmUser is '${slurm_user}', expected a user other than root"
for d in slurmctld slurmdbd; do
  pid=$(cat "$STATE/run/$d.pid" 2>/dev/null)
  owner=$(ps -o user= -p "${pid:-0}" 2>/dev/null)
  [ -n "$owner" ] && [ "$owner" = "$slurm_user" ] || fail "$d (pid ${pid:-?}) runs as '${owner}', expected $slurm_user"
done

# Job files must be readable from the job: a shared directory (each job has its own /tmp); removed at exit.
WORK=$(mktemp -d /var/tmp/forge-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"

if [ $# -ge 1 ]; then
  PROG=$(readlink -f "$1")
  [ -x "$PROG" ] || { echo "FAIL: $1 is not an executable"; exit 1; }
else
  command -v mpicc >/dev/null || { echo "FAIL: mpicc not found (scripts/install-deps.sh)"; exit 1; }
  cat >"$WORK/allreduce.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const char *node = getenv("SLURMD_NODENAME");
  printf("rank=%d size=%d node=%s sum=%ld\n", rank, size, node ? node : "?", sum);
  MPI_Finalize();
  return sum == (long)size * (size + 1) / 2 ? 0 : 1;
}
C
  mpicc -O1 -o "$WORK/allreduce" "$WORK/allreduce.c" || { echo "FAIL: mpicc could not build the test program"; exit 1; }
  PROG=$WORK/allreduce
fi

NTASKS=4
cat >"$WORK/job.sbatch" <<EOF
#!/bin/bash
srun --mpi=pmix -n $NTASKS --ntasks-per-node=2 "$PROG"
EOF

# --wait: sbatch returns when the job ends, with the job's exit code. -w pins the two nodes of
# switch s1, so "ranks ran on node1 and node2" is a real check of the placement.
# The bound covers waiting for node1/node2 to be free when other tests hold them.
WAIT_S=${FORGE_SMOKE_TIMEOUT:-240}
out=$(cd "$WORK" && timeout "$WAIT_S" sbatch --parsable --wait -N2 --ntasks-per-node=2 -w node1,node2 \
        --gres=gpu:8 -t 5 -J forge-smoke -o "$WORK/job.out" "$WORK/job.sbatch" 2>&1)
rc=$?
jobid=$(grep -Eo '^[0-9]+' <<<"$out" | head -n1)
[ -n "$jobid" ] || { echo "FAIL: sbatch did not submit: $out"; exit 1; }
if [ $rc -eq 124 ]; then
  state=$(squeue -h -j "$jobid" -o '%T %R' 2>/dev/null)
  scancel "$jobid" 2>/dev/null
  echo "FAIL: job $jobid did not finish within ${WAIT_S}s (now cancelled; it was: ${state:-?})"
  exit 1
fi
if [ $rc -ne 0 ]; then
  fail "job $jobid exited with $rc; its output:"
  sed 's/^/    /' "$WORK/job.out"
fi

# Every rank: right size and sum; ranks spread over node1 and node2 (2 each).
want_sum=$((NTASKS * (NTASKS + 1) / 2))
for ((r = 0; r < NTASKS; r++)); do
  line=$(grep -E "^rank=$r " "$WORK/job.out" | head -n1)
  if [ -z "$line" ]; then fail "rank $r printed nothing"; continue; fi
  grep -q "size=$NTASKS " <<<"$line" || fail "rank $r: wrong size: $line"
  grep -q "sum=$want_sum\$" <<<"$line" || fail "rank $r: allreduce sum wrong (want $want_sum): $line"
done
nodes=$(grep -Eo 'node=[^ ]+' "$WORK/job.out" | sort | uniq -c | awk '{print $2 ":" $1}' | tr '\n' ' ')
[ "$nodes" = "node=node1:2 node=node2:2 " ] || fail "ranks should run 2 on node1 and 2 on node2, got: ${nodes:-none}"

# Accounting lags the job end by a few seconds (slurmctld -> slurmdbd is asynchronous).
acct=""
for ((i = 0; i < 60; i++)); do
  acct=$(sacct -X -P -n -j "$jobid" -o State,AllocTRES 2>/dev/null | head -n1)
  [[ $acct == COMPLETED\|*gres/gpu=16* ]] && break
  [[ $acct =~ ^(FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) ]] && break   # final, no use waiting
  sleep 0.5
done
[[ $acct == COMPLETED\|* ]] || fail "sacct: job $jobid state is not COMPLETED after 30s: '${acct:-no record}'"
[[ $acct == *gres/gpu=16* ]] || fail "sacct: job $jobid AllocTRES lacks gres/gpu=16: '${acct:-no record}'"

if [ $fails -eq 0 ]; then
  echo "PASS: job $jobid: $NTASKS ranks on node1+node2 (pmix), allreduce ok, sacct: $acct"
  exit 0
fi
exit 1
