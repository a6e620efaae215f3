#!/usr/bin/env bash
# Slurm's node hooks -> forge-health (docs/HEALTH.md).
#   usage: health-hook.sh prolog|epilog|periodic|ctld-epilog
# Slurm runs Prolog, Epilog and HealthCheckProgram with almost no environment (no PATH; HealthCheckProgram
# gets SLURMD_NODENAME only) and no arguments, so a site points them at small launchers that set
# FORGE_HEALTH_BIN, FORGE_HEALTH_CONFIG, FORGE_HEALTH_LOG, SLURM_CONF and PATH, then exec this script
# (scripts/devcluster/up writes them into its etc/).
#
#   prolog    quick check. Exits 1 only when forge-health found the node unhealthy: forge-health has then
#             already drained it with "forge-health: <check>: <detail>", and Slurm's own drain for the
#             failed Prolog keeps an existing drain and its reason (drain_nodes is a no-op on a drained
#             node), while the job is requeued (SchedulerParameters=nohold_on_prolog_fail: not held).
#             Any other outcome (healthy, bad config, forge-health missing or broken) exits 0: a Prolog
#             failure drains the node, and a healthy node must never be drained by a hook.
#   epilog    deep check, only after a failed job (SLURM_JOB_EXIT_CODE / SLURM_JOB_DERIVED_EC non-zero).
#             Always exits 0: a failed Epilog would drain with Slurm's reason; forge-health drains itself.
#   periodic  periodic check (HealthCheckProgram); drains and resumes its own drains. Exits 0.
#   ctld-epilog  slurmctld's EpilogSlurmctld, at the end of every allocation: a requeued forge job is made
#             eligible at once (release_requeued). On the controller, not the nodes: a node's Epilog may
#             never run when the requeue came from another node's failure. Exits 0.
set -u
mode=${1:-}
bin=${FORGE_HEALTH_BIN:-}
node=${SLURMD_NODENAME:-}
log=${FORGE_HEALTH_LOG:-/dev/null}

note() { printf '%s %s %s job=%s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$node" "$mode" "${SLURM_JOB_ID:--}" "$*" >>"$log" 2>/dev/null; }

# A job the forge batch scripts (or Slurm, for a failed node) requeued would wait for Slurm's requeue delay
# (~2 minutes of BeginTime) before it may start again. Training jobs are made eligible at once: the hook
# knows them by the "forge-tier=T" word job_submit.lua writes into their AdminComment, read field-exact
# with squeue -O, never by anything in the Comment or the job name, which the job's owner writes (this
# hook acts as SlurmUser). The hook may run before slurmctld has finished the requeue, so a detached
# watcher asks for up to a minute and releases the job two seconds after it is pending (slurmd refuses a
# launch whose credential is from the second of the requeue that revoked the old one), or gives up as soon
# as the job has ended for good or runs again. Other jobs keep Slurm's delay. An elastic job also gets its
# node range back (see below).
admin_words() { squeue -h -j "$1" -O admin_comment:4096 2>/dev/null | tr -s ' ' '\n'; }
release_requeued() {
  local words
  words=$(admin_words "${SLURM_JOB_ID:-none}")
  grep -qE '^forge-tier=[A-Za-z0-9._-]+$' <<<"$words" || return 0
  # An elastic job (job_submit.lua kept its node range as "forge-elastic:nodes=A-B"): Slurm pinned its node
  # and task counts at the last allocation; give it back the range, with the tasks of its minimum.
  local range
  range=$(sed -n 's/^forge-elastic:nodes=\([0-9]\{1,5\}\)-\([0-9]\{1,5\}\)$/\1 \2/p' <<<"$words")
  # The watcher is the controller's, not the job's: without SLURM_JOB_ID in its environment, so that a node's
  # stale-process check (forge-health) does not take it for a leftover of the job.
  # shellcheck disable=SC2016  # the watcher expands its own variables
  setsid env -u SLURM_JOB_ID bash -c '
    for _ in $(seq 1 60); do
      state=$(squeue -h -j "$0" -o "%T %r" 2>/dev/null) || exit 0
      case $state in
        "PENDING BeginTime")
          per_node=$(squeue -h -j "$0" -O ntpernode:12 2>/dev/null | tr -d " ")
          if [ -n "$1" ] && [[ $per_node =~ ^[0-9]+$ ]] && [ "$per_node" -gt 0 ]; then
            read -r lo hi <<<"$1"
            scontrol update JobId="$0" NumNodes="$lo-$hi" NumTasks=$((lo * per_node)) >/dev/null 2>&1 &&
              echo "elastic forge job $0: node range $lo-$hi restored"
          fi
          sleep 2
          scontrol update JobId="$0" StartTime=now >/dev/null 2>&1 && echo "released requeued forge job $0"
          exit 0 ;;
        "" | COMPLETED* | FAILED* | CANCELLED* | TIMEOUT* | RUNNING*) exit 0 ;;
      esac
      sleep 1
    done' "$SLURM_JOB_ID" "$range" </dev/null >>"$log" 2>&1 &
}

case $mode in
  prolog) check_mode=quick ;;
  periodic) check_mode=periodic ;;
  ctld-epilog) release_requeued; exit 0 ;;
  epilog)
    # wait() status and the highest step exit code: both 0 for a job that succeeded.
    if [ "${SLURM_JOB_EXIT_CODE:-0}" = 0 ] && [ "${SLURM_JOB_DERIVED_EC:-0}" = 0 ]; then exit 0; fi
    check_mode=deep ;;
  *) echo "usage: health-hook.sh prolog|epilog|periodic|ctld-epilog" >&2; exit 0 ;;
esac
[ -n "$node" ] || { note "no SLURMD_NODENAME: skipped"; exit 0; }
[ -x "$bin" ] || { note "no forge-health at '$bin': skipped"; exit 0; }

out=$("$bin" check --mode "$check_mode" --node "$node" 2>&1)
rc=$?
# Healthy runs leave no trace (the periodic check runs every HealthCheckInterval on every node).
if [ $rc -ne 0 ] || [ "$mode" = epilog ] || [[ $out == *warning* ]]; then
  while IFS= read -r line; do note "rc=$rc $line"; done <<<"$out"
fi
if [ "$mode" = prolog ] && [ $rc -eq 1 ]; then exit 1; fi
exit 0
