# shellcheck shell=bash
# Shared by the bench scripts (source it).

# ensure_torch WHO: Debian's python3-torch (the PyTorch peers) installed if missing, idempotently; non-zero
# when it cannot be (the reason in /tmp/forge-WHO-torch.log).
ensure_torch() {
  local who=$1 sudo=""
  dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q '^install ok installed$' && return 0
  echo "$who: installing python3-torch (the PyTorch peer)"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  if ! { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch; } \
    >"/tmp/forge-$who-torch.log" 2>&1; then
    echo "$who: could not install python3-torch (see /tmp/forge-$who-torch.log)" >&2
    return 1
  fi
}

# build_targets WHO BUILD TARGET...: builds TARGET... in BUILD, which must be a configured build tree (else
# exit 64 naming it); the build's output is shown only when it fails. JOBS=N sets the parallelism.
build_targets() {
  local who=$1 build=$2 log
  shift 2
  if [ ! -f "$build/CMakeCache.txt" ]; then
    echo "$who: $build is not a configured build tree (cmake --preset release)" >&2
    exit 64
  fi
  log=$(cmake --build "$build" --target "$@" ${JOBS:+-j "$JOBS"} 2>&1) || { echo "$log" >&2; exit 1; }
}

# machine [EXTRA]: the line every benchmark prints before it measures, which docs/PERFORMANCE.md's entries
# quote: cores, architecture, CPU model, the load before, and EXTRA. load_after: the load when it is done.
# shellcheck disable=SC2120 # EXTRA is optional
machine() {
  # nproc counts OMP_NUM_THREADS, which the scripts set to 1 per rank: the machine's cores without it.
  echo "machine: $(OMP_NUM_THREADS='' OMP_THREAD_LIMIT='' nproc) cores, $(uname -m), $(lscpu | sed -n 's/^Model name: *//p'), load before:" \
    "$(cut -d' ' -f1-3 /proc/loadavg)${1:+; $1}"
}
load_after() { echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"; }

# run_bench WHO BUILD TARGET [ARGS...]: the benchmark program TARGET built if needed (build_targets) and run
# with ARGS between the machine line and the load after.
run_bench() {
  local who=$1 build=$2 target=$3
  shift 3
  build_targets "$who" "$build" "$target"
  machine
  "$build/bench/$target" "$@"
  load_after
}
