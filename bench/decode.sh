#!/usr/bin/env bash
# Decoding benchmark, in one invocation: greedy generation on the trainer benchmark's model
# (configs/bench-cpu.ini: 6 layers, d_model 384, 6 heads, vocab 8192, 256 positions, FP32, 2 threads,
# random weights) with the KV cache against recomputing the prefix every step (bench_decode: same
# kernels, same tokens, checked), forge::gate::Generator at batch 1 and 8, the machine's read bandwidth
# and how much of it batch-1 decoding uses, a per-step profile; then the PyTorch peer (Debian's
# python3-torch, installed here if missing) decoding the same shapes with a past-key-values loop. Prints
# tokens/s of each, the ratio KV / recompute (issue goal: >= 20x) and forge / PyTorch. Then (issue 39) a
# Llama-family model (4 layers, d_model 512, 8 heads, 2048 positions) with multi-head attention against the
# same with grouped-query attention (2 key/value heads), 8 sequences decoding positions 1024-1151: tokens/s
# of each, their ratio (goal >= 1.3x) and the KV caches' bytes (goal 1/4).
#
# usage: bench/decode.sh [BUILD_DIR]    (default build/release; configured and bench_decode built if needed)
#   THREADS=2 REPS=3 JOBS=N (build parallelism) NO_TORCH=1 (skip the peer) NO_GQA=1 (skip the GQA
#   comparison) GQA_ONLY=1 (only it: no GPT-2 runs, no peer) override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
threads=${THREADS:-2}
reps=${REPS:-3}
bin=$build/bench/bench_decode
mode=()  # bench_decode options: the GQA comparison with the rest, skipped, or alone
if [ -n "${GQA_ONLY:-}" ]; then
  mode=(--gqa-only)
  NO_TORCH=1
elif [ -n "${NO_GQA:-}" ]; then
  mode=(--no-gqa)
fi

# Build what is missing or stale (ninja makes this a no-op when it is up to date).
if [ ! -f "$build/CMakeCache.txt" ]; then
  log=$(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release 2>&1) || { echo "$log" >&2; exit 1; }
fi
log=$(cmake --build "$build" --target bench_decode ${JOBS:+-j "$JOBS"} 2>&1) || { echo "$log" >&2; exit 1; }

# The PyTorch peer's dependency, idempotently (bench/lib.sh); without it, no peer.
source "$(dirname "$0")/lib.sh"
torch_ok=0
if [ -z "${NO_TORCH:-}" ]; then
  ensure_torch decode
  /usr/bin/python3 -c 'import torch' 2>/dev/null && torch_ok=1
fi

machine
rc=0
ours=$("$bin" --threads "$threads" --reps "$reps" "${mode[@]}") || rc=$?
echo "$ours"
if [ $rc -ne 0 ]; then
  echo "decode.sh: bench_decode failed (exit $rc)" >&2
  exit $rc
fi

theirs=""
if [ $torch_ok -eq 1 ]; then
  # PyTorch: the trainer bench peer's GPT (shared/bench/torch_gpt_cpu.py), with a key/value cache
  # preallocated per block and written in place; greedy, batch 1, 1-token prompt to the last position.
  theirs=$(OMP_NUM_THREADS=$threads /usr/bin/python3 - "$threads" "$reps" <<'PY'
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
threads, reps = int(sys.argv[1]), int(sys.argv[2])
L, C, H, V, T = 6, 384, 6, 8192, 256
torch.set_num_threads(threads)
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
        s.ln2 = nn.LayerNorm(C); s.fc = nn.Linear(C, 4 * C); s.fc2 = nn.Linear(4 * C, C)
    def forward(s, x, pos, k_cache, v_cache):  # x [1, n, C] at positions pos .. pos + n - 1
        B, n, _ = x.shape
        q, k, v = [t.view(B, n, H, C // H).transpose(1, 2) for t in s.qkv(s.ln1(x)).split(C, dim=2)]
        k_cache[:, :, pos:pos + n] = k; v_cache[:, :, pos:pos + n] = v
        k, v = k_cache[:, :, :pos + n], v_cache[:, :, :pos + n]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        if n > 1:
            att = att.masked_fill(torch.triu(torch.ones(n, pos + n, dtype=torch.bool), pos + 1), float('-inf'))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, n, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate='tanh'))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block() for _ in range(L)]); s.lnf = nn.LayerNorm(C)
    def forward(s, idx, pos, cache):  # logits of the last row
        x = s.wte(idx) + s.wpe(torch.arange(pos, pos + idx.shape[1]))
        for b, (kc, vc) in zip(s.blocks, cache): x = b(x, pos, kc, vc)
        return s.lnf(x[:, -1]) @ s.wte.weight.t()

m = GPT().eval()
cache = [(torch.zeros(1, H, T, C // H), torch.zeros(1, H, T, C // H)) for _ in range(L)]

def generate(n_new):
    tok = torch.tensor([[1]])
    out = []
    t0 = time.perf_counter()
    for pos in range(n_new):
        tok = m(tok, pos, cache).argmax(-1, keepdim=True)
        out.append(int(tok))
    return time.perf_counter() - t0

with torch.inference_mode():
    generate(32)  # warm-up
    best = min(generate(T - 1) for _ in range(reps))
print(f"torch {torch.__version__} kv_cache prompt=1 new_tokens={T - 1} seconds={best:.3f} "
      f"tokens_per_s={(T - 1) / best:.1f} ms_per_token={1e3 * best / (T - 1):.3f}")
PY
  )
  echo "pytorch $theirs"
fi
load_after

val() { sed -n "s/^$1 .*$2=\([0-9.]*\).*/\1/p" <<<"$3" | head -1; }
gqa_summary() {  # the GQA comparison's lines, when it ran
  local line
  line=$(grep '^gqa_summary ' <<<"$ours") || return 0
  local mha gqa ratio mkv gkv kvr
  mha=$(sed -n 's/.* mha_tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
  gqa=$(sed -n 's/.* gqa_tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
  ratio=$(sed -n 's/.* ratio=\([0-9.]*\).*/\1/p' <<<"$line")
  mkv=$(sed -n 's/.* mha_kv_bytes=\([0-9]*\).*/\1/p' <<<"$line")
  gkv=$(sed -n 's/.* gqa_kv_bytes=\([0-9]*\).*/\1/p' <<<"$line")
  kvr=$(sed -n 's/.* kv_bytes_ratio=\([0-9.]*\).*/\1/p' <<<"$line")
  echo
  printf '%-38s %12s %14s\n' "Llama, batch 8, positions 1024-1151" "tokens/s" "KV cache MiB"
  printf '%-38s %12s %14s\n' "MHA (8 key/value heads)" "$mha" "$(awk -v b="$mkv" 'BEGIN { print b / 1048576 }')"
  printf '%-38s %12s %14s\n' "GQA (2 key/value heads)" "$gqa" "$(awk -v b="$gkv" 'BEGIN { print b / 1048576 }')"
  echo "ratio GQA / MHA = ${ratio}x tokens/s (goal >= 1.3x); KV bytes ${kvr} of MHA's (goal 0.25)"
}
if [ -n "${GQA_ONLY:-}" ]; then
  gqa_summary
  exit 0
fi
kv=$(val kv_cache tokens_per_s "$ours")
re=$(val recompute tokens_per_s "$ours")
kv64=$(grep '^kv_cache prompt=64' <<<"$ours" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
re64=$(grep '^recompute prompt=64' <<<"$ours" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
g1=$(grep '^generator batch=1 ' <<<"$ours" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
g8=$(grep '^generator batch=[0-9]* .*per_sequence' <<<"$ours" | sed -n 's/.* tokens_per_s=\([0-9.]*\) .*/\1/p')
frac=$(sed -n 's/^limit: .*of_read_bandwidth=\([0-9.]*\)%.*/\1/p' <<<"$ours")
bw=$(sed -n 's/^bandwidth: read_[0-9]*mib_gbs=\([0-9.]*\).*/\1/p' <<<"$ours")
tt=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$theirs")
fw=$(val fixed_window_forward tokens_per_s "$ours")
ra=$(val recompute_all_logits tokens_per_s "$ours")
rb=$(grep '^recompute batch=' <<<"$ours" | sed -n 's/.* tokens_per_s=\([0-9.]*\) .*/\1/p')
ratio_b=$(sed -n 's/^ratio batch=[0-9]* kv_over_recompute=\([0-9.]*\).*/\1/p' <<<"$ours")
echo
printf '%-38s %12s\n' "" "tokens/s"
printf '%-38s %12s\n' "forge KV cache, batch 1, prompt 1" "$kv"
printf '%-38s %12s\n' "forge recompute prefix, prompt 1" "$re"
printf '%-38s %12s\n' "forge KV cache, batch 1, prompt 64" "$kv64"
printf '%-38s %12s\n' "forge recompute prefix, prompt 64" "$re64"
printf '%-38s %12s\n' "forge recompute, all logits, prompt 1" "$ra"
printf '%-38s %12s\n' "forge 256-position forward per token" "$fw"
printf '%-38s %12s\n' "Generator batch 1" "$g1"
printf '%-38s %12s\n' "Generator batch 8 (all sequences)" "$g8"
printf '%-38s %12s\n' "recompute batch 8 (all sequences)" "$rb"
[ -n "$tt" ] && printf '%-38s %12s\n' "PyTorch KV cache, batch 1, prompt 1" "$tt"
awk -v rb_ratio="$ratio_b" -v kv="$kv" -v re="$re" -v ra="$ra" -v fw="$fw" -v kv64="$kv64" -v re64="$re64" -v tt="$tt" -v f="$frac" -v bw="$bw" 'BEGIN {
  printf "ratio KV / recompute = %.2fx at prompt 1, %.2fx at prompt 64, batch 1; %sx at batch 8 (goal >= 20x)\n", kv / re, kv64 / re64, rb_ratio
  printf "  (against the recompute with all logits %.2fx, against a 256-position forward per token %.2fx)\n", kv / ra, kv / fw
  printf "batch-1 decoding moves %.1f%% of the measured %.1f GB/s read bandwidth\n", f, bw
  if (tt != "") printf "ratio forge / PyTorch (KV cache, batch 1) = %.2fx\n", kv / tt }'
gqa_summary
