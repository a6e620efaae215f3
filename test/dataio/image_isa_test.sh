#!/usr/bin/env bash
# Resampling gives the same bytes on every CPU: image_isa prints one digest of fitted pictures and perceptual
# hashes, from the library as built (its clones, one picked by this CPU) and from image.cpp built for plain
# x86-64 (SSE2), AVX2 and AVX-512 alone; all must agree.
# usage: image_isa_test.sh LIBRARY_BINARY X86_64_BINARY X86_64_V3_BINARY X86_64_V4_BINARY
set -euo pipefail
want=$("$1")
echo "library:   $want"
for isa in "x86-64:sse2:$2" "x86-64-v3:avx2:$3" "x86-64-v4:avx512f:$4"; do
  IFS=: read -r name flag binary <<<"$isa"
  if ! grep -qw "$flag" /proc/cpuinfo; then
    echo "$name: this CPU has no $flag; not compared"
    continue
  fi
  got=$("$binary")
  echo "$name: $got"
  if [[ $got != "$want" ]]; then
    echo "FAIL: image.cpp built for $name alone resamples to other bytes than the library" >&2
    exit 1
  fi
done
