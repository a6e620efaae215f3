#!/usr/bin/env bash
# An imported Hugging Face model in forge-gate: a tiny Llama model (test/ckpt/reference/hf_models.py) made a
# chat model with Qwen2's tokenizer, Qwen2.5-Instruct's template and generation_config.json, whose next
# token depends on the last one only (hf_chat_model.py: from the generation prompt it writes "Hello world",
# <|im_end|>, "</turn>", "!"...), imported with forge-ckpt import. Checks:
#  - forge-gate generate --chat renders prompts (a user turn, or a conversation from --prompts) with the
#    checkpoint's own template and tokenizer: the prompt ids are the independent reference's encoding of
#    jinja2's rendering; the reply stops at the template's end-of-turn token, left out of the text;
#  - --template with turns ending "</turn>" (several tokens): the reply stops when its text ends with it,
#    and the text leaves it out; without --chat only generation_config.json's eos stops;
#  - a fine-tune of the import (forge-train, ckpt.init_from) generates with the imported template through
#    its lineage, and is gated against the import as its baseline with a chat suite the template answers;
#  - a dataset, or a baseline, of another tokenizer is a usage error naming both hashes; a checkpoint
#    without a tokenizer needs --dataset.
# Usage: hf_generate_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
gate=$build/eval_gate/forge-gate ckpt=$build/ckpt/forge-ckpt data=$build/dataio/forge-data
train=$build/launcher/forge-train
py=/usr/bin/python3 model=$src/test/eval_gate/hf_chat_model.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
expect() {  # expect RC LOG CMD...: CMD exits RC (its stderr in LOG)
  local want=$1 log=$2
  shift 2
  "$@" >"$log.out" 2>"$log"
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$log" >&2; fail "$*: exit $rc, want $want"; }
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

$py "$src/test/ckpt/reference/hf_models.py" write --family llama --dtype f32 --vocab 2261 --out "$work/hf" ||
  fail "hf_models.py write"
$py "$model" make "$work/hf" || fail "hf_chat_model.py make"
"$ckpt" import "$work/hf" --out "$work/imported" >"$work/import.log" 2>&1 || { cat "$work/import.log" >&2; fail "import"; }
imported=$work/imported

# Generation with the checkpoint's own tokenizer and template: no dataset needed.
printf '%s\n' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"}]}' \
  '{"prompt": "Greet the world."}' >"$work/prompts.jsonl"
gen() {  # gen CHECKPOINT OUT ARGS...
  local ck=$1 out=$2
  shift 2
  expect 0 "$out.log" "$gate" generate --checkpoint "$ck" --prompt "Say hello." --prompts "$work/prompts.jsonl" \
    --ids --threads 1 --batch 2 --out "$out" "$@"
}
gen "$imported" "$work/own.jsonl" --chat --max-new-tokens 8
$py "$model" check "$work/own.jsonl" own || fail "own template: $(cat "$work/own.jsonl")"
grep -q "chat imported (sha256 " "$work/own.jsonl.log" || fail "generate does not name the template: $(cat "$work/own.jsonl.log")"
$py "$model" turn "$work/turn"
gen "$imported" "$work/turn.jsonl" --template "$work/turn" --max-new-tokens 12
$py "$model" check "$work/turn.jsonl" turn || fail "stop string: $(cat "$work/turn.jsonl")"
expect 0 "$work/text.log" "$gate" generate --checkpoint "$imported" --prompt $'Hi\n' --ids --threads 1 \
  --max-new-tokens 8 --out "$work/text.jsonl"
$py "$model" check "$work/text.jsonl" text 8 || fail "text generation: $(cat "$work/text.jsonl")"

# A dataset of the model's tokenizer, and one of another.
mkdir -p "$work/corpus"
for f in /usr/share/common-licenses/*; do cp -L "$f" "$work/corpus/$(basename "$f").txt"; done
prepare() {  # prepare OUT TOKENIZER
  expect 0 "$1.log" "$data" prepare --input "$work/corpus=legal" --tokenizer "$2" --valid-fraction 0.2 --out "$1"
}
prepare "$work/ds" "$imported/tokenizer.json"
other_tok=$src/test/dataio/fixtures/hf_tokenizers/gpt2.json
prepare "$work/ds-other" "$other_tok"
sha=$(sha256sum "$imported/tokenizer.json" | cut -d' ' -f1) other=$(sha256sum "$other_tok" | cut -d' ' -f1)
gen "$imported" "$work/own-ds.jsonl" --chat --max-new-tokens 8 --dataset "$work/ds"
cmp -s "$work/own.jsonl" "$work/own-ds.jsonl" || fail "the dataset's copy of the tokenizer generated differently"
expect 64 "$work/mismatch.log" "$gate" generate --checkpoint "$imported" --dataset "$work/ds-other" --prompt x
grep -q "speaks tokenizer $sha .* tokenized with $other" "$work/mismatch.log" ||
  fail "tokenizer mismatch message: $(cat "$work/mismatch.log")"
mkdir "$work/hf-bare" && cp "$work/hf/config.json" "$work/hf/model.safetensors" "$work/hf-bare/"
"$ckpt" import "$work/hf-bare" --out "$work/bare" >/dev/null 2>&1 || fail "import without tokenizer"
expect 64 "$work/bare.log" "$gate" generate --checkpoint "$work/bare" --prompt x
grep -q "holds no tokenizer" "$work/bare.log" || fail "no tokenizer message: $(cat "$work/bare.log")"

# A fine-tune of the import (a learning rate too small to move the weights): its lineage leads to the
# imported tokenizer, template and generation_config.json.
{
  printf '[run]\nname = ft\ndir = %s\nsteps = 2\nseed = 1\nthreads = 1\n\n' "$work/ft"
  sed -n '/^\[model\]/,$p' "$work/import.log"
  printf 'seq_len = 64\n\n[data]\ndataset = %s\nbatch = 2\n\n' "$work/ds"
  printf '[optim]\nlr = 1e-9\nmin_lr = 1e-10\nwarmup_steps = 0\nweight_decay = 0\n\n[precision]\ndtype = fp32\n\n'
  printf '[ckpt]\ninit_from = %s\nmilestone_every = 2\n' "$imported"
} >"$work/ft.ini"
expect 0 "$work/ft.log" "$train" "$work/ft.ini"
tuned=$work/ft/checkpoints/milestone/step-00000002
gen "$tuned" "$work/tuned.jsonl" --chat --max-new-tokens 8
$py "$model" check "$work/tuned.jsonl" own || fail "the fine-tune's template: $(cat "$work/tuned.jsonl")"

# The gate: the fine-tune against the import, a chat suite in the model's template, read alike.
mkdir -p "$work/suites/hello"
echo '{"name": "hello", "type": "exact_match", "max_new_tokens": 8}' >"$work/suites/hello/suite.json"
printf '%s\n' '{"id": "h1", "prompt": "Say hello.", "answer": "Hello world"}' \
  '{"id": "h2", "prompt": "Greet the world.", "answers": ["hello world"]}' >"$work/suites/hello/tasks.jsonl"
cat >"$work/gate.ini" <<INI
[gate]
required_domains = legal
min_tokens = 64
[bpb]
max_absolute = 100
[suites]
dir = $work/suites
required = hello
[suite.hello]
accuracy.min_absolute = 1
INI
evaluate() {  # evaluate RC OUT CANDIDATE DATASET BASELINE
  expect "$1" "$2.log" "$gate" evaluate --checkpoint "$3" --dataset "$4" --baseline "$5" --policy "$work/gate.ini" \
    --out "$2" --max-sequences 2 --threads 1 --no-promote
}
evaluate 0 "$work/g" "$tuned" "$work/ds" "$imported"
v=$work/g/verdict.json
[ "$(json "$v" '(d["suites"]["hello"]["metrics"]["accuracy"]["value"], d["baseline_suites"]["hello"]["metrics"]["accuracy"]["value"])')" = "(1.0, 1.0)" ] ||
  fail "the chat suite in the model's template: $(json "$v" 'd["suites"], d.get("baseline_suites")')"
[ "$(json "$v" 'd["prompt_format"]["tokenizer_sha256"] == sys.argv[3] and d["prompt_format"]["chat"].startswith("imported (sha256 ")' "$sha")" = True ] ||
  fail "prompt format in the verdict: $(json "$v" 'd["prompt_format"]')"
# The imported baseline (max_positions 1024) is read in the candidate's 64-token sequences.
[ "$(json "$v" '(d["seq_len"], d["domains"]["legal"]["tokens"] == d["baseline_domains"]["legal"]["tokens"])')" = "(64, True)" ] ||
  fail "the baseline not read as the candidate: $(json "$v" 'd["seq_len"], d["domains"], d["baseline_domains"]')"
# The import as the candidate: a dataset, or a baseline, of another tokenizer is refused before any work.
evaluate 64 "$work/g-ds" "$imported" "$work/ds-other" none
grep -q "the candidate $imported speaks tokenizer $sha .* tokenized with $other" "$work/g-ds.log" ||
  fail "candidate tokenizer message: $(cat "$work/g-ds.log")"
cp -r "$work/hf" "$work/hf-other" && cp "$other_tok" "$work/hf-other/tokenizer.json"
"$ckpt" import "$work/hf-other" --out "$work/imported-other" >/dev/null 2>&1 || fail "import hf-other"
evaluate 64 "$work/g-base" "$imported" "$work/ds" "$work/imported-other"
grep -q "the baseline $work/imported-other speaks tokenizer $other .* tokenized with $sha" "$work/g-base.log" ||
  fail "baseline tokenizer message: $(cat "$work/g-base.log")"
# Chat data rendered with a model's template (forge-data prepare --chat-template): the suites use it when it
# is the model's, and a template the model does not hold is refused (65, naming both) before any work.
if "$data" prepare --help 2>/dev/null | grep -q -- --chat-template; then
  python3 - "$work/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(200):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                                         {"role": "assistant", "content": f"It is {2 * i}."}]}) + "\n")
PY
  sed 's/^required_domains = legal$/required_domains = chat/' "$work/gate.ini" >"$work/gate.chat.ini"
  for t in imported turn; do
    expect 0 "$work/chat-$t.log" "$data" prepare --format chat --input "$work/chat.jsonl=chat" \
      --tokenizer "$imported/tokenizer.json" --chat-template "$work/$t" --valid-fraction 0.2 --out "$work/chat-$t"
  done
  expect 0 "$work/g-chat.log" "$gate" evaluate --checkpoint "$imported" --dataset "$work/chat-imported" \
    --baseline none --policy "$work/gate.chat.ini" --out "$work/g-chat" --max-sequences 2 --threads 1 --no-promote
  [ "$(json "$work/g-chat/verdict.json" 'd["suites"]["hello"]["metrics"]["accuracy"]["value"]')" = 1.0 ] ||
    fail "chat suite on the model's chat data: $(json "$work/g-chat/verdict.json" 'd["suites"]')"
  expect 65 "$work/g-turn.log" "$gate" evaluate --checkpoint "$imported" --dataset "$work/chat-turn" \
    --baseline none --policy "$work/gate.chat.ini" --out "$work/g-turn" --max-sequences 2 --threads 1 --no-promote
  grep -q "prepared with chat template [0-9a-f]*, neither the model's own" "$work/g-turn.log" ||
    fail "another template's chat data: $(cat "$work/g-turn.log")"
fi
echo "imported model gate test passed"
