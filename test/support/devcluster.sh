# shellcheck shell=bash disable=SC2034  # BUILD and jobs are the tests'
# The start every test against the dev cluster shares (sourced by test/slurm/*.sh once SRC is set): BUILD,
# STATE, fail (which ends the test), the cluster's environment (scripts/devcluster/up writes it), and $work: a
# new folder under /var/tmp, named after $1, that the cluster's users and slurmd can read (the checkout may
# sit under /root). The jobs a test submits go into `jobs`; the trap set here cancels them and removes
# $work, and a test that must undo more sets its own.
STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
BUILD=${FORGE_BUILD_DIR:?FORGE_BUILD_DIR is not set (ctest sets it to the build tree)}
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh" || fail "no dev cluster ($STATE/env.sh); run scripts/devcluster/up"
work=$(mktemp -d "/var/tmp/forge-$1.XXXXXX")
chmod 755 "$work"
jobs=()
trap 'scancel "${jobs[@]}" 2>/dev/null; rm -rf "$work"' EXIT
