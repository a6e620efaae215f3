# shellcheck shell=bash
# Sourced by the tests that act as the dev cluster's users (alice, bob, carol, dave; scripts/devcluster/up).

# as USER CMD...: CMD as USER with a clean environment: the dev cluster's settings, no root leftovers. The
# jobs' programs are those of the copy at $home (FORGE_HOME; FORGE_BUILD_DIR=$home/build), which the
# caller sets up where the users can reach it (the checkout may sit under /root).
as() {
  local user=$1
  shift
  runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="/home/$user" USER="$user" \
    SLURM_CONF="$SLURM_CONF" FORGE_HOME="${home:?}" FORGE_BUILD_DIR="$home/build" \
    OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1 \
    OMPI_MCA_osc=^ucx OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 "$@"
}
