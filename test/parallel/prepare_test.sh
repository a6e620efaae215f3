#!/usr/bin/env bash
# forge-data prepare on MPI ranks (docs/DATA.md, "Distributed prepare"): 1, 3 and 4 ranks make the same
# dataset, byte for byte (version, shards, tokenizer), with the same quality counts, from a corpus whose
# exact duplicates, near duplicates, repository duplicates and forks, languages and shards cross the ranks'
# parts; the work split is shown; a rank that fails (bad data on its part) stops every rank with its exit
# code and a rank killed mid-run leaves no dataset that looks complete.
set -euo pipefail
forge_data=$1 src=$2 mpirun=$3
source "$src/test/parallel/common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

"$src/test/support/make_prepare_corpus.py" "$src" corpus
args=(--input corpus/web=web --input corpus/code=code --vocab 400 --valid-fraction 0.1 --shard-tokens 6000
  --filters.min_words=20 --filters.max_digit_ratio=1 --ingest.repo_depth=2)
"$forge_data" prepare "${args[@]}" --out one > one.txt || fail "one-process prepare: $(cat one.txt)"
version=$(python3 -c 'import json; print(json.load(open("one/manifest.json"))["version"])')
same_counts() {  # every count and example of quality.json, without times, rates and the work split
  python3 - "$1/quality.json" "$2/quality.json" <<'PY' || fail "quality.json of $2 differs from $1"
import json, sys
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if "seconds" not in k and "mb_per" not in k
                and k not in ("peak_rss_bytes", "dataset", "distributed", "version")}
    return [strip(v) for v in x] if isinstance(x, list) else x
a, b = (strip(json.load(open(p))) for p in sys.argv[1:])
bad = [k for k in set(a["stages"]) | set(b["stages"]) if a["stages"].get(k) != b["stages"].get(k)]
assert not bad and a["summary"] == b["summary"], (bad, [(a["stages"][k], b["stages"][k]) for k in bad[:1]])
PY
}
for np in 3 4; do
  "$mpirun" -np "$np" "$forge_data" prepare "${args[@]}" --out "ranks$np" > "ranks$np.txt" 2>&1 \
    || fail "prepare on $np ranks: $(cat "ranks$np.txt")"
  grep -q "version $version) on $np ranks" "ranks$np.txt" || fail "$np ranks: another version: $(tail -1 "ranks$np.txt")"
  diff <(cd one && find . -type f ! -name 'quality.*' | sort | xargs sha256sum) \
       <(cd "ranks$np" && find . -type f ! -name 'quality.*' | sort | xargs sha256sum) \
    || fail "$np ranks: files differ from one process"
  same_counts one "ranks$np"
done
q=ranks4/quality.json
check() { python3 -c "import json, sys; q = json.load(open('$q')); sys.exit(0 if ($1) else 1)" || fail "$2"; }
check 'q["stages"]["exact_dedup"]["removed"]["exact_duplicate"] >= 30' "exact duplicates across ranks not removed"
check 'q["stages"]["near_dedup"]["removed"]["near_duplicate"] >= 10' "near duplicates across ranks not removed"
check 'q["stages"]["repository"]["duplicate_repositories"] == 1 and q["stages"]["repository"]["forks"] == 1' \
  "repository duplicate and fork not found: $(python3 -c "import json; print(json.load(open('$q'))['stages']['repository'])")"
check 'all(e["kept"] for e in q["stages"]["exact_dedup"]["examples"] + q["stages"]["near_dedup"]["examples"])' \
  "dedup examples lack the kept document's source"
check 'len(q["summary"]["languages"]) >= 4' "languages missing"
check 'len({s["file"] for s in json.load(open("ranks4/manifest.json"))["shards"]}) > 8' "too few shards to cross ranks"
check '[w["rank"] for w in q["summary"]["distributed"]["work_split"]] == [0, 1, 2, 3] and
       all(w["documents_in"] > 0 and w["shards_written"] > 0 for w in q["summary"]["distributed"]["work_split"]) and
       sum(w["bytes_in"] for w in q["summary"]["distributed"]["work_split"]) == q["summary"]["bytes_in"]' \
  "work split: $(python3 -c "import json; print(json.load(open('$q'))['summary']['distributed'])")"
"$forge_data" verify ranks4 | grep -q '^ok:' || fail "verify failed on the 4-rank dataset"

# Bad data on one rank's part: every rank stops with 65 and nothing is published.
printf '{"text": "fine"}\n{"text": "x", "repo": 5}\n' > corpus/web/part99.jsonl
rc=0; "$mpirun" -np 4 "$forge_data" prepare "${args[@]}" --out bad > bad.txt 2>&1 || rc=$?
[ "$rc" -eq 65 ] || fail "bad repo field on one rank: exit $rc, want 65: $(cat bad.txt)"
grep -q 'part99.jsonl:2: field "repo"' bad.txt || fail "the error does not name the line: $(cat bad.txt)"
[ ! -e bad ] || fail "a failed distributed prepare published a dataset"
rm corpus/web/part99.jsonl
# A rank killed mid-run (once rank 0 has made the partial directory, so every rank is past MPI's start-up):
# the launcher stops the others; what is left has no manifest. The ranks are held (SIGSTOP) while one is
# killed, so the run cannot finish first; the timeout only keeps a launcher bug from hanging the suite.
timeout 120 "$mpirun" -np 4 "$forge_data" prepare "${args[@]}" --out killed > killed.txt 2>&1 &
launcher=$!
ranks() { pgrep -f "^$forge_data prepare .*--out killed" || true; }
for _ in $(seq 1 600); do [ -n "$(ls -d killed.partial-* 2>/dev/null)" ] && break; sleep 0.02; done
held=$(ranks)
[ "$(echo "$held" | wc -w)" -eq 4 ] || fail "expected 4 ranks running, found: $held"
kill -STOP $held
victim=$(echo "$held" | tail -1)
kill -KILL "$victim"
kill -CONT $held 2>/dev/null || true
rc=0; wait "$launcher" || rc=$?
[ "$rc" -ne 0 ] || fail "a killed rank went unnoticed"
[ ! -e killed ] || fail "a prepare with a killed rank published a dataset"
for d in killed.partial-*; do [ ! -e "$d/manifest.json" ] || fail "$d looks complete"; done
echo "ok: 1, 3 and 4 ranks give version $version; a failing or killed rank publishes nothing"
