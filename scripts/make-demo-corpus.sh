#!/usr/bin/env bash
# Builds the demo corpus from files every Debian machine has (no downloads):
#   code/  Python standard library sources (/usr/lib/python3.*)
#   legal/ /usr/share/common-licenses and /usr/share/doc/*/copyright (rich in exact and near duplicates)
#   docs/  man pages (section 1 and 8), roff markup stripped to plain text
# Usage: scripts/make-demo-corpus.sh OUT_DIR [MB_PER_DOMAIN]   (default 15 MB per domain)
# File selection is sorted and size-bounded, so the same machine gives the same corpus.
set -euo pipefail
export LC_ALL=C

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUT_DIR [MB_PER_DOMAIN]" >&2
  exit 64
fi
out=$1
budget=$(( ${2:-15} * 1000 * 1000 ))
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "$0: $out exists and is not empty; remove it or pick another directory" >&2
  exit 64
fi
mkdir -p "$out/code" "$out/legal" "$out/docs"

# Reads "SIZE PATH" lines (sorted by path) and copies files into $1 as flat names with suffix $2 until the
# byte budget is spent. Only cp is spawned per file: process starts dominate the run time otherwise.
copy_bounded() {
  local dest=$1 suffix=$2 used=0 size f name
  while read -r size f; do
    [ -r "$f" ] || continue
    [ $((used + size)) -le "$budget" ] || break
    name=${f#/}
    cp -L "$f" "$dest/${name//\//_}$suffix"
    used=$((used + size))
  done
}

pylib=$(ls -d /usr/lib/python3.[0-9]* 2>/dev/null | sort -V | tail -1)
if [ -z "$pylib" ]; then
  echo "$0: no /usr/lib/python3.* found" >&2
  exit 66
fi
find "$pylib" -name '*.py' -type f -printf '%s %p\n' | sort -k2 | copy_bounded "$out/code" ""

{
  find /usr/share/common-licenses -maxdepth 1 -type f -printf '%s %p\n' | sort -k2
  find -L /usr/share/doc -mindepth 2 -maxdepth 2 -name copyright -type f -printf '%s %p\n' 2>/dev/null | sort -k2
} | copy_bounded "$out/legal" ".txt"

# roff -> text without man(1) (slow, and absent on minimal images): drop comments and layout requests,
# keep the arguments of font and section macros, undo the common escapes.
strip_roff() {
  sed -E \
    -e '/^\.\\"/d' -e "/^'\\\\\"/d" \
    -e 's/^\.(SH|SS|TH)[[:space:]]+//' \
    -e 's/^\.(B|I|BR|BI|IB|IR|RB|RI|SM|SB)[[:space:]]+//' \
    -e '/^\.[A-Za-z]+([[:space:]].*)?$/d' \
    -e 's/\\f[BIRPC]//g' -e 's/\\f\(..//g' -e 's/\\f\[[^]]*\]//g' \
    -e 's/\\-/-/g' -e 's/\\\(em/--/g' -e 's/\\\(en/-/g' -e 's/\\\([a-z][a-z]//g' \
    -e 's/\\&//g' -e 's/\\e/\\/g' -e 's/\\ / /g' -e 's/\\\*\(..//g' -e 's/\\\*.//g' \
    -e 's/"//g'
}
# .so pages are one-line aliases: stripped, they are empty and are removed.
n=0
for f in $(ls /usr/share/man/man1/*.gz /usr/share/man/man8/*.gz 2>/dev/null | sort); do
  if [ $((n % 25)) -eq 0 ] && [ "$(du -sb "$out/docs" | cut -f1)" -ge "$budget" ]; then break; fi
  n=$((n + 1))
  target="$out/docs/$(basename "$f" .gz).txt"
  zcat "$f" 2>/dev/null | strip_roff > "$target" || true
  [ -s "$target" ] || rm -f "$target"
done

for d in code legal docs; do
  printf '%-6s %5d files %8d KB\n' "$d" "$(ls "$out/$d" | wc -l)" "$(du -sk "$out/$d" | cut -f1)"
done
