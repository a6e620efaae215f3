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
# (~2 minutes of BeginTime) before it may start again. Forge jobs carry their run summary in the Comment
# ("forge:{...}"): make them eligible at once. The hook may run before slurmctld has finished the
# requeue, so a detached watcher asks for up to a minute and releases the job two seconds after it is
# pending (slurmd refuses a launch whose credential is from the second of the requeue that revoked the old
# one), or gives up as soon as the job has ended for good or runs again. Other jobs keep Slurm's delay. An
# elastic job also gets its node range back (see below).
release_requeued() {
  local info
  info=$(scontrol show job -o "${SLURM_JOB_ID:-none}" 2>/dev/null) || return 0
  [[ $info == *"Comment=forge:"* ]] || return 0
  # shellcheck disable=SC2016  # the watcher expands its own variables
  setsid bash -c '
    for _ in $(seq 1 60); do
      info=$(scontrol show job -o "$0" 2>/dev/null) || exit 0
      case $info in
        *"JobState=PENDING"*"Reason=BeginTime"*)
          # An elastic job (job_submit.lua kept its node range in AdminComment): Slurm pinned its node and
          # task counts at the last allocation; give it back the range, with the tasks of its minimum.
          range=$(sed -n "s/.*AdminComment=forge-elastic:nodes=\([0-9]*\)-\([0-9]*\).*/\1 \2/p" <<<"$info")
          per_node=$(sed -n "s/.*NtasksPerN:B:S:C=\([0-9]*\):.*/\1/p" <<<"$info")
          if [ -n "$range" ] && [ "${per_node:-0}" -gt 0 ]; then
            read -r lo hi <<<"$range"
            scontrol update JobId="$0" NumNodes="$lo-$hi" NumTasks=$((lo * per_node)) >/dev/null 2>&1 &&
              echo "elastic forge job $0: node range $lo-$hi restored"
          fi
          sleep 2
          scontrol update JobId="$0" StartTime=now >/dev/null 2>&1 && echo "released requeued forge job $0"
          exit 0 ;;
        *"JobState=COMPLETED"* | *"JobState=FAILED"* | *"JobState=CANCELLED"* | *"JobState=TIMEOUT"* | \
        *"JobState=RUNNING"*) exit 0 ;;
      esac
      sleep 1
    done' "$SLURM_JOB_ID" </dev/null >>"$log" 2>&1 &
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
