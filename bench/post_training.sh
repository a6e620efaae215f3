#!/usr/bin/env bash
# Post-training throughput, in one invocation: SFT, DPO with a precomputed and with a live reference on
# the same pairs, and pretraining vs distillation from a larger teacher on the same text, with the same
# student (the trainer benchmark's GPT: 6 layers, d_model 384, vocabulary 8192, seq_len 256) and batch (8
# rows), one process; prints tokens/s of each (median over the steps after the first; a step is its
# compute and the wait for its batch, where a live reference runs), the ratio DPO /
# SFT (issue 17's goal: >= 0.9), the reference pass's cost in steps' worth of time, the live reference's
# cost as a ratio, and the teacher's share of a distillation step (1 - lm step / distill step: the
# teacher's forward and the KL beside the cross-entropy).
# The data: pairs from the demo corpus's man pages (scripts/make-demo-chat.py): the chosen reply is the
# page's own answer, the rejected one its words out of order; SFT trains on the same conversations (chosen and
# rejected, as a chat dataset), tokenized with one tokenizer trained on the corpus.
#
# usage: bench/post_training.sh [BUILD_DIR]    (default build/release; needs forge-train and forge-data)
#   THREADS=2 STEPS=12 override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build=${1:-$root/build/release}
threads=${THREADS:-2}
steps=${STEPS:-12}
train=$build/launcher/forge-train data=$build/dataio/forge-data
for b in "$train" "$data"; do
  [ -x "$b" ] || { echo "post_training.sh: $b not found; build it: cmake --build $build" >&2; exit 64; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

machine
"$root/scripts/make-demo-corpus.sh" "$work/corpus" 2 >/dev/null
"$data" prepare --input "$work/corpus/code=code" --input "$work/corpus/docs=docs" --vocab 8192 \
  --valid-fraction 0.01 --out "$work/text" >/dev/null 2>&1
/usr/bin/python3 "$root/scripts/make-demo-chat.py" "$work/corpus/docs" "$work/chat.jsonl" "$work/pairs.jsonl" >/dev/null
# SFT sees the pairs' conversations: each prompt with its chosen and with its rejected reply.
/usr/bin/python3 - "$work/pairs.jsonl" "$work/both.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as both:
    for line in open(sys.argv[1]):
        p = json.loads(line)
        for reply in (p["chosen"], p["rejected"]):
            both.write(json.dumps({"messages": p["prompt"] + [{"role": "assistant", "content": reply}]}) + "\n")
PY
common=(--tokenizer "$work/text/tokenizer.model" --valid-fraction 0.05 --max-tokens 128)
"$data" prepare --format preference --input "$work/pairs.jsonl=pairs" "${common[@]}" --out "$work/pref" >/dev/null 2>&1
"$data" prepare --format chat --input "$work/both.jsonl=chat" "${common[@]}" --out "$work/chat" >/dev/null 2>&1

shape=(--run.threads="$threads" --model.vocab=8192 --model.seq_len=256 --data.batch=8 --run.peak_gflops=100)
model=("${shape[@]}" --model.layers=6 --model.d_model=384 --model.heads=6)
# The reference (and the model both runs start from): the benchmark model after one step.
"$train" "$root/configs/tiny.ini" --run.dir="$work/base" "${model[@]}" --run.steps=1 --ckpt.milestone_every=1 \
  --data.dataset="$work/text" >/dev/null 2>&1
base=$(ls -d "$work"/base/checkpoints/milestone/step-* | tail -n1)
"$train" "$root/configs/tiny.ini" --run.dir="$work/sft" "${model[@]}" --run.steps="$steps" --data.dataset="$work/chat" \
  --run.objective=sft --ckpt.init_from="$base" >/dev/null 2>&1
start=$(date +%s.%N)
"$train" "$root/configs/tiny.ini" --run.dir="$work/dpo" "${model[@]}" --run.steps="$steps" --data.dataset="$work/pref" \
  --run.objective=dpo --ckpt.init_from="$base" 2>"$work/dpo.log" >/dev/null
total=$(echo "$(date +%s.%N) - $start" | bc)
"$train" "$root/configs/tiny.ini" --run.dir="$work/live" "${model[@]}" --run.steps="$steps" --data.dataset="$work/pref" \
  --run.objective=dpo --dpo.reference_mode=live --ckpt.init_from="$base" >/dev/null 2>&1
# Distillation: a teacher of 8 layers, d_model 512 (2.2x the student's parameters; its weights after one step),
# and the student trained on the same text with and without it.
"$train" "$root/configs/tiny.ini" --run.dir="$work/teacher" "${shape[@]}" --model.layers=8 --model.d_model=512 \
  --model.heads=8 --run.steps=1 --ckpt.milestone_every=1 --data.dataset="$work/text" >/dev/null 2>&1
teacher=$(ls -d "$work"/teacher/checkpoints/milestone/step-* | tail -n1)
"$train" "$root/configs/tiny.ini" --run.dir="$work/lm" "${model[@]}" --run.steps="$steps" --data.dataset="$work/text" \
  >/dev/null 2>&1
"$train" "$root/configs/tiny.ini" --run.dir="$work/distill" "${model[@]}" --run.steps="$steps" \
  --data.dataset="$work/text" --run.objective=distill --distill.teacher="$teacher" --distill.temperature=2 >/dev/null 2>&1
load_after
/usr/bin/python3 - "$work" "$total" <<'PY'
import json, statistics, sys
work, total = sys.argv[1], float(sys.argv[2])
def figures(run):
    # A step's time with the wait for its batch: a live reference computes its log-probabilities there.
    rows = [json.loads(l) for l in open(f"{work}/{run}/metrics/rank-0.jsonl")][1:]
    step_s = [(r["step_ms"] + r["data_wait_ms"]) / 1e3 for r in rows]
    tokens = [r["tokens_per_s"] * r["step_ms"] / 1e3 for r in rows]  # "tokens" counts the run's so far
    return statistics.median(t / s for t, s in zip(tokens, step_s)), sum(step_s) / len(step_s)
sft, sft_step = figures("sft")
dpo, dpo_step = figures("dpo")
pairs = json.load(open(f"{work}/pref/quality.json"))["preference"]
train_s = sum(json.loads(l)["step_ms"] + json.loads(l)["data_wait_ms"] for l in open(f"{work}/dpo/metrics/rank-0.jsonl")) / 1e3
print(f"pairs: {pairs.get('pairs_written', pairs.get('pairs', '?'))} written; model 6 x 384, vocabulary 8192, seq_len 256, batch 8")
print(f"sft  tokens_per_s={sft:.0f} step_s={sft_step:.3f}")
print(f"dpo  tokens_per_s={dpo:.0f} step_s={dpo_step:.3f} (precomputed reference)")
print(f"ratio dpo/sft = {dpo / sft:.3f} (goal >= 0.9)")
live, live_step = figures("live")
lm, lm_step = figures("lm")
distill, distill_step = figures("distill")
print(f"dpo  tokens_per_s={live:.0f} step_s={live_step:.3f} (live reference)")
print(f"ratio live/precomputed = {live / dpo:.3f} (the live reference's cost: {dpo / live - 1:.0%} more time a step)")
print(f"lm       tokens_per_s={lm:.0f} step_s={lm_step:.3f}")
print(f"distill  tokens_per_s={distill:.0f} step_s={distill_step:.3f} (teacher 8 x 512)")
print(f"teacher share of a distillation step = {1 - lm_step / distill_step:.3f}")
print(f"dpo run: {total:.1f} s wall, {train_s:.1f} s in steps; the rest (start-up and the reference pass over every training pair) {total - train_s:.1f} s")
PY
