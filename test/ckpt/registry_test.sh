#!/usr/bin/env bash
# The model registry end to end on the real binaries: a model pretrained on dataset v1 and promoted
# (forge-ckpt promote registers it), trained further on v2 from that release and promoted again; the
# lineage of the second names the pretraining run and both dataset versions. Also: registering again
# (as the gate job does from its verdict.json) adds nothing, list/show/export, and the exit codes of an
# unknown model (64), a damaged or newer registry (65) and another database (64).
# Usage: registry_test.sh FORGE_TRAIN FORGE_DATA FORGE_CKPT SOURCE_DIR
set -uo pipefail
train=$1 data=$2 ckpt=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export FORGE_REGISTRY=$work/state/registry.db
# shellcheck source=test/support/datasets.sh
source "$src/test/support/datasets.sh"
two_dataset_versions "$work" "$data" 20 40 || fail "the two dataset versions"
model=(--run.threads=1 --run.peak_gflops=100 --model.layers=1 --model.d_model=32 --model.heads=2 --model.seq_len=64
  --model.vocab=300)
"$train" "$src/configs/tiny.ini" --run.name=base --run.dir="$work/base" "${model[@]}" --data.dataset="$work/v1" \
  --run.steps=10 --ckpt.milestone_every=10 2>"$work/base.log" || fail "pretraining failed: $(tail -n1 "$work/base.log")"
echo '{"pass": true, "domains": {"all": {"loss": 4.2}}}' >"$work/verdict.json"
out=$(SLURM_JOB_ACCOUNT=nlp "$ckpt" promote "$work/base/checkpoints/milestone/step-00000010" --verdict "$work/verdict.json" \
  --json) || fail "promote of the pretrained model failed"
base=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["registered"] == "base:1", d; print(d["release"])' "$out") ||
  fail "promote did not register base:1: $out"
"$train" "$src/configs/tiny.ini" --run.name=cont --run.dir="$work/cont" "${model[@]}" --data.dataset="$work/v2" \
  --ckpt.init_from="$base" --run.steps=6 --ckpt.milestone_every=6 2>"$work/cont.log" ||
  fail "continued training failed: $(tail -n1 "$work/cont.log")"
"$ckpt" promote "$work/cont/checkpoints/milestone/step-00000006" --verdict "$work/verdict.json" --team nlp >"$work/promote.out" ||
  fail "promote of the continued model failed"
grep -q "registered as cont:1" "$work/promote.out" || fail "promote did not register cont:1: $(cat "$work/promote.out")"
# The gate job's registration from its verdict.json (scripts/sbatch/gate.sbatch): the same entry again.
python3 -c 'import json,sys; print(json.dumps({"pass": True, "promoted_to": sys.argv[1]}))' \
  "$work/cont/checkpoints/release/step-00000006" >"$work/gate-verdict.json"
"$ckpt" registry add --verdict "$work/gate-verdict.json" >"$work/add.out" || fail "registry add --verdict failed"
grep -q "as cont:1 in $FORGE_REGISTRY" "$work/add.out" || fail "registry add made another entry: $(cat "$work/add.out")"

"$ckpt" registry lineage cont --json >"$work/lineage.json" || fail "registry lineage failed"
"$ckpt" registry list --json >"$work/list.jsonl" || fail "registry list failed"
"$ckpt" registry show cont:1 --json >"$work/show.json" || fail "registry show failed"
python3 - "$work" <<'PY' || fail "the registry is wrong"
import json, sys
work = sys.argv[1]
v1 = json.load(open(f"{work}/v1/manifest.json"))["version"]
v2 = json.load(open(f"{work}/v2/manifest.json"))["version"]
tok = json.load(open(f"{work}/v1/manifest.json"))["tokenizer"]["sha256"]
lin = json.load(open(f"{work}/lineage.json"))
gens = lin["generations"]
assert [g["ref"] for g in gens] == ["cont:1", "base:1"], gens
assert gens[-1]["run_dir"] == f"{work}/base" and gens[-1]["step"] == 10, gens[-1]
assert [g["dataset_version"] for g in gens] == [v2, v1] and lin["dataset_versions"] == [v2, v1], lin
assert all(g["tokenizer_sha256"] == tok and g["objective"] == "lm" for g in gens), gens
rows = [json.loads(l) for l in open(f"{work}/list.jsonl")]
assert [r["ref"] for r in rows] == ["base:1", "cont:1"], rows
assert rows[0]["team"] == "nlp" and rows[0]["parent"] == "" and rows[0]["metrics"] == {"all": {"loss": 4.2}}, rows[0]
show = json.load(open(f"{work}/show.json"))
assert show["parent_ref"] == "base:1" and show["parent"] == rows[0]["path"] and show["team"] == "nlp", show
assert show["dataset_version"] == v2 and show["run_dir"] == f"{work}/cont", show
PY
"$ckpt" registry lineage cont | grep -q "^base:1 " || fail "the lineage table does not name base:1"
mkdir "$work/export"
"$ckpt" registry export base:1 --out "$work/export" --params-only >/dev/null || fail "registry export failed"
[ -s "$work/export/base-v1.h5" ] || fail "registry export wrote no $work/export/base-v1.h5"
"$ckpt" registry show base --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["export_path"].endswith("/export/base-v1.h5"), d' ||
  fail "the export path is not recorded"

# Bad input: an unknown model or version is 64, a damaged registry 65, each one line naming it.
expect_error() {  # CODE PATTERN COMMAND...
  local code=$1 pattern=$2 rc
  shift 2
  "$@" >"$work/err" 2>&1
  rc=$?
  if [ "$rc" -ne "$code" ] || [ "$(wc -l <"$work/err")" -ne 1 ] || ! grep -q "$pattern" "$work/err"; then
    fail "${*:2}: exit $rc, expected $code and one line with \"$pattern\": $(cat "$work/err")"
  fi
}
expect_error 64 "no model 'nope'" "$ckpt" registry show nope
expect_error 64 "no version 7 of 'base'" "$ckpt" registry lineage base:7
head -c 8192 /dev/urandom >"$work/damaged.db"
expect_error 65 "damaged.db' is damaged" "$ckpt" registry list --registry "$work/damaged.db"
# Another program's database (the quota ledger by mistake) is left alone; a newer schema is refused.
python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("CREATE TABLE runs (job_id TEXT)")' "$work/ledger.db"
expect_error 64 "not a model registry" "$ckpt" registry list --registry "$work/ledger.db"
cp "$FORGE_REGISTRY" "$work/newer.db"
python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("PRAGMA user_version=99")' "$work/newer.db"
expect_error 65 "schema version 99" "$ckpt" registry list --registry "$work/newer.db"
echo "PASS: releases registered on promotion and from a verdict, once; lineage back to the pretraining run with both dataset versions; list, show, export; exit codes"
