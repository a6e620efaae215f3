#!/usr/bin/env bash
# forge-train's Prometheus textfile (FORGE_PROMETHEUS_DIR): while the job runs, the node's first rank
# keeps forge_job_<job>_<node>.prom there; promtool (Debian's prometheus package) accepts it, it carries
# the job's labels and progress, and it is gone when the job ends. An unwritable directory costs one
# warning and the run completes.
# Usage: prometheus_test.sh FORGE_TRAIN SOURCE_DIR
set -uo pipefail
train=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v promtool >/dev/null || fail "promtool not found: scripts/install-deps.sh installs Debian's prometheus"
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"
common=(--run.threads=1 --run.peak_gflops=50 --model.layers=1 --model.d_model=32 --model.heads=2
  --model.seq_len=32 --model.vocab=128 --ckpt.recovery_every=2)
mkdir -p "$work/textfiles"
file=$work/textfiles/forge_job_4242_node7.prom

FORGE_PROMETHEUS_DIR=$work/textfiles SLURM_JOB_ID=4242 SLURMD_NODENAME=node7 SLURM_LOCALID=0 FORGE_TEAM=team-a \
  FORGE_TIER=pretrain "$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${common[@]}" --run.steps=100000 \
  2>"$work/a.log" &
pid=$!
for _ in $(seq 1 600); do [ -s "$file" ] && break; sleep 0.05; done
[ -s "$file" ] || { kill "$pid"; fail "no $file while the job runs ($(tail -n2 "$work/a.log"))"; }
wait_for_steps "$work/a" 4 600 0.05
cp "$file" "$work/seen.prom"
kill -USR1 "$pid"
wait "$pid"
[ ! -e "$file" ] || fail "the textfile outlived the job"
promtool check metrics <"$work/seen.prom" >"$work/promtool.out" 2>&1 ||
  fail "promtool rejects the textfile: $(cat "$work/promtool.out")"
labels='job_id="4242",team="team-a",tier="pretrain",layout="tp1,pp1,dp1",node="node7"'
for gauge in forge_job_step forge_job_loss forge_job_tokens_per_second forge_job_mfu \
  forge_job_last_checkpoint_age_seconds forge_job_ettr; do
  grep -q "^$gauge{$labels} [0-9.e+-]*$" "$work/seen.prom" || fail "no $gauge{$labels} sample: $(cat "$work/seen.prom")"
done
[ "$(sed -n 's/^forge_job_step{.*} //p' "$work/seen.prom")" -ge 1 ] || fail "the step gauge is not a step"
echo "ok: textfile while running, promtool-clean, labelled, removed at the end"

# Only the node's first rank writes; an unwritable directory: one warning, the run completes.
FORGE_PROMETHEUS_DIR=$work/textfiles SLURM_LOCALID=1 "$train" "$src/configs/tiny.ini" --run.dir="$work/b" \
  "${common[@]}" --run.steps=2 2>/dev/null || fail "run as local rank 1 failed"
[ -z "$(ls "$work/textfiles")" ] || fail "local rank 1 wrote a textfile: $(ls "$work/textfiles")"
echo "not a directory" >"$work/file"
FORGE_PROMETHEUS_DIR=$work/file "$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${common[@]}" --run.steps=3 \
  2>"$work/c.log" || fail "a run with an unwritable textfile directory failed: $(tail -n2 "$work/c.log")"
[ "$(grep -c "Prometheus" "$work/c.log")" -eq 1 ] || fail "want one Prometheus warning: $(grep Prometheus "$work/c.log")"
echo "PASS: Prometheus textfile"
