#!/usr/bin/env bash
# forge-health against the dev cluster, on node4: a flipped fake GPU drains the node with forge-health's
# reason and flipping it back resumes it; an administrator's drain is never resumed; a configuration with
# an unknown check warns once and does not drain; `drain` sanitizes its detail; the Prolog keeps
# forge-health's reason and its job does not run there; the Epilog runs the deep check after a failed job;
# the periodic HealthCheckProgram drains and resumes on its own. node4 is left resumed and healthy.
#   usage: test/health/health_cluster_test.sh FORGE_HEALTH
# Exit 0 = pass; otherwise one "FAIL: ..." line per failed check.
set -uo pipefail

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
NODE=node4
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ $# -eq 1 ] && [ -x "$1" ] || { echo "FAIL: usage: $0 FORGE_HEALTH (the built binary)"; exit 1; }
FH=$(readlink -f "$1")
[ -r "$STATE/env.sh" ] || { echo "FAIL: $STATE/env.sh missing: start the cluster with scripts/devcluster/up"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh"
scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "FAIL: slurmctld not answering (scripts/devcluster/status)"; exit 1; }
CONFIG=$STATE/etc/health.ini
GPUS=$STATE/gpu-health/$NODE
HLOG=$STATE/log/forge-health.log
[ -f "$CONFIG" ] && [ -d "$GPUS" ] ||
  { echo "FAIL: forge-health is not wired into the cluster ($CONFIG, $GPUS): rerun scripts/devcluster/up after building forge-health"; exit 1; }
INTERVAL=$(scontrol show config | awk -F' = ' '/^HealthCheckInterval/ {print $2+0}')

reason() { sinfo -h -n "$NODE" -o '%E'; }
drained() { scontrol show node -o "$NODE" | grep -q 'State=[A-Z+]*DRAIN'; }
wait_for() {   # wait_for SECONDS CMD...: until CMD succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 1; done
}
not_drained() { ! drained; }  # for wait_for
flip() { echo "$2" >"$GPUS/gpu$1"; }
heal() { local g; for g in "$GPUS"/gpu*; do echo ok >"$g"; done; }

WORK=$(mktemp -d /var/tmp/forge-health-test.XXXXXX)
chmod 755 "$WORK"
JOBS=()
set_by_us=0
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  heal
  [ ${#JOBS[@]} -eq 0 ] || scancel "${JOBS[@]}" 2>/dev/null
  local r; r=$(reason)
  if drained && { [[ $r == forge-health:* ]] || { [ "$set_by_us" = 1 ] && [ "$r" = maintenance ]; }; }; then
    scontrol update NodeName="$NODE" State=RESUME
  fi
  drained && echo "FAIL: $NODE left drained ($(reason))"
  rm -rf "$WORK"
}
trap cleanup EXIT

if drained; then
  echo "FAIL: $NODE is drained before the test ($(reason)); not touching it"
  trap - EXIT; rm -rf "$WORK"; exit 1
fi
heal

# 1. healthy: exit 0, nothing drained
out=$("$FH" check --node "$NODE" --config "$CONFIG" 2>&1) || fail "healthy $NODE: exit $? ($out)"
[[ $out == *"$NODE: healthy (quick"* ]] || fail "healthy $NODE: summary: $out"
drained && fail "healthy $NODE drained: $(reason)"

# 2. a flipped fake GPU: exit 1, drained with the reason
flip 3 "xid 79: GPU has fallen off the bus"
out=$("$FH" check --node "$NODE" --config "$CONFIG" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "flipped gpu3: exit $rc, expected 1 ($out)"
[[ $out == *"FAIL gpu: gpu3: xid 79: GPU has fallen off the bus"* ]] || fail "flipped gpu3: no FAIL line: $out"
want="forge-health: gpu: gpu3: xid 79: GPU has fallen off the bus"
[ "$(reason)" = "$want" ] || fail "flipped gpu3: reason '$(reason)', expected '$want'"
drained || fail "flipped gpu3: $NODE not drained"

# 3. flipped back: healthy, resumed (by this check or the periodic one, whichever came first)
heal
out=$("$FH" check --node "$NODE" --config "$CONFIG" 2>&1) || fail "healed: exit $? ($out)"
drained && fail "healed: $NODE still drained ($(reason))"

# 4. an administrator's drain is never resumed, whether the node is healthy or not
scontrol update NodeName="$NODE" State=DRAIN Reason=maintenance && set_by_us=1
"$FH" check --node "$NODE" --config "$CONFIG" >/dev/null 2>&1 || fail "admin drain: healthy check exit $?"
out=$("$FH" resume --node "$NODE" --config "$CONFIG" 2>&1) && fail "admin drain: resume exit 0 ($out)"
flip 1 "ecc: 2 uncorrectable"
"$FH" check --node "$NODE" --config "$CONFIG" >/dev/null 2>&1
heal
"$FH" check --node "$NODE" --config "$CONFIG" --mode periodic >/dev/null 2>&1
if [ "$(reason)" != maintenance ] || ! drained; then fail "admin drain: now '$(reason)', expected drained for 'maintenance'"; fi
scontrol update NodeName="$NODE" State=RESUME && set_by_us=0

# 5. a configuration naming an unknown check: one warning line, exit 0, no drain
sed 's/^quick = .*/quick = gpu, no_such_check, memory/' "$CONFIG" >"$WORK/unknown.ini"
"$FH" check --node "$NODE" --config "$WORK/unknown.ini" >"$WORK/out" 2>"$WORK/err" || fail "unknown check: exit $? ($(cat "$WORK/err"))"
if [ "$(grep -c . "$WORK/err")" != 1 ] ||
  ! grep -q "warning: .*unknown.ini:[0-9]*: modes.quick: unknown check 'no_such_check' ignored" "$WORK/err"; then
  fail "unknown check: expected one warning line, got: $(cat "$WORK/err")"
fi
drained && fail "unknown check: $NODE drained ($(reason))"

# 6. drain from a batch script: the detail comes from logs and is sanitized; resume only when healthy
"$FH" drain --node "$NODE" --check gpu --detail $'CUDA error: "illegal address"\nat rank 3; $(reboot) %s' >/dev/null ||
  fail "drain: exit $?"
want='forge-health: gpu: CUDA error: _illegal address_ at rank 3_ _(reboot) _s'
[ "$(reason)" = "$want" ] || fail "drain: reason '$(reason)', expected '$want'"
flip 0 "xid 48: DBE"
"$FH" resume --node "$NODE" --config "$CONFIG" >/dev/null 2>&1 && fail "resume of an unhealthy node: exit 0"
drained || fail "resume of an unhealthy node resumed it"
heal
"$FH" resume --node "$NODE" --config "$CONFIG" >/dev/null 2>&1 || fail "resume of a healthy node: exit $?"
drained && fail "resume: $NODE still drained ($(reason))"

# 7. the Prolog: a job on a node with a bad GPU does not run there, and the reason stays forge-health's
#    (not Slurm's "Prolog error"; the periodic check may get there first, with the same reason)
flip 6 "xid 79: GPU has fallen off the bus"
job=$(sbatch --parsable -p eval -w "$NODE" -t 2 -o /dev/null -J health-prolog --wrap "touch $WORK/ran") && JOBS+=("$job")
wait_for 60 drained || fail "prolog: $NODE not drained within 60 s"
[ "$(reason)" = "forge-health: gpu: gpu6: xid 79: GPU has fallen off the bus" ] || fail "prolog: reason '$(reason)'"
sleep 2
[ -e "$WORK/ran" ] && fail "prolog: the job ran on the unhealthy $NODE"
grep -q "$NODE prolog job=$job: rc=1" "$HLOG" 2>/dev/null && echo "prolog: job $job refused by the Prolog on $NODE"
scancel "$job" 2>/dev/null
heal
"$FH" check --node "$NODE" --config "$CONFIG" >/dev/null 2>&1 || fail "after prolog: check exit $?"
drained && fail "after prolog: $NODE still drained ($(reason))"

# 8. the Epilog: a failed job gets the deep check
job=$(sbatch --parsable --wait -p eval -w "$NODE" -t 2 -o /dev/null -J health-epilog --wrap 'exit 3' 2>/dev/null; true)
job=${job%%[^0-9]*}
if [ -z "$job" ]; then fail "epilog: sbatch failed"; else
  wait_for 20 grep -q "$NODE epilog job=$job: rc=0 .*healthy (deep" "$HLOG" || fail "epilog: no deep check for failed job $job in $HLOG"
fi
drained && fail "epilog: healthy $NODE drained ($(reason))"

# 9. the periodic HealthCheckProgram drains on its own, and resumes its own drain once healthy
if [ -z "$INTERVAL" ] || [ "$INTERVAL" = 0 ]; then
  fail "HealthCheckInterval is not set: forge-health's HealthCheckProgram is not wired (scripts/devcluster/up)"
else
  limit=$((2 * INTERVAL + 15))
  flip 5 "xid 79: GPU has fallen off the bus"
  t0=$SECONDS
  if wait_for "$limit" drained; then
    echo "periodic: drained after $((SECONDS - t0)) s (HealthCheckInterval=$INTERVAL)"
    [ "$(reason)" = "forge-health: gpu: gpu5: xid 79: GPU has fallen off the bus" ] || fail "periodic: reason '$(reason)'"
    heal
    t0=$SECONDS
    if wait_for "$limit" not_drained; then
      echo "periodic: resumed after $((SECONDS - t0)) s"
    else
      fail "periodic: $NODE not resumed within $limit s of healing ($(reason))"
    fi
  else
    fail "periodic: $NODE not drained within $limit s"
  fi
fi

[ $fails -eq 0 ] && echo "PASS: forge-health on the dev cluster ($NODE)"
exit $((fails > 0))
