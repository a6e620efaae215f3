#!/usr/bin/env bash
# One build against another in the same run, on this machine: the speed a refactor must keep.
#   bench/ab.sh OLD_BUILD NEW_BUILD [ROUNDS]
# Each side is a build tree with bench_trainer_cpu, bench_parallel and bench_data_reader (e.g. a worktree
# of the previous release built with `cmake --preset release`). Old and new alternate, ROUNDS rounds
# (default 3), and each keeps its best, so load from other processes skews neither side:
#   trainer   bench_trainer_cpu on the benchmark config (configs/bench-cpu.ini's model, 2 threads)
#   parallel  bench_parallel on configs/bench-cpu.ini: DP=2 with ZeRO-1 and with all-reduce against one
#             rank with 2 threads, TP=2, PP=2 (4 micro-batches): tokens/s and the pipeline bubble
#   reader    bench_data_reader (32 M tokens, seq_len 2048): each order's throughput against a raw read
# and prints new/old for each figure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
[ $# -ge 2 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 64; }
old=$(realpath "$1") new=$(realpath "$2") rounds=${3:-3}
for b in "$old" "$new"; do
  for t in bench_trainer_cpu bench_parallel bench_data_reader; do
    [ -x "$b/bench/$t" ] || { echo "ab.sh: $b/bench/$t missing (cmake --build $b --target $t)" >&2; exit 64; }
  done
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OPENBLAS_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
machine
echo "old: $old ($(git -C "$old" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "new: $new ($(git -C "$new" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

parallel() {  # BUILD NP THREADS overrides...: one JSON line
  local build=$1 np=$2 threads=$3
  shift 3
  OMP_NUM_THREADS=$threads mpirun --oversubscribe --bind-to none -np "$np" "$build/bench/bench_parallel" \
    "$root/configs/bench-cpu.ini" --run.steps=8 --run.threads="$threads" "$@"
}
for round in $(seq 1 "$rounds"); do
  for side in old new; do
    b=${!side}
    "$b/bench/bench_trainer_cpu" --threads 2 --steps 8 --no-profile --layers 6 --dmodel 384 --heads 6 \
      --vocab 8192 --seq 256 --batch 8 | sed -n 's/^forge .*tokens_per_s=\([0-9.]*\).*/\1/p' >> "$out/trainer.$side"
    {
      parallel "$b" 1 2 --data.batch=4 --parallel.microbatches=2 | sed 's/^/base /'
      parallel "$b" 2 1 --data.batch=4 --parallel.dp=2 --parallel.zero=1 | sed 's/^/dp2_zero1 /'
      parallel "$b" 2 1 --data.batch=4 --parallel.dp=2 --parallel.zero=0 | sed 's/^/dp2_allreduce /'
      parallel "$b" 2 1 --data.batch=4 --parallel.microbatches=2 --parallel.tp=2 | sed 's/^/tp2 /'
      parallel "$b" 2 1 --data.batch=2 --parallel.microbatches=4 --parallel.pp=2 | sed 's/^/pp2_m4 /'
    } >> "$out/parallel.$side"
    "$b/bench/bench_data_reader" "$out/reader-data" 32 2048 3 >> "$out/reader.$side"
  done
done
load_after

python3 - "$out" "$rounds" <<'PY'
import json, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def best(values): return max(values) if values else float("nan")
rows = []
trainer = {s: [float(x) for x in open(f"{out}/trainer.{s}").read().split()] for s in ("old", "new")}
rows.append(("trainer step, tokens/s (best of %d)" % rounds, best(trainer["old"]), best(trainer["new"])))
par = {}
for side in ("old", "new"):
    for line in open(f"{out}/parallel.{side}"):
        name, js = line.split(" ", 1)
        par.setdefault(side, {}).setdefault(name, []).append(json.loads(js))
for side in ("old", "new"):
    p = par[side]
    base = best([r["tokens_per_s"] for r in p["base"]])
    par[side]["ratios"] = {
        "DP=2 ZeRO-1 / 1 rank x 2 threads": best([r["tokens_per_s"] for r in p["dp2_zero1"]]) / base,
        "DP=2 all-reduce / 1 rank x 2 threads": best([r["tokens_per_s"] for r in p["dp2_allreduce"]]) / base,
        "TP=2 / 1 rank x 2 threads": best([r["tokens_per_s"] for r in p["tp2"]]) / base,
        "PP=2 bubble fraction, m = 4 (ideal 0.200)": min(r["bubble_fraction"] for r in p["pp2_m4"]),
    }
for k in par["old"]["ratios"]:
    rows.append((k, par["old"]["ratios"][k], par["new"]["ratios"][k]))
pat = re.compile(r"^(\w+ order, [\w ]+?)\s+([\d.]+) Mtok/s\s+ratio ([\d.]+)")
reader = {}
for side in ("old", "new"):
    for line in open(f"{out}/reader.{side}"):
        m = pat.match(line)
        if m:
            reader.setdefault(side, {}).setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
for k in reader["old"]:
    rows.append((f"reader {k}: Mtok/s", best([v[0] for v in reader["old"][k]]), best([v[0] for v in reader["new"][k]])))
    rows.append((f"reader {k}: / raw read", best([v[1] for v in reader["old"][k]]), best([v[1] for v in reader["new"][k]])))
w = max(len(r[0]) for r in rows)
print(f"\n{'':<{w}} {'old':>10} {'new':>10} {'new/old':>8}")
for name, a, b in rows:
    print(f"{name:<{w}} {a:>10.3f} {b:>10.3f} {b / a:>8.3f}")
PY
