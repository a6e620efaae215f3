#!/usr/bin/env bash
# forge_spank.so exports only what Slurm looks up (nm -D) and loads nothing heavy (no SQLite, no Boost,
# no libfmt; no shared libstdc++ unless built for the sanitizers).
# Usage: check_exports.sh PLUGIN static|shared   (how the C++ runtime is linked)
set -u
so=$1
runtime=${2:-static}
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f "$so" ] || fail "no plugin at $so"
exports=$(nm -D --defined-only "$so" | awk '{print $3}' | sort | tr '\n' ' ')
want="plugin_name plugin_type plugin_version slurm_spank_init slurm_spank_init_post_opt slurm_spank_job_epilog slurm_spank_task_init_privileged slurm_spank_user_init spank_plugin_version "
[ "$exports" = "$want" ] || fail "exports are '$exports', expected '$want'"
for sym in slurm_spank_init slurm_spank_init_post_opt slurm_spank_user_init slurm_spank_task_init_privileged slurm_spank_job_epilog; do
  nm -D --defined-only "$so" | grep -q " T $sym\$" || fail "$sym is not an exported function (C linkage?)"
done
needed=$(readelf -d "$so" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
case $needed in
  *sqlite* | *boost* | *spdlog* | *libslurm* | *libfmt*) fail "plugin depends on: $needed (keep it to libc)" ;;
esac
if [ "$runtime" = static ]; then
  case $needed in *libstdc++*) fail "plugin loads libstdc++ at run time: sbatch pays for it on every submission" ;; esac
fi
echo "ok: exports: $exports; needs: $needed"
