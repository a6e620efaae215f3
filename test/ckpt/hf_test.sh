#!/usr/bin/env bash
# Hugging Face import and export end to end on the real binaries (docs/CHECKPOINTS.md), against tiny
# random models of every family written by test/ckpt/reference/hf_models.py (its own safetensors writer and
# reader, and make_families.py's float64 forward):
#   a) import (its model record as config.json says), then export in the default dtype: every tensor the
#      same bytes as the original's (by name, whatever the header's order or the sharding), an equivalent
#      config.json, the generation and tokenizer files unchanged; exported again in shards (--shard-size:
#      files, index, total_size) and in the other 16-bit type (bytes as torch rounds them);
#   b) import(export(c)) is c: the two checkpoints' /param tensors bit-identical (forge-ckpt export to HDF5);
#   c) parity: forge-train from the imported checkpoint (ckpt.init_from; optim.lr 1e-30, as lr 0 is refused
#      and that moves no weight of magnitude over 2^-76) saves step 1, whose verification loss is the
#      reference's float64 loss of the ORIGINAL files on that checkpoint's verify-batch.bin; a run with a
#      real learning rate logs the original's loss at step 1 (the weights before the update) and its step-1
#      checkpoint, exported with --format hf, gives the reference its verification loss;
#   d) hostile inputs: each import refused with 65 naming the file, tensor or key, and nothing left at --out;
#      a non-empty --out is 64 without --force (import and export);
#   e) ckpt.init_vision_from: a SigLIP tower in a vision-language model's encoder, bit for bit on tp 2.
# Families x dtype x files: every family in F32 and in BF16, single files and shards (4 to 3 files).
# Tolerance of (c): |reference - forge| <= 1e-6 x max(1, |forge|) (see RTOL below).
# Skipped (exit 0, "SKIP:") only when Debian's python3-torch, numpy or h5py are missing
# (scripts/install-deps.sh installs them).
# Usage: hf_test.sh FORGE_TRAIN FORGE_CKPT SOURCE_DIR
set -uo pipefail
train=$1 ckpt=$2 src=$3
py=/usr/bin/python3
ref=$src/test/ckpt/reference/hf_models.py
if ! "$py" -c 'import torch, numpy, h5py' 2>/dev/null; then
  echo "SKIP: the Hugging Face reference models need Debian's python3-torch, python3-numpy and python3-h5py" \
    "for $py (scripts/install-deps.sh installs them)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# FP32 forge against the float64 reference on the same stored weights. The loss is the mean of 64
# cross-entropies of ~4.6 from logits that float32 gets right to ~1e-7 of their size; measured differences
# are 1e-9 to 2e-8 relative for the verification loss (a double sum of float32 terms) and up to 5e-8 for
# the logged step loss (rounded to float32: 6e-8 at most). 1e-6 is the bound forge itself puts on replaying
# a verification batch on the same layout and device (launcher/src/checkpointing.cpp), and the float64
# reference is closer to the exact value than either FP32 run: 20x above the worst difference seen, and
# below what a misread config changes in these models (norm_eps x10: 5e-5 to 5e-4; rotary theta or llama3
# scaling: 1e-4 to 7e-4; no window: 2.4e-5; mixtral gates not renormalised: 2e-5; a swapped or transposed
# tensor: 1e-2 and more). The one smaller effect, qwen2_moe's norm_topk_prob (1.2e-6), is checked exactly
# by model-config against the checkpoint's model record.
RTOL=1e-6
VOCAB=96
SEQ=32
SHARD=16384
# family dtype files (1: model.safetensors; N: N shards with model.safetensors.index.json)
cases=(
  "llama f32 1" "llama bf16 3"
  "qwen2 f32 2" "qwen2 bf16 1"
  "qwen3 f32 1" "qwen3 bf16 1"
  "mistral f32 1" "mistral bf16 2"
  "mixtral f32 2" "mixtral bf16 1"
  "qwen2_moe f32 1" "qwen2_moe bf16 2"
  "gpt2 f32 1" "gpt2 bf16 2"
  "llava f32 1" "llava bf16 2"
)
# LLaVA (a llama model with a SigLIP tower and projector) is trained on the synthetic stream's pictures; its
# trained checkpoint is not exported (c's last check): that needs a tokenizer with <image>, which the
# synthetic stream has none of.
n_llava=2

# The originals, in one process (torch is imported once).
for c in "${cases[@]}"; do
  read -r fam dtype files <<<"$c"
  more=""  # the F32 ones carry tokenizer files too; GPT-2's is named as the hub's gpt2 (no "transformer.")
  [ "$dtype" = f32 ] && more=--tokenizer
  [ "$fam-$dtype" = gpt2-f32 ] && more="$more --legacy-names"
  [ "$fam-$dtype" = llava-bf16 ] && more="$more --new-names"  # transformers >= 4.52's names
  echo "write --family $fam --dtype $dtype --shards $files --vocab $VOCAB --out $work/hf/$fam-$dtype $more"
done | "$py" "$ref" batch || fail "hf_models.py write"

# A job spec that starts from an imported checkpoint: the [model] (and [vision]) section the import printed
# (its seq_len is the job's), the synthetic stream, one step saved as a recovery checkpoint.
job() {  # OUT_INI IMPORT_STDOUT CKPT LR
  {
    printf '[run]\nname = hf\nsteps = 1\nseed = 11\nthreads = 1\npeak_gflops = 100\n'
    sed -n '/^\[model\]$/,$p' "$2" | sed "1a seq_len = $SEQ"  # (a [vision] section may follow)
    printf '[data]\ndataset = synthetic\nbatch = 2\n'
    printf '[optim]\nlr = %s\nmin_lr = 0\nwarmup_steps = 0\n' "$4"
    printf '[precision]\ndtype = fp32\n'
    printf '[parallel]\ntp = 1\npp = 1\ndp = 1\nmicrobatches = 1\n'
    printf '[ckpt]\ninit_from = %s\nrecovery_every = 1\n' "$3"
  } >"$1"
}

checks=$work/checks.txt
mkdir -p "$work/h5"
: >"$checks"
for c in "${cases[@]}"; do
  read -r fam dtype files <<<"$c"
  id=$fam-$dtype
  hf=$work/hf/$id
  "$ckpt" import "$hf" --out "$work/ck/$id" >"$work/$id.import" 2>"$work/$id.import.err" ||
    fail "$id: import failed: $(cat "$work/$id.import.err")"
  # (a GPT-2 record names no family: gpt2 is model.family's default; LLaVA's language model is a llama)
  want_family=$fam
  [ "$fam" = llava ] && want_family=llama
  if [ "$fam" = llava ] && ! grep -q '^\[vision\]$' "$work/$id.import"; then
    fail "$id: the import printed no [vision] section: $(cat "$work/$id.import")"
  fi
  if ! grep -q '^\[model\]$' "$work/$id.import" || { ! grep -q "^family = $want_family$" "$work/$id.import" &&
    { [ "$fam" != gpt2 ] || grep -q "^family = " "$work/$id.import"; }; }; then
    fail "$id: the import printed no [model] section of family $fam: $(cat "$work/$id.import")"
  fi
  [ -f "$work/ck/$id/COMMITTED" ] || fail "$id: the imported checkpoint is not committed"
  # a) the default dtype is the imported one: the same bytes
  "$ckpt" export "$work/ck/$id" --format hf --out "$work/ex/$id" >/dev/null 2>"$work/$id.export.err" ||
    fail "$id: export --format hf failed: $(cat "$work/$id.export.err")"
  echo "model-config $work/ck/$id $hf" >>"$checks"
  echo "compare-hf $hf $work/ex/$id" >>"$checks"
  # ... in shards of at most SHARD bytes of tensors, and in the other 16-bit type (rounded to nearest even)
  "$ckpt" export "$work/ck/$id" --format hf --shard-size $SHARD --out "$work/exs/$id" >/dev/null 2>"$work/$id.export.err" ||
    fail "$id: export --format hf --shard-size $SHARD failed: $(cat "$work/$id.export.err")"
  echo "compare-hf $hf $work/exs/$id --shards-of $SHARD" >>"$checks"
  other=bf16
  [ "$dtype" = bf16 ] && other=f16
  "$ckpt" export "$work/ck/$id" --format hf --dtype $other --out "$work/ex-$other/$id" >/dev/null 2>"$work/$id.export.err" ||
    fail "$id: export --format hf --dtype $other failed: $(cat "$work/$id.export.err")"
  echo "compare-hf $hf $work/ex-$other/$id --convert $other" >>"$checks"
  # b) import(export(c)) = c, through the sharded export
  "$ckpt" import "$work/exs/$id" --out "$work/ck2/$id" >/dev/null 2>"$work/$id.import2.err" ||
    fail "$id: import of the export failed: $(cat "$work/$id.import2.err")"
  for k in ck ck2; do
    "$ckpt" export "$work/$k/$id" --out "$work/h5/$k-$id.h5" --params-only >/dev/null 2>"$work/$id.h5.err" ||
      fail "$id: HDF5 export of $k failed: $(cat "$work/$id.h5.err")"
  done
  echo "same-params $work/h5/ck-$id.h5 $work/h5/ck2-$id.h5" >>"$checks"
  # c) parity, with the weights unchanged (lr 1e-30), then after one real step
  for run in still moved; do
    lr=1e-30
    [ $run = moved ] && lr=3e-3
    job "$work/$id-$run.ini" "$work/$id.import" "$work/ck/$id" $lr
    "$train" "$work/$id-$run.ini" --run.dir="$work/run/$id-$run" 2>"$work/$id-$run.log" ||
      fail "$id: forge-train ($run) from the imported checkpoint failed: $(tail -n 3 "$work/$id-$run.log")"
  done
  still=$work/run/$id-still/checkpoints/recovery/step-00000001
  moved=$work/run/$id-moved/checkpoints/recovery/step-00000001
  for k in "$still" "$moved"; do
    [ -f "$k/verify-batch.bin" ] || fail "$id: no step-1 checkpoint with its batch at $k"
  done
  echo "loss --dir $hf --batch $still/verify-batch.bin --expect-verification $still --rtol $RTOL" >>"$checks"
  step1=$(python3 -c 'import json, sys; print(repr(json.loads(open(sys.argv[1]).readline())["loss"]))' \
    "$work/run/$id-moved/metrics/rank-0.jsonl")
  [ -n "$step1" ] || fail "$id: no step-1 loss in the moved run's metrics"
  echo "loss --dir $hf --batch $moved/verify-batch.bin --expect $step1 --expect-what step-1-loss --rtol $RTOL" >>"$checks"
  if [ "$fam" != llava ]; then
    "$ckpt" export "$moved" --format hf --dtype f32 --out "$work/ex-moved/$id" >/dev/null 2>"$work/$id.export3.err" ||
      fail "$id: export --format hf of the trained checkpoint failed: $(cat "$work/$id.export3.err")"
    echo "loss --dir $work/ex-moved/$id --batch $moved/verify-batch.bin --expect-verification $moved --rtol $RTOL" >>"$checks"
  fi
  # the step moved the weights, so the last check is not the first one again
  python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["verification"]["loss"]; s = float(sys.argv[2])
sys.exit(abs(v - s) < 1e-4 * abs(s))' "$moved/manifest.json" "$step1" ||
    fail "$id: a step with lr 3e-3 left the loss at $step1"
done
"$py" "$ref" batch <"$checks" >"$work/checks.out" 2>&1 || fail "the reference checks:
$(cat "$work/checks.out")"
n_ok=$(grep -c '^ok: ' "$work/checks.out")
[ "$n_ok" -eq $((3 * ${#cases[@]} - n_llava)) ] ||
  fail "expected $((3 * ${#cases[@]} - n_llava)) loss checks ok, got $n_ok: $(cat "$work/checks.out")"
[ "$(grep -c '^same tensors' "$work/checks.out")" -eq $((3 * ${#cases[@]})) ] || fail "compare-hf: $(cat "$work/checks.out")"
[ "$(grep -c '^bit-identical' "$work/checks.out")" -eq ${#cases[@]} ] || fail "same-params: $(cat "$work/checks.out")"
[ "$(grep -c '^model config of' "$work/checks.out")" -eq ${#cases[@]} ] || fail "model-config: $(cat "$work/checks.out")"
grep '^ok: ' "$work/checks.out" | sed 's/^/  /'

# e) a SigLIP tower starts a vision-language model's encoder (ckpt.init_vision_from): the LLaVA original's
#    tower as a SiglipVisionModel in BF16 (SigLIP's names, its final norm and a pooling head the model does
#    not use), one step with the encoder frozen on tp 2 (the LLaVA model, post_norm off) and on one process
#    with post_norm on: every vision.* parameter of the step-1 checkpoint is SigLIP's tensor bit for bit
#    (vision.ln_post its final norm), and the lineage names the directory; a tower of another shape, or a
#    model without one, is 64 naming the key, a tower missing a tensor 65 naming it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
siglip=$work/siglip
"$py" "$ref" siglip --llava "$work/hf/llava-f32" --dtype bf16 --out "$siglip" || fail "hf_models.py siglip"
job "$work/vis.ini" "$work/llava-f32.import" "" 3e-3
vis=(--ckpt.init_vision_from="$siglip" --train.freeze=vision)
mpirun -np 2 "$train" "$work/vis.ini" --run.dir="$work/run/vis-tp2" --parallel.tp=2 "${vis[@]}" \
  2>"$work/vis-tp2.log" || fail "forge-train on tp 2 from the SigLIP tower: $(tail -n 3 "$work/vis-tp2.log")"
"$train" "$work/vis.ini" --run.dir="$work/run/vis-post" --vision.post_norm=on "${vis[@]}" \
  2>"$work/vis-post.log" || fail "forge-train with post_norm from the SigLIP tower: $(tail -n 3 "$work/vis-post.log")"
: >"$work/vis-checks.txt"
for run in vis-tp2 vis-post; do
  k=$work/run/$run/checkpoints/recovery/step-00000001
  "$ckpt" export "$k" --out "$work/h5/$run.h5" --params-only >/dev/null 2>"$work/$run.h5.err" ||
    fail "$run: HDF5 export failed: $(cat "$work/$run.h5.err")"
  echo "same-tower $work/h5/$run.h5 $siglip" >>"$work/vis-checks.txt"
  python3 -c 'import json, sys; o = json.load(open(sys.argv[1]))["extra"]["lineage"]["vision_from"]
sys.exit(not (o["source"] == sys.argv[2] and o["architecture"] == "SiglipVisionModel" and
              o["model_id"] == "forge-test/siglip-tiny" and len(o["files"]["model.safetensors"]) == 64))' \
    "$k/manifest.json" "$(realpath "$siglip")" ||
    fail "$run: the lineage does not record the SigLIP tower: $(grep -o '"lineage".*' "$k/manifest.json" | head -c 600)"
done
"$py" "$ref" batch <"$work/vis-checks.txt" >"$work/vis-checks.out" 2>&1 ||
  fail "the SigLIP tower is not what the checkpoints hold: $(cat "$work/vis-checks.out")"
{ grep -q '(27 parameters)' "$work/vis-checks.out" && grep -q '(29 parameters)' "$work/vis-checks.out"; } ||
  fail "same-tower: expected the 27 parameters of the tower and the 29 with its final norm: $(cat "$work/vis-checks.out")"
lost=vision_model.encoder.layers.1.mlp.fc2.bias
"$py" "$ref" siglip --llava "$work/hf/llava-f32" --dtype f32 --drop $lost --out "$work/siglip-lost" ||
  fail "hf_models.py siglip --drop"
for bad in "--vision.mlp_hidden=32 $siglip 64 vision.mlp_hidden" "--vision.layers=0 $siglip 64 ckpt.init_vision_from" \
  "--run.seed=11 $work/siglip-lost 65 $lost"; do
  read -r arg dir code key <<<"$bad"
  "$train" "$work/vis.ini" --run.dir="$work/run/vis-bad" "$arg" --ckpt.init_vision_from="$dir" >/dev/null \
    2>"$work/vis-bad.err"
  got=$?
  [ $got -eq "$code" ] || fail "init_vision_from $dir with $arg: exit $got, expected $code: $(tail -n 2 "$work/vis-bad.err")"
  grep -q -- "$key" "$work/vis-bad.err" || fail "init_vision_from $dir with $arg: the message does not name $key: $(tail -n 2 "$work/vis-bad.err")"
  [ ! -e "$work/run/vis-bad/checkpoints" ] || fail "a refused init_vision_from left checkpoints behind"
done

# d) hostile inputs: exit 65, the message naming what is wrong, nothing left where --out was to be.
"$py" "$ref" hostile --out "$work/hostile" --case all >"$work/hostile.txt" || fail "hf_models.py hostile"
[ "$(wc -l <"$work/hostile.txt")" -ge 13 ] || fail "too few hostile cases: $(cat "$work/hostile.txt")"
while IFS=$'\t' read -r case code patterns; do
  mkdir -p "$work/hout/$case"
  out=$work/hout/$case/ckpt
  "$ckpt" import "$work/hostile/$case" --out "$out" >"$work/hout/$case.out" 2>"$work/hout/$case.err"
  got=$?
  [ "$got" -eq "$code" ] || fail "hostile $case: exit $got, expected $code: $(cat "$work/hout/$case.err")"
  IFS=$'\t' read -r -a pats <<<"$patterns"
  for p in "${pats[@]}"; do
    grep -Eq -- "$p" "$work/hout/$case.err" || fail "hostile $case: the message does not name /$p/: $(cat "$work/hout/$case.err")"
  done
  [ -z "$(ls -A "$work/hout/$case")" ] || fail "hostile $case: left $(ls -A "$work/hout/$case") behind"
  grep -q 'Traceback\|terminate called\|Aborted' "$work/hout/$case.err" && fail "hostile $case: crashed: $(cat "$work/hout/$case.err")"
done <"$work/hostile.txt"

# A non-empty --out: 64 without --force and untouched; --force replaces it. An empty one is used.
model=$work/hf/llama-f32
mkdir -p "$work/busy" && echo keep >"$work/busy/file"
"$ckpt" import "$model" --out "$work/busy" >/dev/null 2>"$work/busy.err"
got=$?
[ $got -eq 64 ] || fail "import into a non-empty --out: exit $got, expected 64: $(cat "$work/busy.err")"
grep -q "busy" "$work/busy.err" || fail "import into a non-empty --out: the message does not name it: $(cat "$work/busy.err")"
[ "$(cat "$work/busy/file")" = keep ] || fail "a refused import touched --out"
[ "$(ls -A "$work/busy")" = file ] || fail "a refused import left something in --out: $(ls -A "$work/busy")"
"$ckpt" import "$model" --out "$work/busy" --force >/dev/null 2>"$work/busy.err" || fail "import --force: $(cat "$work/busy.err")"
[ -f "$work/busy/COMMITTED" ] || fail "import --force wrote no committed checkpoint"
[ ! -e "$work/busy/file" ] || fail "import --force kept what --out held"
mkdir "$work/empty"
"$ckpt" import "$model" --out "$work/empty" >/dev/null 2>"$work/empty.err" || fail "import into an empty --out: $(cat "$work/empty.err")"
mkdir -p "$work/busy-ex" && echo keep >"$work/busy-ex/file"
"$ckpt" export "$work/busy" --format hf --out "$work/busy-ex" >/dev/null 2>"$work/busy-ex.err"
got=$?
[ $got -eq 64 ] || fail "export into a non-empty --out: exit $got, expected 64: $(cat "$work/busy-ex.err")"
grep -q "busy-ex" "$work/busy-ex.err" || fail "export into a non-empty --out: the message does not name it: $(cat "$work/busy-ex.err")"
[ "$(ls -A "$work/busy-ex")" = file ] || fail "a refused export touched --out"
"$ckpt" export "$work/busy" --format hf --out "$work/busy-ex" --force >/dev/null 2>"$work/busy-ex.err" ||
  fail "export --force: $(cat "$work/busy-ex.err")"
[ -f "$work/busy-ex/model.safetensors" ] || fail "export --force wrote no model.safetensors"
[ ! -e "$work/busy-ex/file" ] || fail "export --force kept what --out held"
echo "PASS: ${#cases[@]} models imported, exported and trained from; $(wc -l <"$work/hostile.txt") hostile inputs refused"
