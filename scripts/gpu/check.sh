#!/usr/bin/env bash
# The GPU check on one machine with an NVIDIA GPU (made for one H200; docs/GPU.md): builds the CUDA backend
# and runs forge-cuda-check `backend` first (the CUDA backend of the seam against the CPU backend, op by op,
# seconds; then one line per op of the model families: RMSNorm, SwiGLU, rotary positions, qk-norm,
# grouped-query and sliding-window attention; and of context parallelism: the chunk attention, its delta,
# copy_rows and convert), then forge-train itself on the GPU
# (scripts/gpu/train_check.sh: against the CPU, 2 ranks sharing the GPU, NCCL, checkpoints between GPU and
# CPU, SIGUSR1, GPT-2-124M and llm.c beside it; with the full project build only), then the full
# forge-cuda-check (every CUDA op against the CPU op, training against the CPU trainer, throughput and MFU
# last: GPT-2-124M and a Llama-family config, Llama-3-8B's blocks with 8 of its 32 layers at seq 4096, whose
# row is repeated at the end). Output goes to stdout and, when $OUT is set, to $OUT/gpu-check.txt. About 7
# minutes (docs/GPU.md, "Time"), within 10: the last run gets the time left and a deadline 20 s before its
# kill, by which the Llama run has stopped, so the table is always printed. Exit non-zero when a run failed.
#
# The machine may be bare: the CUDA toolkit (with NCCL) at /usr/local/cuda or nvcc on PATH is required.
# Build dependencies are found in this order:
#   1. the full project configure (-DFORGE_CUDA=ON) when every Debian -dev package is installed;
#   2. otherwise the standalone build in scripts/gpu/CMakeLists.txt (Boost program_options, fmt, xxHash,
#      OpenSSL, OpenBLAS, OpenMP only);
#   3. without CMake (or when both configures fail), the same sources compiled directly with nvcc and g++;
#   4. missing libraries may come as .deb files in $FORGE_GPU_DEBS (default: build-gpu-debs/ in the checkout,
#      see docs/GPU.md for the list), unpacked into a private prefix without root or network.
# Environment: OUT, FORGE_GPU_DEBS, FORGE_GPU_BUILD (build dir, default build-gpu), FORGE_GPU_JOBS (16),
# FORGE_GPU_CHECK_ARGS (extra forge-cuda-check arguments), FORGE_GPU_CHECK_TIMEOUT (seconds, 360),
# FORGE_GPU_DIRECT=1 (skip CMake), FORGE_GPU_PREBUILT (a folder from scripts/gpu/pack.sh: run, don't build),
# FORGE_GPU_PROFILE=1 (then a per-kernel time breakdown of one GPT-2-124M step with Nsight Compute),
# FORGE_GPU_NO_TRAIN=1 (skip train_check.sh), FORGE_GPU_TRAIN_TIMEOUT (its seconds, 300).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${FORGE_GPU_BUILD:-$root/build-gpu}
jobs=${FORGE_GPU_JOBS:-16}
debs=${FORGE_GPU_DEBS:-$root/build-gpu-debs}
log=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && log=$OUT/gpu-check.txt
  : >"$log"
fi

say() { echo "check.sh: $*" | tee -a "$log"; }
die() {
  say "error: $*"
  exit 1
}
start=$(date +%s)

# --- CUDA toolkit
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
elif command -v nvcc >/dev/null; then
  CUDA_HOME=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
  export CUDA_HOME
else
  die "no nvcc at /usr/local/cuda/bin or on PATH; install the CUDA toolkit (12.x or later, with NCCL)"
fi
export PATH=$CUDA_HOME/bin:$PATH
export LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "nvcc: $(nvcc --version | tail -1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
  sed 's/^/check.sh: gpu: /' | tee -a "$log"

# A shared library the toolkit may lack (NCCL ships apart from it; images often carry it only inside a
# Python wheel, nvidia-nccl-cu1x): the folder that holds it, searched where toolkits and wheels go.
find_lib_dir() {
  local d so
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$1" ] && echo "$d" && return 0
  done
  so=$(find /usr/local /opt /usr/lib /root -name "$1" 2>/dev/null | head -1)
  [ -n "$so" ] && dirname "$so"
}
nccl_dir=$(find_lib_dir libnccl.so.2) || die "no libnccl.so.2 in the CUDA toolkit or a Python wheel; install NCCL"
say "nccl: $nccl_dir"
export LD_LIBRARY_PATH=$nccl_dir:$LD_LIBRARY_PATH
if [ ! -f "$CUDA_HOME/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
  # A wheel's layout (lib/libnccl.so.2 beside include/nccl.h, no unversioned libnccl.so): point the
  # compilers there, through a folder holding the libnccl.so link the linker looks for.
  [ -f "$nccl_dir/../include/nccl.h" ] || say "warning: no nccl.h beside $nccl_dir: only a prebuilt check can run"
  shim=$root/build-gpu-nccl
  mkdir -p "$shim" && ln -sfn "$nccl_dir/libnccl.so.2" "$shim/libnccl.so"
  export CPATH=$nccl_dir/../include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$shim${LIBRARY_PATH:+:$LIBRARY_PATH}
  export CMAKE_LIBRARY_PATH=$shim${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}
fi

# --- .deb files carried in: unpacked into a prefix (dpkg -x, or ar + tar where dpkg is missing)
prefix=$root/build-gpu-prefix
if [ -d "$debs" ] && ls "$debs"/*.deb >/dev/null 2>&1; then
  if [ ! -f "$prefix/.unpacked" ]; then
    mkdir -p "$prefix"
    for deb in "$debs"/*.deb; do
      if command -v dpkg >/dev/null; then
        dpkg -x "$deb" "$prefix" || die "cannot unpack $deb"
      else
        member=$(ar t "$deb" | grep '^data\.tar') || die "cannot read $deb (no dpkg, no ar)"
        ar p "$deb" "$member" | tar -x -C "$prefix" --use-compress-program="$(case $member in *.zst) echo zstd -d ;; *.xz) echo xz -d ;; *) echo gzip -d ;; esac)" ||
          die "cannot unpack $deb"
      fi
    done
    # Absolute symlinks of -dev packages (libfoo.so -> /usr/lib/...) point outside the prefix: relink them.
    find "$prefix" -type l | while read -r link; do
      target=$(readlink "$link")
      case $target in /*) [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link" ;; esac
    done
    # pkg-config files name /usr as their prefix: point them at ours.
    find "$prefix" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$prefix/usr|" {} +
    touch "$prefix/.unpacked"
  fi
  lib=$prefix/usr/lib/x86_64-linux-gnu
  export PATH=$prefix/usr/bin:$PATH
  export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export PKG_CONFIG_PATH=$lib/pkgconfig:$prefix/usr/share/pkgconfig:$prefix/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$LD_LIBRARY_PATH
  export CPATH=$prefix/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  say "using .deb files from $debs ($(find "$debs" -name '*.deb' | wc -l) packages)"
fi

command -v g++ >/dev/null || die "missing g++ (Debian: apt-get install g++)"

# Without CMake: the standalone build's sources compiled directly (nvcc, g++), in parallel.
direct_build() {
  local obj=$build/direct lib=$prefix/usr/lib/x86_64-linux-gnu
  mkdir -p "$obj"
  local blas_inc="" d
  for d in "$prefix/usr/include/x86_64-linux-gnu/openblas-pthread" /usr/include/x86_64-linux-gnu/openblas-pthread \
    /usr/include/openblas; do
    [ -f "$d/cblas.h" ] && blas_inc="-I$d" && break
  done
  local inc="-I$root/common/include -I$root/comm/include -I$root/trainer/include -I$root/trainer/src"
  inc="$inc -I$root/trainer/cuda/include"
  inc="$inc -I$root/trainer/cuda/src -isystem $CUDA_HOME/include $blas_inc"
  # shellcheck disable=SC2089 # the define's quotes are meant literally: the macro is a string literal
  local cxx="g++ -std=c++20 -O3 -fPIC -fopenmp -march=native -fno-math-errno $inc -DFORGE_SOURCE_DIR=\"$root\""
  local nvcc_cmd="nvcc -std=c++20 -O3 --use_fast_math -Xcompiler=-fPIC -gencode arch=compute_90,code=sm_90"
  nvcc_cmd="$nvcc_cmd -gencode arch=compute_90,code=compute_90 $inc"
  # The sources of scripts/gpu/CMakeLists.txt (forge_common, forge_trainer, forge_parallel, trainer/cuda).
  local sources=("$root"/common/src/{batch,config,error,hash,huge_buffer,ini,json,layout,local_rank,text,activity,trace}.cpp
    "$root"/trainer/src/cpu/*.cpp
    "$root"/trainer/src/{attention,rope,init,layers,loss,model,moe,optimizer,guard,params,runtime,spec,objective,vision}.cpp
    "$root"/comm/src/{comm,groups}.cpp
    "$root"/trainer/src/parallel/{parallel_trainer,tensor_parallel,context_parallel,schedule}.cpp
    "$root"/trainer/cuda/src/*.cpp "$root"/trainer/cuda/src/*.cu "$root"/trainer/cuda/tools/*.cpp)
  local keep=() f
  for f in "${sources[@]}"; do [ "$f" = "$root/trainer/cuda/src/plugin.cpp" ] || keep+=("$f"); done
  sources=("${keep[@]}")
  # shellcheck disable=SC2090
  export cxx nvcc_cmd obj
  # shellcheck disable=SC2016
  printf '%s\n' "${sources[@]}" | xargs -P "$jobs" -I{} bash -c '
    src={}; o=$obj/$(echo "${src#/}" | tr / _).o
    case $src in *.cu) $nvcc_cmd -c "$src" -o "$o" ;; *) $cxx -c "$src" -o "$o" ;; esac' || return 1
  # shellcheck disable=SC2086
  g++ -fopenmp -o "$obj/forge-cuda-check" "$obj"/*.o -L"$CUDA_HOME/lib64" -L"$lib" -L"$lib/openblas-pthread" \
    -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lcublasLt -lnccl -lcudart -lboost_program_options -lfmt -lxxhash \
    -lcrypto -lopenblas -lpthread -ldl -lrt
}

exe=""
# A forge-cuda-check built elsewhere (scripts/gpu/pack.sh) saves the build when the loader finds all it needs.
prebuilt=${FORGE_GPU_PREBUILT:-}
if [ -n "$prebuilt" ] && [ -x "$prebuilt/forge-cuda-check" ]; then
  [ -f "$prebuilt/lib.tar.gz" ] && { tar -xzf "$prebuilt/lib.tar.gz" -C "$prebuilt" || die "cannot unpack $prebuilt/lib.tar.gz"; }
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$prebuilt/lib
  missing=$(ldd "$prebuilt/forge-cuda-check" | awk '/not found/ {print $1}')
  for name in $missing; do
    dir=$(find_lib_dir "$name") && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$dir
  done
  if ldd "$prebuilt/forge-cuda-check" | grep -q 'not found'; then
    say "prebuilt forge-cuda-check lacks $(ldd "$prebuilt/forge-cuda-check" | awk '/not found/ {printf "%s ", $1}')- building here"
  elif "$prebuilt/forge-cuda-check" --steps 0 >/dev/null 2>&1; [ $? -ne 64 ]; then
    say "prebuilt forge-cuda-check does not start here - building here"
  else
    exe=$prebuilt/forge-cuda-check
    say "using the prebuilt $exe"
  fi
fi
if [ -n "$exe" ]; then
  :
elif [ -z "${FORGE_GPU_DIRECT:-}" ] && command -v cmake >/dev/null; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  configure_log=$build.configure.log
  mkdir -p "$build"
  dir=""
  # The full project first, the standalone check build otherwise.
  if cmake -S "$root" -B "$build/full" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON \
    -DFORGE_WERROR=OFF >"$configure_log" 2>&1; then
    dir=$build/full
    say "configured the full project"
  else
    say "full configure failed ($(grep -m1 'missing dependency\|Could NOT find\|Error' "$configure_log" | sed 's/^ *//')); trying the standalone build"
    if cmake -S "$root/scripts/gpu" -B "$build/standalone" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      >>"$configure_log" 2>&1; then
      dir=$build/standalone
    else
      tail -n 20 "$configure_log" | tee -a "$log"
      say "standalone configure failed too; trying the direct build"
    fi
  fi
  if [ -n "$dir" ]; then
    say "building forge-cuda-check with -j$jobs (cmake)"
    if cmake --build "$dir" --target forge-cuda-check -j "$jobs" >"$build.build.log" 2>&1; then
      exe=$(find "$dir" -name forge-cuda-check -type f -perm -u+x | head -1)
    else
      grep -m 20 -E 'error|Error' "$build.build.log" | tee -a "$log"
      say "cmake build failed (full log: $build.build.log); trying the direct build"
    fi
  fi
else
  say "no cmake (or FORGE_GPU_DIRECT set): direct build"
fi
if [ -z "$exe" ]; then
  mkdir -p "$build"
  say "building forge-cuda-check with -j$jobs (direct nvcc/g++)"
  direct_build >"$build.direct.log" 2>&1 || {
    grep -m 20 -E 'error|cannot find|No such file' "$build.direct.log" | tee -a "$log"
    die "direct build failed (full log: $build.direct.log); carry the .deb files docs/GPU.md lists in \$FORGE_GPU_DEBS"
  }
  exe=$build/direct/forge-cuda-check
fi
say "built in $(($(date +%s) - start)) s: $exe"

# --- the CUDA backend against the CPU backend, op by op (forge-cuda-check backend): seconds, and run first so
# that a wrong op is the first failure in the log, before the long run below.
mkdir -p "$build"
timeout --signal=KILL 120 "$exe" backend 2>&1 | tee "$build/backend.txt" | tee -a "$log"
backend_rc=${PIPESTATUS[0]}
[ "$backend_rc" -eq 64 ] && say "this forge-cuda-check has no backend mode (a prebuilt from before it?)"
[ "$backend_rc" -eq 137 ] && say "forge-cuda-check backend killed after 120 s"
# The ops the model families brought, one line each from the table above (a line per compared output,
# ending in PASS or FAIL; an op that threw is one "(error)" line that fails): NAME|the lines' start.
while IFS='|' read -r name pattern; do
  n=$(grep -cE "^($pattern).* (PASS|FAIL)\$" "$build/backend.txt")
  pass=$(grep -cE "^($pattern).* PASS\$" "$build/backend.txt")
  if [ "$n" -eq 0 ]; then
    say "op $name: no lines (killed before it, or a forge-cuda-check from before the model families)"
  elif [ "$pass" -eq "$n" ]; then
    say "op $name: PASS ($n compared outputs)"
  else
    say "op $name: FAIL ($((n - pass)) of $n compared outputs)"
  fi
done <<'OPS'
rmsnorm (forward, FP32 and BF16 out; backward)|rmsnorm(_forward|_backward)?[ ]
residual + rmsnorm|residual_rmsnorm[_ ]
head_rmsnorm (qk-norm)|head_rmsnorm[_ ]
swiglu|swiglu[_ ]
rope (theta 500000, YaRN; forward and inverse)|rope[ ]
attention, grouped-query heads (FP32 kernel)|attention_(forward|backward) .*[0-9]+/[0-9]+ heads
attention, sliding window (FP32 kernel)|attention_(forward|backward) .*window
attention_decode, grouped-query heads and window|attention_decode .*(heads|window)
attention on tensor cores, grouped-query heads or window|bf16 products: attention_.*(heads|window).*tensor cores
attention on tensor cores, head dim 128 (WMMA)|bf16 products: attention_.*hd 128
attention with BF16 products on the FP32 kernel (documents, hd 40)|bf16 products: attention_.*(documents|hd 40)
context parallelism: chunk attention (merge, adds; grouped-query, documents, window)|attention_chunk_
context parallelism: attention_delta, copy_rows, convert|attention_delta|copy_rows|convert
sequence parallelism: norm weight-gradient partials, chunk sums|rmsnorm_backward_partials|layernorm_backward_partials|add_chunk_sums
ZeRO-2/3: release, acquire (granules unmapped and mapped again, the BF16 copy with them)|release|acquire
OPS
say "forge-cuda-check backend exit $backend_rc after $(($(date +%s) - start)) s"

# --- forge-train itself on the GPU, items a-g of docs/GPU.md (scripts/gpu/train_check.sh): it needs the full
# project's build (MPI, HDF5 and the other -dev packages), so a standalone or direct build skips it.
train_rc=0
if [ "${dir:-}" = "$build/full" ] && [ -z "${FORGE_GPU_NO_TRAIN:-}" ]; then
  if cmake --build "$dir" --target forge-train -j "$jobs" >>"$build.build.log" 2>&1; then
    timeout --signal=KILL "${FORGE_GPU_TRAIN_TIMEOUT:-300}" bash "$root/scripts/gpu/train_check.sh" \
      "$dir/launcher/forge-train" "$build/train-check" 2>&1 | tee -a "$log"
    train_rc=${PIPESTATUS[0]}
    [ "$train_rc" -eq 137 ] && say "train_check.sh killed after ${FORGE_GPU_TRAIN_TIMEOUT:-300} s"
  else
    grep -m 10 -E 'error|Error' "$build.build.log" | tee -a "$log"
    say "forge-train did not build: items a-g not run"
    train_rc=1
  fi
  say "train_check.sh exit $train_rc after $(($(date +%s) - start)) s"
else
  say "forge-train not built here (no full project configure): items a-g of docs/GPU.md not run"
fi

# --- the check
# A hang (a kernel, NCCL's init) must not eat the machine's time: the check gets what the budget leaves
# (at most 360 s, and the script's whole run within 10 minutes). Its --deadline, 20 s before the kill, stops
# the Llama run (or skips it) in time for the table to be printed; a forge-cuda-check from before the
# option (a prebuilt) runs without it.
left=$((570 - ($(date +%s) - start)))
limit=${FORGE_GPU_CHECK_TIMEOUT:-$((left < 360 ? (left > 60 ? left : 60) : 360))}
deadline=(--deadline "$((limit > 40 ? limit - 20 : limit / 2))")
case $("$exe" --deadline 1 --steps 0 2>&1) in *"unknown argument '--deadline'"*) deadline=() ;; esac
# shellcheck disable=SC2086
timeout --signal=KILL "$limit" "$exe" --config "$root/configs/bench-cpu.ini" "${deadline[@]}" ${FORGE_GPU_CHECK_ARGS:-} 2>&1 |
  tee "$build/check.txt" | tee -a "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 137 ] && say "forge-cuda-check killed after ${limit} s (FORGE_GPU_CHECK_TIMEOUT)"
# The Llama-family row of the throughput table (or why it was not run).
llama_row=$(grep -E '^llama3-8b-[0-9]+L +bf16 ' "$build/check.txt" | tail -1)
say "throughput, Llama family: ${llama_row:-no row (killed before the table, --no-llama, or a forge-cuda-check without it)}"
say "forge-cuda-check exit $rc after $(($(date +%s) - start)) s"
[ "$rc" -eq 0 ] && rc=$backend_rc
[ "$rc" -eq 0 ] && rc=$train_rc

# --- where one GPT-2-124M BF16 step's time goes (FORGE_GPU_PROFILE=1; Nsight Compute, ~1 minute): GPU time
# per kernel, summed over the step, largest first.
ncu=$(command -v ncu)
for candidate in "$CUDA_HOME"/bin/ncu "$CUDA_HOME"/nsight-compute*/ncu; do
  [ -z "$ncu" ] && [ -x "$candidate" ] && ncu=$candidate
done
if [ "${FORGE_GPU_PROFILE:-0}" = 1 ] && [ -n "$ncu" ]; then
  say "profiling one GPT-2-124M BF16 step with $ncu"
  timeout --signal=KILL 240 "$ncu" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
    --csv --page raw "$exe" --config "$root/configs/bench-cpu.ini" --profile >"$build.ncu.csv" 2>"$build.ncu.log" ||
    say "ncu failed: $(tail -n 3 "$build.ncu.log")"
  python3 - "$build.ncu.csv" <<'PY' 2>&1 | tee -a "$log"
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
head, units = rows[0], rows[1]
name, col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(units[col], 1e-6)
total, count = collections.Counter(), collections.Counter()
for r in rows[2:]:
    k = r[name].replace("(anonymous namespace)::", "").removeprefix("void ")
    k = k.split("(")[0].split("<")[0].split("::")[-1].strip()
    total[k] += float(r[col].replace(",", "")) * scale
    count[k] += 1
print(f"{'kernel':<60} {'calls':>5} {'ms/step':>8}")
for k, t in total.most_common(30):
    print(f"{k[:60]:<60} {count[k]:>5} {t:>8.3f}")
print(f"{'all kernels':<60} {sum(count.values()):>5} {sum(total.values()):>8.3f}")
PY
fi
exit "$rc"
