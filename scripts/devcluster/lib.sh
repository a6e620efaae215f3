# shellcheck shell=bash
# Shared by scripts/devcluster/{up,down,status}: where the dev cluster lives, which daemons it has,
# and how to tell "our" process from a stranger that happens to reuse a pid or a port.
#
# Every daemon is started by `up` in the foreground (so `$!` is its real pid, not a pid that forks
# away) and tagged with FORGE_DEVCLUSTER_DAEMON=<name>@<state dir> in its environment. A pid file is
# trusted only if /proc/PID/cmdline names the expected program AND /proc/PID/environ carries that tag:
# pids get reused, and a bare "is pid alive" check would make `down` kill a stranger.

# shellcheck disable=SC2034  # used by the scripts that source this file
DEVCLUSTER_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
case $STATE in /*) ;; *) STATE=$PWD/$STATE ;; esac   # configs and tags need an absolute path
ETC=$STATE/etc          # slurm.conf, slurmdbd.conf, gres.conf, topology.conf, my.cnf
LOG=$STATE/log          # one log per daemon (+ <name>.out for what it prints before its log opens)
RUN=$STATE/run          # <name>.pid: written by `up` from $! -- the only pid files the scripts trust;
                        # munge/, mysqld/, slurm/: sockets and the pid files daemons write themselves
SPOOL=$STATE/spool      # slurmctld StateSaveLocation and one SlurmdSpoolDir per node
DBDIR=$STATE/mysql      # MariaDB datadir (its own, so a system MariaDB is never touched)
GPUDIR=$STATE/gpu       # plain files standing in for /dev/nvidia0..7
GPU_HEALTH_DIR=$STATE/gpu-health  # <node>/gpu<i>: each fake GPU's health ("ok" or a fault), read by forge-health
TMPFS_DIR=$STATE/tmpfs  # slurm TmpFS; each slurmd mounts its own private tmpfs here (PMIx dirs, jobs/)
ENV_FILE=$STATE/env.sh

export SLURM_CONF=$ETC/slurm.conf
MUNGE_SOCKET=$RUN/munge/munge.socket
MUNGE_KEY=$ETC/munge.key
MYSQL_SOCKET=$RUN/mysqld/mysqld.sock

CLUSTER_NAME=forge
SLURM_USER=slurm        # slurmctld and slurmdbd run as this user (SlurmUser); slurmd as root
HOST_SHORT=$(hostname -s)
NODES=(node1 node2 node3 node4)
GPUS_PER_NODE=8
CPUS_PER_NODE=16
MEM_PER_NODE=16000      # MB, declared (config_overrides); DefMemPerCPU = MEM/CPUS so 16 1-CPU jobs fit

# TCP ports. Everything talks over loopback addresses; MariaDB listens on 127.0.0.1 only, the Slurm
# daemons on all interfaces (they have no bind-address option; munge auth with our own key guards
# them). One base so a second cluster can live next to this one.
PORT_BASE=${FORGE_DEVCLUSTER_PORT_BASE:-16800}
MYSQL_PORT=$((PORT_BASE + 6))
CTLD_PORT=$((PORT_BASE + 17))
DBD_PORT=$((PORT_BASE + 19))
node_port() { echo $((PORT_BASE + 20 + ${1#node})); }   # node1 -> 16821 ... node4 -> 16824
node_addr() { echo "127.0.0.$((1 + ${1#node}))"; }      # node1 -> 127.0.0.2 ... node4 -> 127.0.0.5

# Start order; `down` walks it backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}")

say() { echo "devcluster: $*"; }
die() { echo "devcluster: $*" >&2; exit 1; }

daemon_port() {
  case $1 in
    mariadbd) echo "$MYSQL_PORT" ;;
    slurmdbd) echo "$DBD_PORT" ;;
    slurmctld) echo "$CTLD_PORT" ;;
    slurmd-*) node_port "${1#slurmd-}" ;;
    *) echo "" ;;   # munged: unix socket only
  esac
}
daemon_log() {
  case $1 in
    munged) echo "$LOG/munged.out" ;;   # foreground munged logs to stderr only
    mariadbd) echo "$LOG/mariadb.log" ;;
    *) echo "$LOG/$1.log" ;;
  esac
}
pidfile() { echo "$RUN/$1.pid"; }
daemon_tag() { echo "FORGE_DEVCLUSTER_DAEMON=$1@$STATE"; }

# Process checks use bash builtins only: a fork+exec costs ~20 ms on small VMs, and these run for
# every daemon on every up/down/status.
proc_argv0() {   # basename of argv[0] of PID (empty if gone)
  local -a argv=()
  mapfile -d '' -t argv 2>/dev/null <"/proc/$1/cmdline" || return 0
  [ ${#argv[@]} -gt 0 ] && printf '%s\n' "${argv[0]##*/}"
  return 0
}
proc_state() {   # one-letter state of PID from /proc/PID/stat (R, S, Z, ...)
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }   # comm may contain spaces/parens: cut after the last ") "
  printf '%s\n' "${stat%% *}"
}

# is_ours NAME PID: PID is alive, runs NAME's program, and was started by `up` for this state dir.
is_ours() {
  local name=$1 pid=$2 exe tag e
  local -a argv=() envv=()
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  mapfile -d '' -t argv 2>/dev/null <"/proc/$pid/cmdline" || return 1
  exe=$name; [[ $name == slurmd-* ]] && exe=slurmd
  [ ${#argv[@]} -gt 0 ] && [ "${argv[0]##*/}" = "$exe" ] || return 1
  [ "$(proc_state "$pid")" != Z ] || return 1   # zombies are dead (nobody may reap them here)
  tag="FORGE_DEVCLUSTER_DAEMON=$name@$STATE"
  mapfile -d '' -t envv 2>/dev/null <"/proc/$pid/environ" || return 1
  for e in "${envv[@]}"; do [ "$e" = "$tag" ] && return 0; done
  return 1
}

# daemon_pid NAME: prints the pid if the pid file points to our live daemon; else returns 1.
daemon_pid() {
  local pid=""
  read -r pid 2>/dev/null <"$RUN/$1.pid" || [ -n "$pid" ] || return 1
  is_ours "$1" "$pid" || return 1
  echo "$pid"
}

# port_holder PORT: "prog(pid=N)" for whatever listens on PORT (any address), empty if free.
port_holder() {
  local line
  line=$(ss -Hltnp "sport = :$1" 2>/dev/null | head -n1 || true)
  [ -n "$line" ] || return 0
  if [[ $line =~ \(\(\"([^\"]+)\",pid=([0-9]+) ]]; then
    echo "${BASH_REMATCH[1]}(pid=${BASH_REMATCH[2]})"
  else
    echo "unknown process"
  fi
}
port_holder_pid() { ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2 || true; }

# A node's processes: its slurmd, slurmstepd and job tasks all see that slurmd's private tmpfs on TmpFS
# (`up` mounts it in the slurmd's own mount namespace, and each task's namespace, for its private /tmp, is
# a copy of that one), and nothing else does: on the host the path is a plain directory. So the device a
# process sees there names its node, also after its slurmd or slurmstepd is gone.
tmpfs_dev_of() { stat -L -c %d "/proc/$1/root$TMPFS_DIR" 2>/dev/null; }   # tmpfs_dev_of PID
node_pids() {   # node_pids DEV: every pid that sees DEV on TmpFS, in one pass over /proc (a fork each: seconds)
  [ -n "$1" ] && [ "$1" != "$(stat -c %d "$TMPFS_DIR")" ] || return 0   # the host's own view is no node
  find /proc/[0-9]*/root"$TMPFS_DIR" -maxdepth 0 -printf '%D %p\n' 2>/dev/null |
    awk -v dev="$1" '$1 == dev { split($2, p, "/"); print p[3] }' || true
}

# Slurm client commands with a bound on how long they may hang when a daemon is half up.
sq() { timeout 15 "$@"; }
