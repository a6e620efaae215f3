# shellcheck shell=bash
# Shared by the Slurm integration tests of quota/ and spank_plugin/: the dev cluster's environment, the
# plugstack.conf it runs with, and small job helpers. Source it; it sets FORGE_QUOTA, POLICY, SNAPSHOT,
# LEDGER, WORK (a scratch dir under the cluster's state dir, removed at exit).
set -u
fail() { echo "FAIL: $*" >&2; exit 1; }

FORGE_QUOTA=${1:?usage: $0 FORGE_QUOTA_BINARY}
STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
[ -f "$STATE/env.sh" ] || fail "no dev cluster at $STATE (run scripts/devcluster/up)"
# shellcheck source=/dev/null
source "$STATE/env.sh"
timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP' || fail "slurmctld of $STATE is not up (scripts/devcluster/up)"

plugstack=$(timeout 15 scontrol show config | awk '$1 == "PlugStackConfig" {print $3}')
forge_line=$(grep -h 'forge_spank\.so' "$plugstack" 2>/dev/null | grep -v '^[[:space:]]*#' | head -n1)
[ -n "$forge_line" ] ||
  fail "the dev cluster's PlugStackConfig ($plugstack) does not load forge_spank.so: start it with FORGE_SPANK_PLUGSTACK (scripts/slurm/write-plugstack.sh BUILD_DIR OUT)"
POLICY=$(sed -n 's/.*policy=\([^[:space:]]*\).*/\1/p' <<<"$forge_line")
SNAPSHOT=$(sed -n 's/.*snapshot=\([^[:space:]]*\).*/\1/p' <<<"$forge_line")
[ -n "$SNAPSHOT" ] || SNAPSHOT=/var/lib/forge-quota/usage.json
LEDGER=$STATE/forge-quota/ledger.db
[ -f "$POLICY" ] || fail "policy $POLICY named in $plugstack does not exist"
grep -q "^JobSubmitPlugins=lua" "$SLURM_CONF" || fail "job_submit.lua is not enabled in $SLURM_CONF"

WORK=$(mktemp -d "$STATE/forge-test.XXXXXX")
[ -n "$WORK" ] && [ -d "$WORK" ] || fail "cannot make a scratch directory under $STATE"
chmod 0755 "$WORK"
cleanup_jobs=()
cleanup() {
  [ ${#cleanup_jobs[@]} -eq 0 ] || scancel "${cleanup_jobs[@]}" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

quota_sync() {
  "$FORGE_QUOTA" sync --policy "$POLICY" --ledger "$LEDGER" --snapshot "$SNAPSHOT" >"$WORK/sync.out" 2>&1 ||
    fail "forge-quota sync failed: $(cat "$WORK/sync.out")"
}

# job_state JOBID: the job's state (squeue while it is known to slurmctld, then sacct).
job_state() {
  local s
  s=$(squeue -h -j "$1" -o %T 2>/dev/null)
  [ -n "$s" ] || s=$(sacct -n -X -P -j "$1" -o State 2>/dev/null | tail -n1 | cut -d' ' -f1)
  echo "$s"
}

# wait_done JOBID [SECONDS]: until the job has ended; prints its final state.
wait_done() {
  local deadline=$((SECONDS + ${2:-60})) s
  while :; do
    s=$(job_state "$1")
    case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL)
      echo "$s"; return 0 ;;
    esac
    [ $SECONDS -lt $deadline ] || { echo "TIMEOUT_WAITING($s)"; return 1; }
    sleep 0.5
  done
}

# No node may be drained (or down) by anything the tests did.
check_no_drain() {
  local bad
  bad=$(sinfo -h -N -o '%N %T %E' | grep -Ei 'drain|down|fail' || true)
  [ -z "$bad" ] || fail "nodes drained or down after $1: $bad"
}
