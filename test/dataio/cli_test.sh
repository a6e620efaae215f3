#!/usr/bin/env bash
# End to end: forge-data prepare/verify/inspect/compare on a tiny crafted corpus with planted duplicates,
# contamination and bad documents; h5dump reads a shard; every bad input exits with its code.
set -euo pipefail
forge_data=$1
fixtures=$(cd "$(dirname "$0")" && pwd)/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_exit() {  # expect_exit CODE PATTERN -- command...
  local want=$1 pattern=$2 rc=0
  shift 3
  "$@" > out.txt 2> err.txt || rc=$?
  [ "$rc" -eq "$want" ] || { cat out.txt err.txt >&2; fail "'$*' exited $rc, expected $want"; }
  grep -q -- "$pattern" err.txt || { cat err.txt >&2; fail "'$*': stderr lacks '$pattern'"; }
}
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# 40 prose documents of pseudo-words (deterministic), one planted exact duplicate, one near duplicate
# (one word in 60 changed), one contaminated by a 13-word eval passage, two bad documents.
mkdir -p corpus/prose corpus/code
awk 'BEGIN {
  srand(7);
  for (v = 0; v < 1500; v++) { w = ""; n = 3 + int(rand() * 6); for (k = 0; k < n; k++) w = w substr("abcdefghijklmnopqrstuvwxyz", 1 + int(rand() * 26), 1); vocab[v] = w }
  for (d = 0; d < 40; d++) {
    f = sprintf("corpus/prose/doc%02d.txt", d); text = "";
    for (i = 0; i < 300; i++) text = text vocab[int(rand() * 1500)] ((i % 15 == 14) ? ".\n" : " ");
    printf "%s", text > f; close(f);
    if (d == 3) { printf "%s", text > "corpus/prose/dup_of_03.txt"; close("corpus/prose/dup_of_03.txt") }
    if (d == 5) { near = ""; split(text, ws, " "); for (i = 1; i <= length(ws); i++) near = near ((i % 60 == 0) ? "zzchanged" : ws[i]) " "; printf "%s", near > "corpus/prose/near_05.txt"; close("corpus/prose/near_05.txt") }
  }
  eval = ""; for (i = 0; i < 40; i++) eval = eval vocab[(i * 37) % 1500] " "; printf "%s\n", eval > "eval.txt";
  split(eval, ev, " "); planted = "";
  for (i = 0; i < 200; i++) planted = planted vocab[int(rand() * 1500)] " ";
  for (i = 10; i < 23; i++) planted = planted ev[i] " ";
  printf "%s\n", planted > "corpus/prose/contaminated.txt";
}'
printf 'too short\n' > corpus/prose/short.txt
printf '\n \n' > corpus/prose/empty.txt
for i in $(seq 0 29); do
  printf '{"text": "def f%d(x):\\n    y = x * %d\\n    return y + %d\\n\\n\\nclass K%d:\\n    pass\\n", "license": "MIT"}\n' "$i" "$i" "$((i * 3))" "$i"
done > corpus/code/funcs.jsonl

"$forge_data" prepare --input corpus/prose=prose --input corpus/code=code --eval-set eval.txt \
  --out ds --vocab 400 --valid-fraction 0.1 --shard-tokens 4000 > prepare.txt \
  || fail "prepare failed: $(cat prepare.txt)"
[ -f ds/manifest.json ] && [ -f ds/quality.json ] && [ -f ds/quality.txt ] && [ -f ds/tokenizer.model ] || fail "dataset files missing"
[ "$(json ds/quality.json 'd["stages"]["exact_dedup"]["removed"]["exact_duplicate"]')" = 1 ] || fail "exact duplicate not removed"
[ "$(json ds/quality.json 'd["stages"]["near_dedup"]["removed"]["near_duplicate"]')" = 1 ] || fail "near duplicate not removed"
[ "$(json ds/quality.json 'd["stages"]["decontam"]["removed"]["contaminated"]')" = 1 ] || fail "contamination not removed"
[ "$(json ds/quality.json 'd["stages"]["filters"]["removed"]["too_few_words"]')" = 1 ] || fail "short document not filtered"
[ "$(json ds/quality.json 'd["stages"]["ingest"]["removed"]["empty"]')" = 1 ] || fail "empty document not counted"
[ "$(json ds/quality.json 'd["summary"]["documents_out"]')" = 70 ] || fail "expected 70 documents out"
[ "$(json ds/manifest.json 'd["token_dtype"]')" = uint16 ] || fail "token dtype"
[ "$(json ds/manifest.json 'len([s for s in d["shards"] if s["split"] == "train" and s["domain"] == "prose"])')" -gt 1 ] \
  || fail "--shard-tokens did not split the prose shards"
[ "$(json ds/manifest.json 'sum(s["documents"] for s in d["shards"] if s["split"] == "valid")')" -ge 2 ] || fail "no validation split"
grep -q "near" prepare.txt || fail "summary not printed"

"$forge_data" verify ds | grep -q '^ok:' || fail "verify failed on a fresh dataset"
"$forge_data" inspect ds --docs 2 > inspect.txt
grep -q 'document 1' inspect.txt || fail "inspect printed no documents"
shard=$(ls ds/shards/*.h5 | head -1)
h5dump -H "$shard" > /dev/null || fail "h5dump cannot read $shard"
h5dump -a /tokenizer_sha256 "$shard" | grep -q "$(json ds/manifest.json 'd["tokenizer"]["sha256"]')" || fail "shard lacks tokenizer hash"

# Same input and settings -> same version; compare finds no drift. A reused tokenizer gives it too.
"$forge_data" prepare --input corpus/prose=prose --input corpus/code=code --eval-set eval.txt \
  --out ds2 --vocab 400 --valid-fraction 0.1 --shard-tokens 4000 > /dev/null
[ "$(json ds/manifest.json 'd["version"]')" = "$(json ds2/manifest.json 'd["version"]')" ] || fail "version not reproducible"
"$forge_data" compare ds ds2 | grep -q 'drift: no' || fail "compare found drift between identical datasets"
"$forge_data" prepare --input corpus/prose=prose --out ds3 --tokenizer ds/tokenizer.model --valid-fraction 0.1 > /dev/null
rc=0; "$forge_data" compare ds ds3 --threshold 0.01 --json > cmp.json || rc=$?
[ "$rc" -eq 1 ] || fail "compare should flag drift (domain mix changed) with exit 1, got $rc"
[ "$(json cmp.json 'd["same_tokenizer"]')" = True ] || fail "compare: tokenizer should be the same"
# One setting changed: compare names it, its stage, and what that stage removed in each, per domain.
"$forge_data" prepare --input corpus/prose=prose --input corpus/code=code --eval-set eval.txt \
  --out ds4 --vocab 400 --valid-fraction 0.1 --shard-tokens 4000 --filters.min_words=295 > /dev/null
rc=0; "$forge_data" compare ds ds4 --json > cmp4.json || rc=$?
[ "$(json cmp4.json '[c["key"] for c in d["settings_changed"]]')" = "['filters.min_words']" ] \
  || fail "compare: changed settings $(json cmp4.json 'd["settings_changed"]')"
[ "$(json cmp4.json 'd["settings_changed"][0]["stage"]')" = filters ] || fail "compare: min_words not attributed to filters"
more=$(json cmp4.json 'd["stages"]["filters"]["removed_per_domain"]["prose"]["change"]')
[ "$more" -gt 0 ] || fail "compare: filters should remove more prose documents, change $more"
[ "$(json cmp4.json 'd["stages"]["filters"]["removed_per_domain"]["code"]["change"]')" = 0 ] || fail "compare: code should not change"
"$forge_data" compare ds ds4 | grep -q "filters: filters.min_words changed; removed 1 -> $((1 + more)) documents ($more more)" \
  || { "$forge_data" compare ds ds4 >&2; fail "compare: no sentence naming filters.min_words"; }
# Languages: identified per document, listed in the manifest, indexed by every shard's /doc_languages.
[ "$(json ds/manifest.json 'len(d["languages"]) > 0')" = True ] || fail "manifest lists no languages"
h5dump -H -d /doc_languages "$shard" > /dev/null || fail "$shard has no /doc_languages"
[ "$(json ds/quality.json 'round(sum(v["token_share"] for v in d["summary"]["languages"].values()), 6)')" = 1.0 ] \
  || fail "language token shares do not add up to 1"

# Bad inputs.
printf '{"text": "int a;", "repo": "a/b"}\n{"text": "int b;", "repo": ["a", "b"]}\n' > badrepo.jsonl
expect_exit 65 'badrepo.jsonl:2: field "repo" is a JSON array' -- "$forge_data" prepare --input badrepo.jsonl --out dsr --vocab 400
[ ! -e dsr ] && ! ls -d dsr.partial-* 2>/dev/null || fail "a failed prepare left a dataset directory behind"
expect_exit 64 'language.allow' -- "$forge_data" prepare --input corpus/prose --out x --vocab 400 --language.allow=web
expect_exit 64 'license.allow' -- "$forge_data" prepare --input corpus/prose --out x --vocab 400 '--license.allow=MIT,GPL 3'
expect_exit 64 "no such file" -- "$forge_data" prepare --input nothing/here --out x --vocab 400
expect_exit 64 "already exists" -- "$forge_data" prepare --input corpus/prose --out ds --vocab 400
expect_exit 64 "unknown key" -- "$forge_data" prepare --input corpus/prose --out x --vocab 400 --filters.min_wrds=3
expect_exit 64 "exclude" -- "$forge_data" prepare --input corpus/prose --out x --vocab 400 --tokenizer ds/tokenizer.model
mkdir -p emptydir
expect_exit 65 "no documents" -- "$forge_data" prepare --input emptydir --out x --vocab 400
expect_exit 65 "no documents left after the quality filters" -- \
  "$forge_data" prepare --input corpus/prose --out x --vocab 400 --filters.min_words=100000
[ ! -e x ] || fail "a failed prepare left $PWD/x"
ls | grep -q partial && fail "a failed prepare left a partial directory"
expect_exit 65 "no manifest.json" -- "$forge_data" verify emptydir

cp -r ds ds_edit
sed -i 's/"documents": \([0-9]*\)/"documents": 999\1/' ds_edit/manifest.json
expect_exit 65 "does not match its content" -- "$forge_data" verify ds_edit

cp -r ds ds_bad
victim=$(ls ds_bad/shards/*.h5 | head -1)
printf '\x01\x02\x03\x04' | dd of="$victim" bs=1 seek=3000 conv=notrunc status=none
expect_exit 65 "$(basename "$victim")" -- "$forge_data" verify ds_bad

cp -r ds ds_trunc
victim=$(ls ds_trunc/shards/*.h5 | tail -1)
truncate -s 1000 "$victim"
expect_exit 65 "$(basename "$victim")" -- "$forge_data" verify ds_trunc
# Chat: --format chat end to end through the CLI (the C++ test checks the mask token by token).
python3 - <<'PY'
import json
words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
def text(i, n): return " ".join(words[(i * 7 + k * 3) % 10] + str((i * 31 + k) % 97) for k in range(n))
with open("chat.jsonl", "w") as f:
    for i in range(60):
        m = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        m += [{"role": "user", "content": text(i, 8 + i % 11)}, {"role": "assistant", "content": text(i + 100, 6 + i % 13)}]
        f.write(json.dumps({"messages": m}) + "\n")
    f.write('{"messages": [{"role": "bot", "content": "x"}]}\n')
    f.write('{"messages": [{"role": "user", "content": "no reply"}]}\n')
PY
expect_exit 65 "chat.jsonl:61: messages\[0\] has unknown role" -- \
  "$forge_data" prepare --input chat.jsonl=qa --out chatds --vocab 400 --format chat
[ ! -e chatds ] || fail "a failed chat prepare left chatds"
"$forge_data" prepare --input chat.jsonl=qa --out chatds --vocab 400 --format chat --max-bad-lines 0.05 \
  --max-tokens 90 --truncate drop > chat_prepare.txt || fail "chat prepare failed: $(cat chat_prepare.txt)"
[ "$(json chatds/manifest.json 'd["format"]')" = chat ] || fail "manifest format is not chat"
[ "$(json chatds/manifest.json 'd["settings"]["chat"]["template"]["name"]')" = forge-chat-1 ] || fail "template not recorded"
[ "$(json chatds/quality.json 'd["chat"]["malformed_lines"]["count"]')" = 1 ] || fail "malformed line not counted"
[ "$(json chatds/quality.json 'd["chat"]["degenerate"]["no_assistant_turn"]')" = 1 ] || fail "degenerate record not counted"
[ "$(json chatds/quality.json 'd["chat"]["truncation"]["dropped_too_long"] > 0')" = True ] || fail "nothing dropped at --max-tokens 90"
"$forge_data" verify chatds | grep -q 'format chat' || fail "verify does not show the chat format"
"$forge_data" inspect chatds --docs 1 | grep -q '<|assistant|>\[\[' || fail "inspect does not mark the scored reply"
h5dump -H "$(ls chatds/shards/*.h5 | head -1)" | grep -q loss_mask || fail "chat shard has no /loss_mask"
expect_exit 64 "chat.truncate" -- "$forge_data" prepare --input chat.jsonl --out x --format chat --truncate cut
expect_exit 64 "ingest.format" -- "$forge_data" prepare --input chat.jsonl --out x --format dialog
# Preference: --format preference end to end through the CLI (the C++ test checks pairs and masks token by
# token). 60 pairs, every reply shape, a duplicate pair, an identical-halves pair, a malformed line.
python3 - <<'PY'
import json
words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
def text(i, n): return " ".join(words[(i * 7 + k * 3) % 10] + str((i * 31 + k) % 97) for k in range(n))
with open("pref.jsonl", "w") as f:
    lines = []
    for i in range(60):
        prompt = text(i, 6 + i % 9) if i % 2 else [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": text(i, 5)}, {"role": "assistant", "content": text(i + 50, 4)},
            {"role": "user", "content": text(i + 60, 7)}]
        chosen = text(i + 100, 5 + i % 13)
        rejected = {"role": "assistant", "content": text(i + 200, 4 + i % 7)} if i % 3 else [{"role": "assistant", "content": text(i + 200, 4 + i % 7)}]
        lines.append(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}))
    lines.append(lines[5])
    lines.append('{"prompt": "same?", "chosen": "yes", "rejected": "yes"}')
    lines.append('{"prompt": "q", "chosen": {"role": "user", "content": "x"}, "rejected": "y"}')
    f.write("\n".join(lines) + "\n")
PY
expect_exit 65 "pref.jsonl:63: chosen has role" -- \
  "$forge_data" prepare --input pref.jsonl=qa --out prefds --vocab 400 --format preference
[ ! -e prefds ] || fail "a failed preference prepare left prefds"
"$forge_data" prepare --input pref.jsonl=qa --out prefds --vocab 400 --format preference --max-bad-lines 0.05 \
  --shard-tokens 500 > pref_prepare.txt || fail "preference prepare failed: $(cat pref_prepare.txt)"
grep -q 'preference (forge-chat-1): 60 pairs' pref_prepare.txt || fail "summary lacks the pair count: $(cat pref_prepare.txt)"
[ "$(json prefds/manifest.json 'd["format"]')" = preference ] || fail "manifest format is not preference"
[ "$(json prefds/manifest.json 'all(s["documents"] % 2 == 0 for s in d["shards"])')" = True ] || fail "a shard splits a pair"
[ "$(json prefds/manifest.json 'len(d["shards"]) > 4')" = True ] || fail "too few shards to test the cut rule"
[ "$(json prefds/quality.json 'd["preference"]["pairs"]')" = 60 ] || fail "duplicate pair not removed"
[ "$(json prefds/quality.json 'd["preference"]["degenerate"]["identical_replies"]')" = 1 ] || fail "identical halves not counted"
[ "$(json prefds/quality.json 'd["preference"]["malformed_lines"]["count"]')" = 1 ] || fail "malformed line not counted"
[ "$(json prefds/quality.json '0 < d["preference"]["length_bias"]["chosen_longer_share"] < 1')" = True ] || fail "no length-bias figure"
"$forge_data" verify prefds | grep -q 'format preference' || fail "verify does not show the preference format"
"$forge_data" inspect prefds --docs 1 > pref_inspect.txt
grep -q 'pair 0 chosen' pref_inspect.txt && grep -q 'pair 0 rejected' pref_inspect.txt || fail "inspect does not show a pair's halves"
expect_exit 64 "chat.truncate" -- "$forge_data" prepare --input pref.jsonl --out x --format preference --truncate cut
# --chat-template: the chat and preference inputs above in a model's own template (Qwen2.5's, with the
# fixture tokenizer.json), as a model directory and as its tokenizer_config.json; the C++ test
# (chat_template_prepare_test.cpp) checks the masks token by token.
mkdir qwen && cp "$fixtures/hf_tokenizers/qwen2.json" qwen/tokenizer.json
python3 - "$fixtures/chat_templates/qwen2.5-7b-instruct.jinja" <<'PY'
import json, sys
json.dump({"chat_template": open(sys.argv[1]).read(), "eos_token": "<|im_end|>"}, open("qwen/tokenizer_config.json", "w"))
PY
"$forge_data" prepare --input chat.jsonl=qa --out tmplds --format chat --max-bad-lines 0.05 \
  --tokenizer qwen/tokenizer.json --chat-template qwen > tmpl_prepare.txt || fail "template prepare failed: $(cat tmpl_prepare.txt)"
grep -q 'chat (qwen): 60 conversations' tmpl_prepare.txt || fail "summary lacks the template: $(cat tmpl_prepare.txt)"
[ "$(json tmplds/manifest.json 'd["settings"]["chat"]["template"]["kind"]')" = model ] || fail "model template not recorded"
[ "$(json tmplds/quality.json 'd["chat"]["model_template"]["source"]')" = qwen/tokenizer_config.json ] || fail "template source not reported"
"$forge_data" verify tmplds | grep -q 'format chat' || fail "verify refuses the template dataset"
"$forge_data" inspect tmplds --docs 1 > tmpl_inspect.txt
grep -q 'chat template of the model' tmpl_inspect.txt && grep -q '<|im_end|>' tmpl_inspect.txt && grep -q '\[\[' tmpl_inspect.txt ||
  fail "inspect does not show the template's rendering: $(cat tmpl_inspect.txt)"
"$forge_data" prepare --input pref.jsonl=qa --out tmplpref --format preference --max-bad-lines 0.05 \
  --tokenizer qwen/tokenizer.json --chat-template qwen/tokenizer_config.json > tmpl_pref.txt ||
  fail "template preference prepare failed: $(cat tmpl_pref.txt)"
grep -q 'preference (qwen): 60 pairs' tmpl_pref.txt || fail "summary lacks the pairs: $(cat tmpl_pref.txt)"
"$forge_data" verify tmplpref | grep -q 'format preference' || fail "verify refuses the template preference dataset"
expect_exit 64 "needs --format chat or preference" -- \
  "$forge_data" prepare --input corpus/prose --out x --tokenizer qwen/tokenizer.json --chat-template qwen
expect_exit 64 "needs --tokenizer" -- "$forge_data" prepare --input chat.jsonl --out x --format chat --chat-template qwen
printf '{"chat_template": "{{ messages | wordwrap }}"}' > bad_config.json
expect_exit 65 "filter 'wordwrap' is not supported" -- "$forge_data" prepare --input chat.jsonl --out x \
  --format chat --tokenizer qwen/tokenizer.json --chat-template bad_config.json
[ ! -e x ] || fail "a refused template left x"
# Prompt sets (--format prompts) through the CLI; prompts_test.cpp checks the fields, reports and refusals.
# A gate suite's task file is the eval set: its prompt, asked verbatim, is contamination.
mkdir -p suite
echo '{"id": "e1", "prompt": "What is 7 + 12?", "answer": "19"}' > suite/tasks.jsonl
cat > prompts.jsonl <<'EOF'
{"id": "s1", "prompt": "What is 3 + 4?", "answer": "7"}
{"prompt": "What is 7 + 12?", "answer": "19"}

{"prompt": "Write add(a, b).", "tests": "assert add(1, 2) == 3", "entry_point": "add", "domain": "code"}
{"prompt": "What is 3 + 4?", "answers": ["7", "seven"]}
EOF
"$forge_data" prepare --format prompts --input prompts.jsonl --eval-set suite/tasks.jsonl --out ps > ps.txt \
  || fail "prompts prepare failed: $(cat ps.txt)"
[ -f ps/prompts.jsonl ] && [ -f ps/manifest.json ] && [ -f ps/quality.json ] && [ -f ps/quality.txt ] || fail "prompt set files missing"
[ ! -e ps/tokenizer.model ] && [ ! -e ps/shards ] || fail "a prompt set is not tokenized"
[ "$(json ps/manifest.json 'd["format"]')" = prompts ] || fail "manifest format is not prompts"
[ "$(json ps/quality.json '[d["summary"][k] for k in ("prompts_read", "prompts_kept", "duplicates", "contaminated", "with_answers", "with_tests")]')" = "[4, 2, 1, 1, 1, 1]" ] \
  || fail "prompt counts: $(json ps/quality.json 'd["summary"]')"
[ "$(json ps/quality.json 'd["stages"]["decontam"]["examples"][0]["removed"]')" = prompts.jsonl:2 ] || fail "contaminated prompt not named"
grep -q 'contaminated 1' ps.txt || fail "summary lacks the contamination: $(cat ps.txt)"
"$forge_data" prepare --format prompts --input prompts.jsonl --eval-set suite/tasks.jsonl --out ps2 > /dev/null
[ "$(json ps/manifest.json 'd["version"]')" = "$(json ps2/manifest.json 'd["version"]')" ] || fail "prompt set version not reproducible"
"$forge_data" verify ps | grep -q '^ok: 2 prompts (1 with answers, 1 with tests), 2 domains, format prompts' || fail "verify refuses the prompt set"
"$forge_data" inspect ps --docs 1 | grep -q 'What is 3 + 4?' || fail "inspect shows no prompt"
printf '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "What is 2 + 2?"}\n' > badprompts.jsonl
expect_exit 65 'badprompts.jsonl:2: no "answer", "answers" or "tests"' -- \
  "$forge_data" prepare --format prompts --input badprompts.jsonl --out psbad
[ ! -e psbad ] && ! ls -d psbad.partial-* 2>/dev/null || fail "a failed prompts prepare left a directory behind"
expect_exit 64 'does not apply to --format prompts' -- \
  "$forge_data" prepare --format prompts --input prompts.jsonl --out x --tokenizer ds/tokenizer.model
expect_exit 64 'a prompt set' -- "$forge_data" compare ps ps2
cp -r ps ps_edit
sed -i 's/"answers":\["7"\]/"answers":["8"]/' ps_edit/prompts.jsonl
expect_exit 65 'ps_edit/prompts.jsonl: xxh3' -- "$forge_data" verify ps_edit
echo "cli test passed"
