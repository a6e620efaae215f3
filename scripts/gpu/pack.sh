#!/usr/bin/env bash
# Builds forge-cuda-check here (a machine with the CUDA toolkit and the project's dependencies, no GPU needed)
# and packs it with the libraries a bare GPU machine may lack, so that check.sh there only runs it:
#   bash scripts/gpu/pack.sh [DIR]         # DIR defaults to build-gpu-prebuilt/
#   FORGE_GPU_PREBUILT=DIR bash scripts/gpu/check.sh   # on the GPU machine
# The CUDA libraries (cudart, cuBLASLt, NCCL) and the C/C++ runtime are left out: they must match the GPU
# machine's driver and system, and check.sh finds them there. Without CUDA here, check.sh builds there instead.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:-$root/build-gpu-prebuilt}
build=$root/build-gpu-pack
[ -x /usr/local/cuda/bin/nvcc ] || { echo "pack.sh: no /usr/local/cuda/bin/nvcc here; run check.sh on the GPU machine" >&2; exit 1; }
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON >/dev/null
cmake --build "$build" --target forge-cuda-check
rm -rf "$dest" && mkdir -p "$dest/lib"
cp "$build/trainer/cuda/forge-cuda-check" "$dest/"
ldd "$dest/forge-cuda-check" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | ld-linux*) ;;
    libcudart* | libcublas* | libnccl*) ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done
# Compressed to a third: the folder travels under a size limit (docs/GPU.md).
tar -czf "$dest/lib.tar.gz" -C "$dest" lib && rm -rf "${dest:?}/lib"
echo "pack.sh: $dest ($(du -sh "$dest" | cut -f1)): forge-cuda-check and lib.tar.gz"
