#!/usr/bin/env bash
# clang-format over every tracked or new C/C++/CUDA source. Without --fix it only checks (exit 1 on drift).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  '*.cpp' '*.cc' '*.h' '*.hpp' '*.cu' '*.cuh' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
[ ${#files[@]} -gt 0 ] || exit 0
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run -Werror "${files[@]}"
fi
