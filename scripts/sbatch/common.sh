# Shared by the SlurmForge batch scripts (sourced). Runs one srun step of a forge-* program, forwards
# preemption/time-limit signals to it, and acts on the run's failure record (docs/ARCHITECTURE.md,
# "Failures"; `forge-train failure` classifies, this file acts):
#   preempted → requeue · comm → the step again in this allocation, then (the second in a row) the deep
#   health check and a requeue, then stop (FORGE_MAX_COMM_RETRIES, 2) · gpu, node_lost → drain the suspect
#   node (forge-health) and requeue without it · config, data, numeric, oom_host, oom_device, io → stop, with
#   one line saying what to change · a stop signal the ranks got and the job did not → the step again.
# A batch script runs `while true; do forge_run_step ...; forge_finish RUN_DIR; done`: forge_finish exits,
# or returns when the step is to run again in this allocation.
# Slurm copies batch scripts into its spool, so the programs are found in the build tree named by
# FORGE_BUILD_DIR (exported by submit-pipeline; each forge-* program in its module's folder) or on PATH.

# What a job writes belongs to its team: the team directories are group-owned and setgid (docs/ADMISSION.md,
# "Team isolation"), and this keeps the group's write bit and nothing for others.
umask 007

forge_bin() {
  local name=$1 dir
  for dir in launcher eval_gate dataio ckpt quota health; do
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

# forge_run_step RUN_DIR PROGRAM ARGS...: runs PROGRAM on every task of the allocation and sets
# FORGE_STEP_RC; srun's own lines (killed tasks, node failures) are also kept in FORGE_STEP_LOG for
# forge_finish. A node that dies takes its part of the step along, and srun then waits for it until Slurm
# marks the node DOWN and requeues the whole job, this script included, before it could say why. So once
# a rank has left a failure record in RUN_DIR while the step still runs, the nodes are asked (again every
# FORGE_STEP_GRACE_S, 10, seconds); if one is gone, the step is given up (class node_lost, FORGE_LOST_NODES).
# Each step of the job instance is an attempt (FORGE_STEP_ATTEMPT, from 0), which names its failure record.
FORGE_STEP_ATTEMPT=-1
FORGE_JOB_SIGNALLED=0
forge_run_step() {
  local run_dir=$1 step_pid record probed_at=""
  shift
  export FORGE_STEP_ATTEMPT=$((FORGE_STEP_ATTEMPT + 1))
  record=$run_dir/failures/${SLURM_JOB_ID:-local}-${SLURM_RESTART_COUNT:-0}.json
  [ "$FORGE_STEP_ATTEMPT" -eq 0 ] || record=${record%.json}.$FORGE_STEP_ATTEMPT.json
  FORGE_STEP_LOG=$(mktemp "${TMPDIR:-/tmp}/forge-step-${SLURM_JOB_ID:-local}.XXXXXX")
  FORGE_LOST_NODES=""
  # The batch shell gets USR1 (--signal=B:USR1@N, or preemption with GraceTime); the ranks run in the
  # srun step, so pass it on and keep waiting for the step to save its checkpoint and exit.
  trap 'echo "forge: caught USR1/TERM, asking ranks to checkpoint and stop"; FORGE_JOB_SIGNALLED=1
    kill -USR1 "$step_pid" 2>/dev/null' USR1 TERM
  # In an image (forge_use_image) each task is `forge-train in-image`, which starts the program's copy in
  # the image through the node's OCI runtime.
  if [ -n "${FORGE_IMAGE:-}" ]; then
    set -- "$(forge_bin forge-train)" in-image "$FORGE_IMAGE" "/opt/forge/bin/$(basename "$1")" "${@:2}"
  fi
  srun --mpi="${FORGE_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 "$@" 2> >(tee -a "$FORGE_STEP_LOG" >&2) &
  step_pid=$!
  FORGE_STEP_RC=0
  while kill -0 "$step_pid" 2>/dev/null; do
    sleep 1
    [ -e "$record" ] || continue
    # A rank failed: if a node is gone the step cannot end, so it is given up at once; while every node
    # answers it is a slow exit, and the nodes are asked again every FORGE_STEP_GRACE_S.
    [ -z "$probed_at" ] || [ $((SECONDS - probed_at)) -ge "${FORGE_STEP_GRACE_S:-10}" ] || continue
    probed_at=$SECONDS
    FORGE_LOST_NODES=$(forge_lost_nodes)
    if [ -n "$FORGE_LOST_NODES" ] && kill -0 "$step_pid" 2>/dev/null; then
      echo "forge: a rank failed and a node is gone ($FORGE_LOST_NODES); giving the step up"
      FORGE_STEP_RC=69
      trap - USR1 TERM
      return
    fi
  done
  # The exit status; wait returns >128 when interrupted by a trapped signal while the step still runs.
  while true; do
    wait "$step_pid" && FORGE_STEP_RC=0 || FORGE_STEP_RC=$?
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

# forge_lost_nodes: the allocation's nodes whose slurmd no longer accepts a connection (a node that died
# takes its slurmd along; Slurm itself notices only after SlurmdTimeout). Printed as --lost-node NODE
# pairs. A TCP connect, not an srun: a new step waits while the failed one cannot complete on a dead node.
forge_lost_nodes() {
  local n info addr port
  for n in $(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null); do
    info=$(scontrol show node -o "$n" 2>/dev/null) || continue
    addr=$(sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' <<<"$info")
    port=$(sed -n 's/.* Port=\([0-9]*\).*/\1/p' <<<"$info")
    [ -n "$addr" ] || continue
    timeout "${FORGE_NODE_PROBE_S:-5}" bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$addr" "${port:-6818}" 2>/dev/null ||
      printf -- '--lost-node %s ' "$n"
  done
}

# forge_finish RUN_DIR: classifies the step's exit (forge-train failure: the run's failure record plus what
# srun saw), drains suspect nodes, requeues when the class asks for it, and exits with the step's code;
# returns (status 0) instead when the step is to run again in this allocation.
forge_finish() {
  local run_dir=$1 rc=$FORGE_STEP_RC lost="" key value class=ok restart=0 requeue=0 drain="" deep=0 advice="" n
  # forge-train writes summary.json at every exit: a step that "succeeded" without finishing the run
  # (e.g. a launch that never started the program) takes the summary's class instead.
  if [ "$rc" -eq 0 ] && [ -f "$run_dir/summary.json" ]; then
    rc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("exit_code", 0))' "$run_dir/summary.json" 2>/dev/null || echo 0)
  fi
  case $rc in
    0 | 64 | 65 | 71 | 74 | 75) ;;
    *) lost=${FORGE_LOST_NODES:-$(forge_lost_nodes)} ;;   # a peer may have vanished: ask every node
  esac
  # shellcheck disable=SC2086  # $lost is option pairs
  while IFS='=' read -r key value; do
    case $key in
      class) class=$value ;; restart) restart=$value ;; requeue) requeue=$value ;; drain) drain=$value ;;
      deep_check) deep=$value ;; advice) advice=$value ;;
    esac
  done < <("$(forge_bin forge-train)" failure "$run_dir" --exit "$rc" --srun-log "${FORGE_STEP_LOG:-/dev/null}" \
    --max-comm-retries "${FORGE_MAX_COMM_RETRIES:-2}" --job-signalled "$FORGE_JOB_SIGNALLED" $lost)
  rm -f "${FORGE_STEP_LOG:-}"
  forge_job_comment "$run_dir" "$class"
  echo "forge: run directory: $run_dir"
  echo "forge: exit class: $class (exit $rc, restart ${SLURM_RESTART_COUNT:-0}, attempt $FORGE_STEP_ATTEMPT)"
  # A suspect node is drained before the requeue, so the scheduler cannot hand it back: a running job
  # cannot change its own excluded nodes, and Slurm's requeue ends this script. A lost node is marked
  # DOWN: Slurm then ends this allocation's part on it and requeues now, not after SlurmdTimeout.
  local down=()
  [ "$class" != node_lost ] || down=(--down)
  for n in ${drain//,/ }; do
    "$(forge_bin forge-health)" drain --node "$n" --check "$class" "${down[@]}" \
      --detail "job ${SLURM_JOB_ID:-?} failed on it (see $run_dir/failures)" ||
      echo "forge: warning: could not drain $n"
  done
  if [ "$deep" = 1 ]; then
    echo "forge: second communication failure in a row on the same nodes: deep health check"
    srun --overlap --ntasks-per-node=1 -N "${SLURM_NNODES:-1}" --mpi=none \
      "$(forge_bin forge-health)" check --mode deep || true
  fi
  [ "$requeue" = 1 ] || [ "$restart" = 1 ] || [ -z "$advice" ] || echo "forge: $class: $advice"
  if [ "$requeue" = 1 ] || [ "$restart" = 1 ]; then
    # Let the step's slurmstepd finish first: a restart that reuses the step id while the old step is
    # still terminating on the node fails to launch, and a new step waits for the old one's resources.
    for _ in $(seq 1 60); do
      squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -q "^$SLURM_JOB_ID\.[0-9]" || break
      sleep 1
    done
  fi
  if [ "$restart" = 1 ]; then
    echo "forge: running the step again in this allocation (attempt $((FORGE_STEP_ATTEMPT + 1)))"
    return 0
  fi
  if [ "$requeue" = 1 ]; then
    # A batch script that exits by itself is recorded FAILED and not requeued by Slurm (FIELD-NOTES):
    # requeue explicitly; the job comes back with SLURM_RESTART_COUNT incremented and resumes.
    # A step stuck on a node that died keeps the job from being requeued until Slurm has marked that node
    # DOWN (SlurmdTimeout): try again meanwhile. Slurm may requeue the job itself first (its node failed),
    # which ends this script here.
    echo "forge: requeueing job $SLURM_JOB_ID"
    for _ in $(seq 1 "${FORGE_REQUEUE_TRIES:-60}"); do
      scontrol requeue "$SLURM_JOB_ID" 2>/dev/null && break
      sleep 2
    done
  fi
  exit "$rc"
}

# forge_spec_value SECTION.KEY SPEC [OVERRIDES...]: the key's value in the resolved spec (forge-train
# --print-config).
forge_spec_value() {
  local key=$1
  shift
  "$(forge_bin forge-train)" "$@" --print-config 2>/dev/null | awk -F' = ' -v section_key="$key" '
    /^\[/ { section = substr($0, 2, length($0) - 2) }
    section "." $1 == section_key { print $2 }'
}

# forge_run_dir SPEC [OVERRIDES...]: the run directory the spec resolves to.
forge_run_dir() { forge_spec_value run.dir "$@"; }

# forge_use_image SPEC [OVERRIDES...]: when the spec names run.image, checks the image before any rank
# starts (forge-image check: an image of ours, with this build's programs, and the node's OCI runtime;
# it exits 64 or 69 naming what is wrong, and so does the job) and exports FORGE_IMAGE and
# FORGE_IMAGE_DIGEST: forge_run_step then starts every rank inside it, and each rank checks it runs there.
forge_use_image() {
  local image digest rc=0
  image=$(forge_spec_value run.image "$@")
  [ -n "$image" ] || return 0
  digest=$("${FORGE_HOME:-$SLURM_SUBMIT_DIR}/scripts/forge-image" check "$image" \
    ${FORGE_BUILD_DIR:+--build-dir "$FORGE_BUILD_DIR"}) || rc=$?
  [ "$rc" -eq 0 ] || { echo "forge: run.image: the job cannot start in $image (exit $rc)"; exit "$rc"; }
  export FORGE_IMAGE=$image FORGE_IMAGE_DIGEST=$digest
  echo "forge: every rank runs in image $image ($digest)"
}
