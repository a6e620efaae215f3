#!/usr/bin/env bash
# What forge_spank.so adds to sbatch: the same submission with and without the plugin, interleaved in one
# run against the running dev cluster. "Without" is the same client with a private slurm.conf whose
# PlugStackConfig is empty (the server side is identical). Submissions are --test-only, so no job is
# created and only the client path (plugin load, policy parse, snapshot read, decision) differs.
# Usage: bench/spank_overhead.sh [N]      (default 50 submissions each)
set -euo pipefail
N=${1:-50}
STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
# shellcheck source=/dev/null
source "$STATE/env.sh"
plugstack=$(scontrol show config | awk '$1 == "PlugStackConfig" {print $3}')
grep -q forge_spank.so "$plugstack" 2>/dev/null ||
  { echo "spank_overhead: the dev cluster does not load forge_spank.so (FORGE_SPANK_PLUGSTACK)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/plugstack.conf"
sed "s|^PlugStackConfig=.*|PlugStackConfig=$tmp/plugstack.conf|" "$SLURM_CONF" >"$tmp/slurm.conf"
common=(--test-only -N1 --gpus-per-node=8 -o /dev/null --wrap true)
with_plugin() { sbatch --train-team=team-a --train-tier=explore --train-layout=tp2,pp1,dp4 "${common[@]}"; }
without_plugin() { SLURM_CONF=$tmp/slurm.conf sbatch "${common[@]}"; }

# Both must be accepted, or the comparison is of different work.
with_plugin >/dev/null 2>&1 || { echo "spank_overhead: the plugin rejects the benchmark job" >&2; exit 1; }
without_plugin >/dev/null 2>&1 || { echo "spank_overhead: sbatch without the plugin fails" >&2; exit 1; }

# Wall time, and CPU time (user+sys of sbatch: less sensitive to other load on the machine), per call.
TIMEFORMAT='%3R %3U %3S'
run() { { time "$@" >/dev/null 2>&1; } 2>&1 | awk '{printf "%d %d\n", $1 * 1000000, ($2 + $3) * 1000000}'; }
for ((i = 0; i < N; i++)); do
  run without_plugin >>"$tmp/without"
  run with_plugin >>"$tmp/with"
done
# stats FILE COLUMN: median / mean / p90 in ms
stats() {
  cut -d' ' -f"$2" "$1" | sort -n |
    awk '{v[NR] = $1; s += $1} END {printf "%.1f %.1f %.1f", v[int((NR + 1) / 2)] / 1000, s / NR / 1000, v[int(NR * 0.9)] / 1000}'
}
read -r wo_med wo_mean wo_p90 <<<"$(stats "$tmp/without" 1)"
read -r w_med w_mean w_p90 <<<"$(stats "$tmp/with" 1)"
read -r wo_cpu _ _ <<<"$(stats "$tmp/without" 2)"
read -r w_cpu _ _ <<<"$(stats "$tmp/with" 2)"
echo "sbatch --test-only, $N each, interleaved; load average $(cut -d' ' -f1 /proc/loadavg)"
echo "  wall ms (median / mean / p90)  without forge_spank.so: $wo_med / $wo_mean / $wo_p90"
echo "                                 with forge_spank.so:    $w_med / $w_mean / $w_p90"
echo "  cpu ms (median user+sys)       without: $wo_cpu   with: $w_cpu"
awk -v a="$w_med" -v b="$wo_med" -v c="$w_mean" -v d="$wo_mean" -v e="$w_cpu" -v f="$wo_cpu" 'BEGIN {
  printf "  overhead: wall median %+.1f ms, wall mean %+.1f ms, cpu median %+.1f ms; ratio with/without (wall median) %.3f; budget 20 ms\n", a - b, c - d, e - f, a / b }'

# The controller's part of "with": job_submit.lua runs the policy's checker (`forge-quota admit`: policy
# parse, membership, pool, approval rules, a ledger read) once per training job, inside slurmctld.
policy=$(sed -n 's/.*policy=\([^[:space:]]*\).*/\1/p' "$plugstack")
checker=$(sed -n 's/^checker *= *//p' "$policy" 2>/dev/null)
if [ -n "$checker" ] && [ -x "$checker" ]; then
  for ((i = 0; i < N; i++)); do
    run "$checker" admit --uid 0 --team team-a --tier explore --gpus 8 --minutes 60 >>"$tmp/admit"
  done
  read -r ad_med ad_mean _ <<<"$(stats "$tmp/admit" 1)"
  echo "  of which the controller's checker ($checker admit, run $N times directly): wall median $ad_med ms, mean $ad_mean ms"
fi

# scontrol update of a training job (job_submit.lua's slurm_job_modify), as its owner (alice, who the dev
# cluster creates; root and the policy's admins pass unchecked): a change admission does not depend on (the
# Comment: no rule, no checker), the time limit set to its current value (the rules and one checker run),
# and the same time change of a plain job (no rule) beside them.
if id -u alice >/dev/null 2>&1; then
  as_alice() { runuser -u alice -- env SLURM_CONF="$SLURM_CONF" "$@"; }
  train_job=$(as_alice sbatch --parsable -H --train-team=team-a --train-tier=explore --train-layout=tp2,pp1,dp4 \
    -N1 --gpus-per-node=8 -t 60 -o /dev/null -D /tmp --wrap true)
  plain_job=$(as_alice sbatch --parsable -H -t 60 -o /dev/null -D /tmp --wrap true)
  trap 'scancel "$train_job" "$plain_job" 2>/dev/null; rm -rf "$tmp"' EXIT
  for ((i = 0; i < N; i++)); do
    run as_alice scontrol update JobId="$train_job" Comment="bench $i" >>"$tmp/upd_comment"
    run as_alice scontrol update JobId="$train_job" TimeLimit=60 >>"$tmp/upd_time"
    run as_alice scontrol update JobId="$plain_job" TimeLimit=60 >>"$tmp/upd_plain"
  done
  read -r uc _ _ <<<"$(stats "$tmp/upd_comment" 1)"
  read -r ut _ _ <<<"$(stats "$tmp/upd_time" 1)"
  read -r up _ _ <<<"$(stats "$tmp/upd_plain" 1)"
  echo "scontrol update as the job's owner, $N each, wall median: training job Comment $uc ms; training job TimeLimit" \
    "$ut ms; plain job TimeLimit $up ms (the rules and one checker run: $(awk -v a="$ut" -v b="$up" 'BEGIN {printf "%+.1f", a - b}') ms)"
fi
