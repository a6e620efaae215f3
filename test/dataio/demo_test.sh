#!/usr/bin/env bash
# The demo corpus (1 MB per domain) through prepare and verify: real files with real duplicates.
set -euo pipefail
forge_data=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

"$source_dir/scripts/make-demo-corpus.sh" "$work/corpus" 1 > /dev/null
for d in code legal docs; do [ -n "$(ls "$work/corpus/$d")" ] || fail "demo corpus has no $d files"; done
"$forge_data" prepare --input "$work/corpus/code=code" --input "$work/corpus/legal=legal" \
  --input "$work/corpus/docs=docs" --eval-set /usr/share/common-licenses/GPL-3 --out "$work/ds" --vocab 1000 \
  --valid-fraction 0.05 > "$work/prepare.txt" || fail "prepare failed on the demo corpus"
q=$work/ds/quality.json
[ "$(json "$q" 'd["stages"]["exact_dedup"]["per_domain"]["legal"]["removed"] + d["stages"]["near_dedup"]["per_domain"]["legal"]["removed"]')" -gt 0 ] \
  || fail "no duplicates found among the license texts"
[ "$(json "$q" 'd["stages"]["decontam"]["removed"]["contaminated"]')" -gt 0 ] || fail "GPL-3 eval set contaminated nothing"
[ "$(json "$q" 'len(d["summary"]["domains"])')" = 3 ] || fail "a domain is missing from the output"
[ "$(json "$q" 'sum(1 for l in d["stages"]["filters"]["licenses"] if l != "unknown")')" -gt 0 ] || fail "no license detected"
"$forge_data" verify "$work/ds" | grep -q '^ok:' || fail "verify failed"
# The example config holds the defaults: it must give the same dataset version.
"$forge_data" prepare --input "$work/corpus/code=code" --input "$work/corpus/legal=legal" \
  --input "$work/corpus/docs=docs" --eval-set /usr/share/common-licenses/GPL-3 --out "$work/ds2" --vocab 1000 \
  --valid-fraction 0.05 --config "$source_dir/configs/prepare.example.ini" > /dev/null
[ "$(json "$work/ds/manifest.json" 'd["version"]')" = "$(json "$work/ds2/manifest.json" 'd["version"]')" ] \
  || fail "configs/prepare.example.ini does not match the built-in defaults"
echo "demo test passed"
