#!/usr/bin/env bash
# Writes a plugstack.conf that loads forge_spank.so from a build directory with a policy file.
# Usage: scripts/slurm/write-plugstack.sh BUILD_DIR OUT [POLICY] [SNAPSHOT] [JOB_TMP]
#   POLICY   default: the dev cluster's policy, $FORGE_DEVCLUSTER_DIR/forge-quota/quota.ini (the example
#            policy with the cluster's paths, written by scripts/devcluster/up, which may run after this)
#   SNAPSHOT default: $FORGE_DEVCLUSTER_DIR/forge-quota/usage.json (the dev cluster's), which
#            `forge-quota sync --snapshot ...` writes; tests and bench use the same path.
#   JOB_TMP  default: $FORGE_DEVCLUSTER_DIR/tmpfs/jobs, where each dev-cluster node keeps its jobs' private
#            /tmp and /dev/shm (root's, made by scripts/devcluster/up in the node's own tmpfs); '-': none,
#            also the default for a build under /tmp or /dev/shm
# The plugin is `required`: if it cannot load, Slurm refuses jobs rather than run them unchecked.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR OUT [POLICY] [SNAPSHOT] [JOB_TMP]" >&2; exit 64; }
build=$(cd "$1" && pwd)
out=$2
cluster_policy=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}/forge-quota/quota.ini
policy=${3:-$cluster_policy}
snapshot=${4:-${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}/forge-quota/usage.json}
job_tmp=${5:-${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}/tmpfs/jobs}
# The dev cluster's jobs run this build's programs on this host: a private /tmp would hide a build that lives
# in the host's /tmp or /dev/shm, so such a build's jobs keep the node's (say so; a real cluster's jobs never
# see a login node's /tmp anyway).
case "$build/" in /tmp/* | /dev/shm/*)
  if [ -z "${5:-}" ]; then
    echo "write-plugstack: note: $build is under /tmp or /dev/shm, which jobs would not see with a private" \
      "/tmp: no job_tmp= (jobs share the node's /tmp); build elsewhere for private job scratch" >&2
    job_tmp=-
  fi ;;
esac
if [ "$job_tmp" = - ]; then job_tmp=""; else job_tmp=" job_tmp=$job_tmp"; fi
so=$build/spank_plugin/forge_spank.so
[ -f "$so" ] || { echo "write-plugstack: no $so; build the forge_spank target first" >&2; exit 66; }
[ -f "$policy" ] || [ "$policy" = "$cluster_policy" ] || { echo "write-plugstack: no policy file $policy" >&2; exit 66; }
case "$so$policy$snapshot${job_tmp# }" in *[[:space:]]*)
  echo "write-plugstack: plugstack.conf arguments cannot contain spaces: $so $policy $snapshot${job_tmp}" >&2; exit 64 ;;
esac
tmp=$(mktemp "$out.XXXXXX")
cat >"$tmp" <<CONF
# Written by scripts/slurm/write-plugstack.sh (docs/ADMISSION.md).
required $so policy=$policy snapshot=$snapshot mode=enforce fail-open$job_tmp
CONF
chmod 0644 "$tmp"
mv -f "$tmp" "$out"
echo "write-plugstack: $out -> $so"
