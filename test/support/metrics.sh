# shellcheck shell=bash
# Sourced by the shell tests that watch a forge-train run directory.

# wait_for_steps RUN_DIR N TRIES PAUSE: waits until rank 0 has written N metrics records (TRIES x PAUSE
# seconds at most); fails nothing itself, so the caller checks what it needs next.
wait_for_steps() {
  local metrics=$1/metrics/rank-0.jsonl
  for _ in $(seq 1 "$3"); do
    [ -f "$metrics" ] && [ "$(wc -l <"$metrics")" -ge "$2" ] && return 0
    sleep "$4"
  done
  return 1
}

# losses METRICS_FILE: "step loss" per record.
losses() { python3 -c "import json,sys; [print(r['step'], r['loss']) for r in map(json.loads, open(sys.argv[1]))]" "$1"; }

# preempt_and_resume RUN_DIR STEP LOG COMMAND...: runs COMMAND (a forge-train run writing RUN_DIR), sends it
# SIGUSR1 (Slurm's preemption warning) once STEP steps are logged, then runs it again to the end, both
# outputs appended to LOG. Succeeds when the first stopped with 75 and the second resumed and finished.
preempt_and_resume() {
  local run=$1 step=$2 log=$3 pid rc
  shift 3
  "$@" 2>>"$log" &
  pid=$!
  wait_for_steps "$run" "$step" 600 0.02
  kill -USR1 "$pid"
  wait "$pid"
  rc=$?
  [ $rc -eq 75 ] || { echo "preempt_and_resume: the run exited $rc, not 75 (preempted)" >&2; return 1; }
  "$@" 2>>"$log" || { echo "preempt_and_resume: the resumed run failed: $(tail -n1 "$log")" >&2; return 1; }
  grep -q "resumed from" "$log" || { echo "preempt_and_resume: the second run did not resume" >&2; return 1; }
}
