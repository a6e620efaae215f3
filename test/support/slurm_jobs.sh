# shellcheck shell=bash
# Helpers for tests that follow real Slurm jobs through requeues (sourced).

# wait_requeued_job JOB [NODE]: waits (up to 4 minutes) for JOB to end and prints its final state. Slurm holds
# a requeued job back for about two minutes; a test need not wait that long, so it is released early, but
# not at once: slurmd refuses a launch whose credential is from the same second as the requeue that
# revoked the old one ("Job credential revoked", the job ends FAILED), and a loaded node (NODE, when
# given) may still be cleaning up the old instance. So release it once the node is done and a few seconds
# have passed.
wait_requeued_job() {
  local job=$1 node=${2:-} state="" queued pending_since=0
  for _ in $(seq 1 240); do
    state=$(sacct -n -X -P -j "$job" -o State 2>/dev/null | tail -n1)
    [ "$state" = COMPLETED ] && break
    queued=$(squeue -h -j "$job" -o %T)
    if [ -z "$queued" ]; then
      case $state in FAILED | CANCELLED* | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    fi
    if [ "$queued" = PENDING ] && scontrol show job "$job" | grep -q 'Restarts=[1-9]' &&
      { [ -z "$node" ] || ! scontrol show node "$node" | grep -q 'State=[A-Z+]*COMPLETING'; }; then
      [ $pending_since -eq 0 ] && pending_since=$SECONDS
      [ $((SECONDS - pending_since)) -ge 3 ] && scontrol update JobId="$job" StartTime=now 2>/dev/null
    fi
    sleep 1
  done
  echo "$state"
}
