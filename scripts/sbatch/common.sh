# Shared by the SlurmForge batch scripts (sourced). Runs one srun step of a forge-* program, forwards
# preemption/time-limit signals to it, and acts on its exit class (docs/ARCHITECTURE.md, "Exit codes"):
#   0 done · 75 preempted/time limit → requeue · 69 comm failure → requeue up to FORGE_MAX_COMM_RETRIES
#   64 spec, 65 data, 71 numerics, anything else → fail, never requeue (a retry would fail the same way).
# Slurm copies batch scripts into its spool, so the programs are found in the build tree named by
# FORGE_BUILD_DIR (exported by submit-pipeline; each forge-* program in its module's folder) or on PATH.

forge_bin() {
  local name=$1 dir
  for dir in launcher eval_gate dataio ckpt quota; do
    [ -x "${FORGE_BUILD_DIR:-/nonexistent}/$dir/$name" ] && { echo "$FORGE_BUILD_DIR/$dir/$name"; return; }
  done
  command -v "$name" || { echo "forge: cannot find $name: set FORGE_BUILD_DIR or PATH" >&2; return 1; }
}

forge_exit_class() {
  case $1 in
    0) echo ok ;; 1) echo failure ;; 64) echo usage ;; 65) echo data ;; 69) echo comm ;;
    71) echo numeric ;; 74) echo io ;; 75) echo preempted ;; *) echo "other($1)" ;;
  esac
}

# forge_run_step PROGRAM ARGS...: runs PROGRAM on every task of the allocation and sets FORGE_STEP_RC.
forge_run_step() {
  local step_pid
  # The batch shell gets USR1 (--signal=B:USR1@N, or preemption with GraceTime); the ranks run in the
  # srun step, so pass it on and keep waiting for the step to save its checkpoint and exit.
  trap 'echo "forge: caught USR1/TERM, asking ranks to checkpoint and stop"; kill -USR1 "$step_pid" 2>/dev/null' USR1 TERM
  srun --mpi="${FORGE_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 "$@" &
  step_pid=$!
  FORGE_STEP_RC=0
  while true; do
    wait "$step_pid" && FORGE_STEP_RC=0 || FORGE_STEP_RC=$?
    # wait returns >128 when interrupted by a trapped signal while the step still runs.
    kill -0 "$step_pid" 2>/dev/null || break
  done
  trap - USR1 TERM
}

# forge_job_comment RUN_DIR CLASS: leaves the run's summary where `sacct -o Comment` shows it (jobstats
# style; the cluster stores comments with AccountingStoreFlags=job_comment), one line of compact JSON
# after "forge:": tokens, steps, MFU, ETTR of this job's processes, exit class, run directory. '|' is
# escaped so that sacct's parsable output stays parsable. Best effort: a job that ran no forge-train
# process in the run (the gate job) leaves none.
forge_job_comment() {
  local comment
  [ -n "${SLURM_JOB_ID:-}" ] && [ -f "$1/summary.json" ] || return 0
  comment=$(python3 - "$1" "$2" "$SLURM_JOB_ID" <<'PY' 2>/dev/null
import json, sys
run, cls, job = sys.argv[1:]
s = json.load(open(run + "/summary.json"))
mine = [g for g in s.get("segments", []) if str(g.get("job_id")) == job]
if not mine:
    sys.exit(1)  # this job trained nothing in the run (the gate job): no summary of its own
span = sum(g["end"] - g["start"] for g in mine)
c = {"tokens": s.get("tokens"), "steps": s.get("steps"), "mfu": round(s.get("mean_mfu", 0), 4),
     "ettr": round(sum(g["kept_train_s"] for g in mine) / span, 4) if span > 0 else None,
     "class": cls, "run": run}
print("forge:" + json.dumps(c, separators=(",", ":")).replace("|", "\\u007c"))
PY
  ) || return 0
  scontrol update JobId="$SLURM_JOB_ID" Comment="$comment" 2>/dev/null || true
}

# forge_finish RUN_DIR: prints the run directory and exit class, requeues when the class asks for it,
# and exits with the step's code.
forge_finish() {
  local run_dir=$1 rc=$FORGE_STEP_RC class
  # forge-train writes summary.json at every exit: a step that "succeeded" without finishing the run
  # (e.g. a launch that never started the program) takes the summary's class instead.
  if [ "$rc" -eq 0 ] && [ -f "$run_dir/summary.json" ]; then
    rc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("exit_code", 0))' "$run_dir/summary.json" 2>/dev/null || echo 0)
  fi
  # A rank killed by a signal (a node lost, an OOM kill, a peer crash): srun or mpirun ends the other
  # ranks and reports 128+signal. That is a communication-class failure: requeue a bounded number of
  # times like a watchdog exit, which resumes from the last checkpoint.
  if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then
    echo "forge: a rank was killed by signal $((rc - 128)); treating it as a communication failure (69)"
    rc=69
  fi
  class=$(forge_exit_class "$rc")
  forge_job_comment "$run_dir" "$class"
  echo "forge: run directory: $run_dir"
  echo "forge: exit class: $class (exit $rc, restart ${SLURM_RESTART_COUNT:-0})"
  local requeue=0
  if [ "$rc" -eq 75 ]; then
    requeue=1
  elif [ "$rc" -eq 69 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "${FORGE_MAX_COMM_RETRIES:-2}" ]; then
    requeue=1
  fi
  if [ $requeue -eq 1 ]; then
    # A batch script that exits by itself is recorded FAILED and not requeued by Slurm (FIELD-NOTES):
    # requeue explicitly; the job comes back with SLURM_RESTART_COUNT incremented and resumes.
    # Let the step's slurmstepd finish first: a restart that reuses the step id while the old step is
    # still terminating on the node fails to launch.
    for _ in $(seq 1 60); do
      squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -q "^$SLURM_JOB_ID\.[0-9]" || break
      sleep 1
    done
    echo "forge: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  exit "$rc"
}

# forge_run_dir SPEC [OVERRIDES...]: the run directory the spec resolves to (forge-train --print-config).
forge_run_dir() {
  "$(forge_bin forge-train)" "$@" --print-config 2>/dev/null | awk -F' = ' '
    /^\[/ { section = substr($0, 2, length($0) - 2) }
    section == "run" && $1 == "dir" { print $2 }'
}
