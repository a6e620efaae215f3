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
