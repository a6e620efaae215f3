#!/usr/bin/python3
# A corpus for the distributed-prepare tests (test/parallel/prepare_test.sh, test/slurm/prepare_test.sh):
# prose in five languages (the language test's fixture sentences, shuffled into documents) over many JSONL
# files, one file repeated (exact duplicates on another rank's part) and ten documents copied with one word
# changed (near duplicates across files); code in owner/name repositories, one copied whole, one forked.
# usage: make_prepare_corpus.py SOURCE_DIR OUT_DIR
import json, os, random, shutil, sys

src, out = sys.argv[1:]
r = random.Random(5)
pool = {l: open(f"{src}/test/dataio/fixtures/languages/{l}.txt").read().split("\n")[:-1]
        for l in ["en", "de", "fr", "es", "ru"]}
os.makedirs(f"{out}/web")
docs = []
for i in range(600):
    lang = r.choice(["en", "en", "de", "fr", "es"])
    docs.append(" ".join(r.choice(pool[lang]) for _ in range(12)) + f" Item {i}.")
for k in range(20):
    with open(f"{out}/web/part{k:02d}.jsonl", "w") as f:
        for d in docs[30 * k: 30 * k + 30]:
            f.write(json.dumps({"text": d}) + "\n")
with open(f"{out}/web/part20.jsonl", "w") as f:  # after all the others: every line repeats an earlier one
    for d in docs[:30]:
        f.write(json.dumps({"text": d}) + "\n")
    for d in docs[300:310]:
        w = d.split(" ")
        w[3] = "zzz"
        f.write(json.dumps({"text": " ".join(w)}) + "\n")
for i in range(40):
    d = f"{out}/code/own{i % 4}/repo{i}"
    os.makedirs(d)
    for j in range(3):
        with open(f"{d}/m{j}.py", "w") as f:
            f.write(f"def function_{i}_{j}(value):\n    total = value * {i + j}\n    return total + {j}\n\n\n"
                    f"class Holder{i}{j}:\n    pass\n")
shutil.copytree(f"{out}/code/own0/repo0", f"{out}/code/own3/repo0copy")
shutil.copytree(f"{out}/code/own1/repo1", f"{out}/code/own2/repo1fork")
with open(f"{out}/code/own2/repo1fork/extra.py", "w") as f:
    f.write("x = 1\n\n\ny = 2\n")
