#!/usr/bin/env bash
# Distributed `forge-data prepare` (docs/DATA.md, "Distributed prepare"): the demo corpus on 1 rank and on
# 2 and 4 MPI ranks of this machine, with the same given tokenizer (training is one rank's work either way).
# Prints that both make the same dataset version, the wall and CPU time of each, the work split (bytes,
# documents, shards and CPU seconds per rank), and the bytes the ranks exchanged per input byte; the
# speed-up is set against what the machine's cores allow (min(ranks, cores)), measured in the same run.
# Usage: bench/prepare_distributed.sh BUILD_DIR [CORPUS_DIR] [MB_PER_DOMAIN]
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [CORPUS_DIR] [MB_PER_DOMAIN]}
corpus=${2:-/tmp/forge-demo-corpus}
here=$(cd "$(dirname "$0")/.." && pwd)
forge_data=$build/dataio/forge-data
[ -x "$forge_data" ] || { echo "$0: build forge-data first ($forge_data)" >&2; exit 64; }
[ -d "$corpus/code" ] || "$here/scripts/make-demo-corpus.sh" "$corpus" "${3:-15}" > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
inputs=(--input "$corpus/code=code" --input "$corpus/legal=legal" --input "$corpus/docs=docs")
# A tokenizer trained once, so that both runs do the same work.
"$forge_data" prepare "${inputs[@]}" --vocab 8192 --out "$work/tok" --near_dedup.enabled=false > /dev/null
args=("${inputs[@]}" --tokenizer "$work/tok/tokenizer.model" --prepare.threads=1)
run() {  # run NAME COMMAND...: wall seconds into $work/NAME.s
  local name=$1 start
  shift
  start=$(date +%s.%N)
  "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; exit 1; }
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}' > "$work/$name.s"
}
run one "$forge_data" prepare "${args[@]}" --out "$work/one"
run two mpirun -np 2 "$forge_data" prepare "${args[@]}" --out "$work/two"
run four mpirun -np 4 "$forge_data" prepare "${args[@]}" --out "$work/four"
python3 - "$work" "$(nproc)" <<'PY'
import json, sys
w, cores = sys.argv[1], int(sys.argv[2])
one = json.load(open(f"{w}/one/quality.json"))["summary"]
t1 = float(open(f"{w}/one.s").read())
print(f"input {one['bytes_in']/1e6:.1f} MB, {one['documents_in']} documents -> {one['documents_out']}, "
      f"version {one['version'][:16]}")
print(f"1 rank : {t1:6.1f} s wall ({one['seconds']:5.1f} s in prepare), {one['cpu_seconds']:6.1f} CPU-s")
for name, n in (("two", 2), ("four", 4)):
    s = json.load(open(f"{w}/{name}/quality.json"))["summary"]
    t = float(open(f"{w}/{name}.s").read())
    assert s["version"] == one["version"], f"the {n}-rank dataset differs"
    ideal = min(n, cores)
    print(f"{n} ranks: {t:6.1f} s wall ({s['seconds']:5.1f} s in prepare; the rest is mpirun and MPI start-up), "
          f"{s['cpu_seconds']:5.1f} CPU-s; same version; speed-up in prepare {one['seconds'] / s['seconds']:.2f} "
          f"of {ideal} possible on {cores} cores ({one['seconds'] / s['seconds'] / ideal:.2f} of the ideal), "
          f"CPU {s['cpu_seconds'] / one['cpu_seconds']:.2f}x")
four = s
d = four["distributed"]
print(f"4 ranks exchanged {d['exchanged_bytes']/1e6:.1f} MB = {d['exchanged_bytes_per_input_byte']:.3f} bytes per input byte")
print(f"{'rank':>4}{'files':>7}{'MB in':>8}{'docs in':>9}{'docs out':>9}{'shards':>7}{'CPU-s':>7}{'MB sent':>9}")
for r in d["work_split"]:
    print(f"{r['rank']:>4}{r['files']:>7}{r['bytes_in']/1e6:>8.1f}{r['documents_in']:>9}{r['documents_out']:>9}"
          f"{r['shards_written']:>7}{r['cpu_seconds']:>7.1f}{r['bytes_sent']/1e6:>9.2f}")
PY
