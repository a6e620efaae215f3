#!/usr/bin/env bash
# The reader's picture samples per CPU-second of one core (bench_image_reader) against the rows one H200
# trains per second at a 7B vision-language model: PICTURES photo-like pictures (grain over smooth colour,
# 480 x 360, JPEG) with a 30-60 word caption each, prepared by forge-data into an image-text dataset at
# 336 pixels in 14-pixel patches (576 positions a picture; a 2048-position row packs about three captioned
# pictures), then read whole ROUNDS times from the page cache.
#
# usage: bench/image_reader.sh [BUILD_DIR] [PICTURES] [ROUNDS]
#   (default build/release, 1200, 5; the targets are built if needed). JOBS=N sets the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
pictures=${2:-1200}
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build_targets image_reader.sh "$build" bench_image_reader forge-data
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" "$pictures" <<'EOF_PY'
import json, os, random, sys
import numpy as np
from PIL import Image
out, n = sys.argv[1], int(sys.argv[2])
rng, nr = random.Random(3), np.random.default_rng(3)
words = "red green blue small large round square dog cat tree house river road sky cloud light dark near far " \
        "left right top bottom person car bird flower window door table chair book street hill field".split()
os.makedirs(os.path.join(out, "img"))
with open(os.path.join(out, "pictures.jsonl"), "w") as f:
    for i in range(n):
        y, x = np.mgrid[0:360, 0:480] / 480.0
        base = np.stack([np.sin(x * nr.uniform(1, 6) + c) * 80 + 128 for c in range(3)], axis=-1)
        pixels = np.clip(base + nr.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(out, "img", f"{i}.jpg"), quality=90)
        caption = " ".join(rng.choice(words) for _ in range(rng.randint(30, 60)))
        f.write(json.dumps({"image": f"img/{i}.jpg", "text": f"{i}: {caption}."}) + "\n")
EOF_PY
"$build/dataio/forge-data" prepare --format image-text --input "$work/pictures.jsonl" --image.size=336 \
  --image.patch=14 --vocab 400 --out "$work/dataset" | grep -E "^pictures|^wrote"
machine
"$build/bench/bench_image_reader" "$work/dataset" "${3:-5}"
load_after
