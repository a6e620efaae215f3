# Sourced by the scripts that run SlurmForge's programs from a build tree given to them (scripts/demo.sh,
# scripts/sbatch/submit-pipeline).
# forge_check_programs BUILD_DIR: returns 0 when every program of the `programs` target (the list CMake
# writes to BUILD_DIR/programs.txt) is built there; else prints one line naming the first missing one and
# the command that builds them, and returns 66.
forge_check_programs() {
  local build=$1 program
  if [ ! -f "$build/programs.txt" ]; then
    echo "$build is not a configured SlurmForge build tree (no programs.txt): cmake --preset release, then" \
      "cmake --build --preset release --target programs" >&2
    return 66
  fi
  while read -r program; do
    [ -z "$program" ] || [ -e "$build/$program" ] && continue
    echo "$build/$program is missing: cmake --build $build --target programs" >&2
    return 66
  done <"$build/programs.txt"
}
