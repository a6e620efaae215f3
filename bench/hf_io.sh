#!/usr/bin/env bash
# Hugging Face import/export benchmark (issue 40; docs/PERFORMANCE.md "Hugging Face import and export"), in
# one invocation: a Llama-shaped model of >= 1 GB in BF16 (bench/hf_model.py: 9 blocks of 2048, vocab
# 32000, two safetensors shards), then on the same disk in the same run:
#   - a sequential read of its files (page cache dropped first when root may),
#   - forge-ckpt import into an FP32 checkpoint (twice the bytes, fsynced),
#   - a sequential write (dd conv=fsync) of as many bytes as the checkpoint,
#   - forge-ckpt export --format hf (BF16 again) and a sequential write of as many bytes,
# with each command's peak resident memory (GNU time). Prints MB/s of each, the ratios import / read,
# import / (read + write of what it must write), export / write, peak memory / model size, and checks that
# the export reproduces every tensor's bytes.
#
# usage: bench/hf_io.sh [BUILD_DIR]   (default build/release; configured and forge-ckpt built if needed)
#   WORK=DIR (default: a temporary directory under /var/tmp, on disk) LAYERS=9 override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
layers=${LAYERS:-9}

if [ ! -f "$build/CMakeCache.txt" ]; then
  log=$(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release 2>&1) || { echo "$log" >&2; exit 1; }
fi
log=$(cmake --build "$build" --target forge-ckpt ${JOBS:+-j "$JOBS"} 2>&1) || { echo "$log" >&2; exit 1; }
ckpt=$build/ckpt/forge-ckpt

work=${WORK:-$(mktemp -d /var/tmp/forge-hf-bench-XXXXXX)}
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
model=$work/model

now() { date +%s.%N; }
calc() { awk "BEGIN { print $1 }"; }
# Drops the page cache (root) so that reads come from the disk; a no-op for other users.
cold() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 1 >/proc/sys/vm/drop_caches; fi
}
# Seconds to write BYTES sequentially to the benchmark's disk, fsynced.
write_s() {
  local t0 t1
  t0=$(now)
  dd if=/dev/zero of="$work/dd.bin" bs=16M count=$(($1 / 16777216 + 1)) conv=fsync status=none
  t1=$(now)
  rm -f "$work/dd.bin"
  calc "$t1 - $t0"
}
# Runs a command under GNU time; sets secs and rss_kb.
timed() {
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >"$work/out.txt"
  read -r secs rss_kb <"$work/time.txt"
}

machine "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), disk $(df -h "$work" | awk 'NR == 2 {print $1}')"
/usr/bin/python3 "$root/bench/hf_model.py" "$model" --layers "$layers" --shards 2
model_bytes=$(cat "$model"/*.safetensors | wc -c)
echo "model: Llama-shaped, $layers blocks of 2048, BF16, $(ls "$model"/*.safetensors | wc -l) files, $model_bytes bytes"

cold
t0=$(now)
cat "$model"/*.safetensors >/dev/null
t1=$(now)
read_s=$(calc "$t1 - $t0")

cold
timed "$ckpt" import "$model" --out "$work/ckpt"
import_s=$secs import_rss=$rss_kb
ckpt_bytes=$(cat "$work/ckpt"/rank-*.bin | wc -c)
ckpt_write_s=$(write_s "$ckpt_bytes")

timed "$ckpt" export "$work/ckpt" --format hf --out "$work/export"
export_s=$secs export_rss=$rss_kb
export_bytes=$(cat "$work/export"/*.safetensors | wc -c)
export_write_s=$(write_s "$export_bytes")

# The export holds every tensor's bytes as published (the headers may order their entries otherwise).
/usr/bin/python3 - "$model" "$work/export" <<'EOF'
import glob, json, struct, sys
def tensors(d):
    out = {}
    for p in sorted(glob.glob(d + "/*.safetensors")):
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
            for k, v in h.items():
                if k != "__metadata__":
                    f.seek(8 + n + v["data_offsets"][0])
                    out[k] = (v["dtype"], v["shape"], hash(f.read(v["data_offsets"][1] - v["data_offsets"][0])))
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a == b, "the export does not reproduce the model's tensors"
print(f"export check: {len(a)} tensors byte-identical to the model's")
EOF

mbps() { awk "BEGIN { printf \"%.0f\", $1 / $2 / 1000000 }"; }
ratio() { awk "BEGIN { printf \"%.2f\", $1 / $2 }"; }
echo
printf "%-44s %9s %10s %9s\n" "step" "seconds" "MB/s" "peak RSS"
printf "%-44s %9.2f %10s %9s\n" "sequential read of the model" "$read_s" "$(mbps "$model_bytes" "$read_s")" "-"
printf "%-44s %9.2f %10s %8.0fM\n" "forge-ckpt import (BF16 -> FP32 checkpoint)" "$import_s" \
  "$(mbps "$model_bytes" "$import_s")" "$(calc "$import_rss / 1024")"
printf "%-44s %9.2f %10s %9s\n" "sequential write of the checkpoint's bytes" "$ckpt_write_s" \
  "$(mbps "$ckpt_bytes" "$ckpt_write_s")" "-"
printf "%-44s %9.2f %10s %8.0fM\n" "forge-ckpt export --format hf (BF16)" "$export_s" \
  "$(mbps "$export_bytes" "$export_s")" "$(calc "$export_rss / 1024")"
printf "%-44s %9.2f %10s %9s\n" "sequential write of the export's bytes" "$export_write_s" \
  "$(mbps "$export_bytes" "$export_write_s")" "-"
echo
echo "import / sequential read:                     $(ratio "$read_s" "$import_s")x   (issue goal >= 0.8x)"
echo "import / (read + write of its checkpoint):    $(ratio "$(calc "$read_s + $ckpt_write_s")" "$import_s")x"
echo "export / sequential write:                    $(ratio "$export_write_s" "$export_s")x   (issue goal >= 0.8x)"
echo "peak memory / model size: import $(ratio "$((import_rss * 1024))" "$model_bytes")x, export $(ratio "$((export_rss * 1024))" "$model_bytes")x   (issue goal <= 1.1x)"
