#!/usr/bin/env bash
# forge-gate end to end on a real dataset and real checkpoints: a model trained further passes against
# its parent and is promoted; a damaged one fails and is not; a missing domain, a dataset version
# mismatch, a corrupt checkpoint and a bad policy each give their error. Data parallel over 2 MPI ranks
# gives the same numbers as one rank.
# Usage: gate_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
gate=$build/eval_gate/forge-gate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

"$src/scripts/make-demo-corpus.sh" "$work/corpus" 1 >/dev/null || fail "demo corpus"
prep() {  # prep OUT VALID_FRACTION
  "$build/dataio/forge-data" prepare --input "$work/corpus/code=code" --input "$work/corpus/legal=legal" \
    --out "$1" --vocab 400 --valid-fraction "$2" >/dev/null || fail "prepare $1"
}
prep "$work/ds" 0.1
prep "$work/ds-other" 0.2
"$build/test/eval_gate/make_checkpoints" "$work/ds" "$work/run" "$work/damaged" 40 160 || fail "make_checkpoints"
parent=$work/run/checkpoints/milestone/step-00000040
child=$work/run/checkpoints/milestone/step-00000160
damaged=$work/damaged/checkpoints/milestone/step-00000160

cat > "$work/gate.ini" <<'INI'
[gate]
required_domains = code, legal
min_tokens = 256
[loss]
max_relative_regression = 0.0
max_stderr_regression = 2.0
[bpb]
max_absolute = 8
INI
launcher=() extra=()
run_gate() {  # run_gate EXPECTED_RC CHECKPOINT BASELINE OUT [DATASET] [POLICY]; uses $launcher and $extra
  local want=$1 ck=$2 base=$3 out=$4 ds=${5:-$work/ds} pol=${6:-$work/gate.ini}
  "${launcher[@]}" "$gate" evaluate --checkpoint "$ck" --dataset "$ds" --baseline "$base" --policy "$pol" \
    --out "$out" --max-sequences 32 --threads 1 "${extra[@]}" >"$out.log" 2>&1
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$out.log" >&2; fail "forge-gate on $(basename "$ck") vs $base: exit $rc, want $want"; }
}

# A damaged model fails against its parent and is never promoted.
run_gate 1 "$damaged" "$parent" "$work/g-damaged"
[ "$(json "$work/g-damaged/verdict.json" 'd["pass"]')" = False ] || fail "damaged verdict says pass"
[ "$(json "$work/g-damaged/verdict.json" 'd["promoted_to"]')" = None ] || fail "damaged checkpoint was promoted"
[ ! -e "$work/damaged/checkpoints/release" ] || fail "damaged checkpoint reached the release tier"
grep -q "^FAIL loss" "$work/g-damaged/summary.txt" || fail "summary does not show the failed loss check"

# Trained further on the same data: passes against its parent and is promoted to release.
run_gate 0 "$child" "$parent" "$work/g-child"
v=$work/g-child/verdict.json
[ "$(json "$v" 'd["pass"]')" = True ] || fail "child verdict says fail"
for d in code legal; do
  [ "$(json "$v" "d['domains']['$d']['loss'] < d['baseline_domains']['$d']['loss']")" = True ] \
    || fail "child's $d loss is not below the parent's"
  [ "$(json "$v" "d['domains']['$d']['bpb'] > 0 and d['domains']['$d']['loss_se'] > 0")" = True ] || fail "$d bpb/se missing"
done
release=$(json "$v" 'd["promoted_to"]')
[ -f "$release/COMMITTED" ] || fail "promoted checkpoint $release is not committed"
[ "$(json "$v" 'd["candidate"]["checksum"] != "" and d["dataset_version"] != ""')" = True ] || fail "verdict lacks checksum/version"

# Long operations say they are alive in a log (stderr not a terminal): with FORGE_PROGRESS_S=0 every update
# is a line, ending with "done in"; evaluation (rank 0's share), export and prepare.
export FORGE_PROGRESS_S=0
extra=(--no-promote)
run_gate 0 "$child" none "$work/g-progress"
grep -q "^evaluate code: 1/32 sequences, ETA" "$work/g-progress.log" &&
  grep -q "^evaluate legal: 32/32 sequences, done in" "$work/g-progress.log" ||
  fail "evaluation progress lines: $(grep -m3 "^evaluate" "$work/g-progress.log")"
"$build/ckpt/forge-ckpt" export "$child" --out "$work/child.h5" 2>"$work/export.log" >/dev/null || fail "export"
grep -qE "^export $work/child.h5: ([0-9]+)/[0-9]+ tensors, .* done in" "$work/export.log" ||
  fail "export progress lines: $(tail -n2 "$work/export.log")"
"$build/dataio/forge-data" prepare --input "$work/corpus/code=code" --out "$work/ds-progress" --vocab 400 \
  --valid-fraction 0.1 2>"$work/prepare.log" >/dev/null || fail "prepare with progress lines"
for stage in ingest normalize exact-dedup near-dedup filters encode; do
  grep -q "^prepare $stage: [0-9]* docs.*done in" "$work/prepare.log" || fail "no closing progress line for prepare $stage"
done
unset FORGE_PROGRESS_S
extra=()

# The release is now the run's baseline; its recorded results are reused on the same dataset version.
extra=(--no-promote)
run_gate 0 "$child" release "$work/g-release"
extra=()
[ "$(json "$work/g-release/verdict.json" 'd["baseline_results_reused"]')" = True ] || fail "release results not reused"

# Errors: missing domain (65), dataset version mismatch (65), corrupt checkpoint (65), bad policy (64).
sed 's/required_domains = code, legal/required_domains = code, poetry/' "$work/gate.ini" > "$work/missing.ini"
run_gate 65 "$child" none "$work/g-missing" "$work/ds" "$work/missing.ini"
grep -q "required domain 'poetry'" "$work/g-missing.log" || fail "missing-domain message"
run_gate 65 "$child" none "$work/g-version" "$work/ds-other"
grep -q "trained on dataset version" "$work/g-version.log" || fail "version-mismatch message"
cp -r "$parent" "$work/corrupt"
f=$(ls "$work/corrupt" | grep -v -e manifest -e COMMITTED -e index | head -1)
printf 'XXXX' | dd of="$work/corrupt/$f" bs=1 seek=100 conv=notrunc 2>/dev/null
run_gate 65 "$work/corrupt" none "$work/g-corrupt"
grep -q "$f" "$work/g-corrupt.log" || fail "corrupt-checkpoint message does not name $f"
printf '[gate]\nmin_tokens = many\n' > "$work/bad.ini"
run_gate 64 "$child" none "$work/g-bad" "$work/ds" "$work/bad.ini"

# Two MPI ranks evaluate disjoint halves and agree with one rank.
launcher=(mpirun -np 2 --oversubscribe) extra=(--no-promote)
run_gate 0 "$child" "$parent" "$work/g-mpi"
for d in code legal; do
  [ "$(json "$work/g-mpi/verdict.json" "abs(d['domains']['$d']['loss'] - $(json "$v" "d['domains']['$d']['loss']")) < 1e-9")" = True ] \
    || fail "2-rank $d loss differs from 1-rank"
done
echo "gate test passed"
