#!/usr/bin/env bash
# scripts/sbatch/prepare.sbatch as a two-node Slurm job (docs/DATA.md, "Distributed prepare"): 4 ranks over
# node3 and node4 of the data partition make the dataset one process makes, byte for byte; a job one of
# whose ranks is killed ends with 69 and leaves neither a dataset nor its partial directory.
set -euo pipefail
SRC=${FORGE_SOURCE_DIR:?} BUILD=${FORGE_BUILD_DIR:?}
export FORGE_HOME=$SRC  # the batch script finds scripts/sbatch/common.sh there
source "${FORGE_DEVCLUSTER_DIR:?}/env.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d /var/tmp/forge-prepare-slurm.XXXXXX)
chmod 755 "$work"
jobs=()
cleanup() {
  local j
  for j in "${jobs[@]}"; do scancel "$j" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
final_state() {  # final_state JOB: waits for JOB to leave the queue, prints its state and exit code
  for _ in $(seq 1 180); do [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && break; sleep 1; done
  for _ in $(seq 1 20); do
    local s
    s=$(sacct -n -X -P -j "$1" -o State,ExitCode | head -n1)
    [ -n "$s" ] && { echo "$s"; return; }
    sleep 0.5
  done
}

"$SRC/test/support/make_prepare_corpus.py" "$SRC" corpus
args=(--input "$work/corpus/web=web" --input "$work/corpus/code=code" --vocab 400 --valid-fraction 0.1
  --shard-tokens 6000 --filters.min_words=20 --filters.max_digit_ratio=1 --ingest.repo_depth=2)
"$BUILD/dataio/forge-data" prepare "${args[@]}" --out one > one.txt || fail "one-process prepare: $(cat one.txt)"

job=$(sbatch --parsable -A team-a -N2 -n4 -c1 -o "$work/two-nodes.out" -D "$work" \
  "$SRC/scripts/sbatch/prepare.sbatch" "${args[@]}" --out "$work/two-nodes") || fail "sbatch refused the job"
jobs+=("$job")
state=$(final_state "$job")
[ "$state" = "COMPLETED|0:0" ] || fail "job $job: $state: $(cat two-nodes.out)"
for _ in $(seq 1 20); do  # accounting may show part of the list for a moment after the end
  nodes=$(sacct -n -X -P -j "$job" -o NodeList | head -n1)
  [ "$nodes" = "node[3-4]" ] && break
  sleep 0.5
done
[ "$nodes" = "node[3-4]" ] || fail "job $job ran on '$nodes', want node[3-4]"
grep -q "on 4 ranks" two-nodes.out || fail "the job did not prepare on 4 ranks: $(cat two-nodes.out)"
diff <(cd one && find . -type f ! -name 'quality.*' | sort | xargs sha256sum) \
     <(cd two-nodes && find . -type f ! -name 'quality.*' | sort | xargs sha256sum) \
  || fail "the two-node dataset differs from the one-process one"
python3 - two-nodes/quality.json <<'PY' || fail "work split: not two hosts' ranks"
import json, sys
d = json.load(open(sys.argv[1]))["summary"]["distributed"]
assert d["ranks"] == 4 and all(w["documents_in"] > 0 for w in d["work_split"]), d
PY
echo "  job $job on $nodes: $(tail -n1 two-nodes.out)"

# A rank killed: the step fails, the job ends with 69, and nothing is left at --out.
job=$(sbatch --parsable -A team-a -N2 -n4 -c1 -o "$work/killed.out" -D "$work" \
  "$SRC/scripts/sbatch/prepare.sbatch" "${args[@]}" --out "$work/killed") || fail "sbatch refused the job"
jobs+=("$job")
# Once rank 0 has made the partial directory every rank is past start-up; the ranks are held (SIGSTOP)
# while one is killed, so the run cannot finish first.
for _ in $(seq 1 1500); do [ -n "$(ls -d killed.partial-* 2>/dev/null)" ] && break; sleep 0.02; done
held=$(pgrep -f "^$BUILD/dataio/forge-data prepare .*--out $work/killed" || true)
[ "$(echo "$held" | wc -w)" -eq 4 ] || fail "job $job: expected 4 ranks running, found '$held': $(cat killed.out)"
kill -STOP $held
kill -KILL "$(echo "$held" | tail -n1)"
kill -CONT $held 2>/dev/null || true
state=$(final_state "$job")
[ "$state" = "FAILED|69:0" ] || fail "job $job with a killed rank: $state, want FAILED|69:0: $(cat killed.out)"
grep -q "a rank of the distributed prepare died" killed.out || fail "no line saying why: $(cat killed.out)"
[ ! -e killed ] && [ -z "$(ls -d killed.partial-* 2>/dev/null)" ] || fail "a failed prepare left $(ls -d killed*)"
echo "ok: two nodes give the one-process dataset; a killed rank ends the job with 69 and leaves nothing"
