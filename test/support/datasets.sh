# shellcheck shell=bash
# Sourced by the shell tests that need prepared datasets.

# two_dataset_versions WORK FORGE_DATA DOCS SENTENCES: prepares WORK/v1 and WORK/v2 from two corpora of DOCS
# documents of SENTENCES sentences that walk a small word list (a model learns them), v2 with v1's
# tokenizer: two versions of one dataset, as continued pretraining and lineage tests need.
two_dataset_versions() {
  local work=$1 data=$2 tokenizer
  python3 - "$work" "$3" "$4" <<'PY' || return 1
import os, random, sys
work, docs, sentences = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = "the cat sat on a warm mat and then ran off to see what it could find in the big old house".split()
for name, seed in (("old", 1), ("new", 2)):
    random.seed(seed)
    os.makedirs(f"{work}/{name}")
    for d in range(docs):
        with open(f"{work}/{name}/doc{d}.txt", "w") as f:
            for s in range(sentences):
                i = random.randrange(len(words))
                f.write(" ".join(words[(i + k * seed) % len(words)] for k in range(random.randint(4, 9))) + ".\n")
PY
  "$data" prepare --input "$work/old" --out "$work/v1" --vocab 300 >/dev/null 2>"$work/prepare.log" ||
    { echo "prepare v1 failed: $(tail -n1 "$work/prepare.log")" >&2; return 1; }
  tokenizer=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokenizer"]["file"])' "$work/v1/manifest.json")
  "$data" prepare --input "$work/new" --out "$work/v2" --tokenizer "$work/v1/$tokenizer" >/dev/null 2>"$work/prepare.log" ||
    { echo "prepare v2 failed: $(tail -n1 "$work/prepare.log")" >&2; return 1; }
}
