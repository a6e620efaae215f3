#!/usr/bin/env bash
# run.objective = grpo (and ppo) end to end on the real binaries: a chat model fine-tuned on sums (forge-data
# prepare --format chat, run.objective = sft), a prompt set of sums (forge-data prepare --format prompts),
# then GRPO from that model: rollouts sampled on the training ranks with the weights being trained, scored
# by the gate's exact match, the ratio exactly 1 and the KL to the (identical) reference exactly 0 at the
# first update, the sampler's log-probabilities equal to the trainer's in FP32, the same rollouts and losses
# on a second run, after a preemption and on 2 data-parallel ranks; code rewards through the sandbox, the
# same whether scored while sampling or after; the
# candidate gated with its prompt set (its loss measured on the chat dataset it speaks, the suites against
# the model it started from); PPO with a value head added to that model (on policy, resumed, on dp and tp
# ranks, gated); what grpo and ppo need refused with 64 or 65.
# Usage: grpo_test.sh FORGE_TRAIN FORGE_DATA SOURCE_DIR FORGE_GATE FORGE_CKPT
set -uo pipefail
train=$1 data=$2 src=$3 gate=$4 ckpt=$5
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
# shellcheck source=test/parallel/common.sh
source "$src/test/parallel/common.sh"
# shellcheck source=test/support/metrics.sh
source "$src/test/support/metrics.sh"

python3 - "$work" <<'EOF_PY'
import json, random, sys
work = sys.argv[1]
random.seed(5)
with open(f"{work}/chat.jsonl", "w") as f:
    for _ in range(800):
        a, b = random.randint(0, 9), random.randint(0, 9)
        f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                         {"role": "assistant", "content": f"{a + b}"}]}) + "\n")
with open(f"{work}/sums.jsonl", "w") as f:
    for a in range(10):
        for b in range(10):
            f.write(json.dumps({"id": f"sum-{a}-{b}", "prompt": f"What is {a} + {b}?", "answer": str(a + b),
                                "domain": "arithmetic"}) + "\n")
with open(f"{work}/code.jsonl", "w") as f:
    for n in range(4):
        f.write(json.dumps({"id": f"code-{n}", "prompt": f"Write f returning {n}.",
                            "tests": f"def check(g):\n    assert g() == {n}\n", "entry_point": "f"}) + "\n")
EOF_PY
"$data" prepare --format chat --input "$work/chat.jsonl=chat" --vocab 288 --valid-fraction 0.05 \
  --out "$work/chat" >/dev/null 2>"$work/prepare.log" || fail "prepare chat: $(tail -n1 "$work/prepare.log")"
"$data" prepare --format prompts --input "$work/sums.jsonl" --out "$work/sums" >/dev/null 2>"$work/prepare.log" ||
  fail "prepare prompts: $(tail -n1 "$work/prepare.log")"
"$data" prepare --format prompts --input "$work/code.jsonl" --out "$work/code" >/dev/null 2>"$work/prepare.log" ||
  fail "prepare code prompts: $(tail -n1 "$work/prepare.log")"

model=(--run.threads=1 --run.peak_gflops=100 --model.layers=2 --model.d_model=64 --model.heads=2
  --model.seq_len=32 --model.vocab=288)
"$train" "$src/configs/tiny.ini" --run.dir="$work/sft" "${model[@]}" --data.dataset="$work/chat" \
  --run.objective=sft --optim.lr=3e-3 --run.steps=300 --ckpt.milestone_every=300 2>"$work/sft.log" ||
  fail "sft run: $(tail -n1 "$work/sft.log")"
sft=$work/sft/checkpoints/milestone/step-00000300
rl=(--run.objective=grpo --rl.format_dataset="$work/chat" --rl.max_new_tokens=6 --optim.lr=3e-4
  --optim.min_lr=3e-4 --ckpt.recovery_every=10 --ckpt.init_from="$sft")
grpo=("${model[@]}" "${rl[@]}" --rl.group_size=4 --data.batch=8 --data.dataset="$work/sums")

"$train" "$src/configs/tiny.ini" --run.dir="$work/a" "${grpo[@]}" --run.steps=100 2>"$work/a.log" ||
  fail "grpo run: $(tail -n1 "$work/a.log")"
python3 - "$work/a/metrics/rank-0.jsonl" <<'EOF_PY' || fail "the GRPO metrics are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 100, len(rows)
first = rows[0]
# The first update of a rollout: the trainer's recomputed log-probabilities are the ones it divides by.
assert first["ratio"] == 1.0 and first["clip_fraction"] == 0.0, first
for r in rows:
    ro = r["rollout"]
    assert 0 <= ro["reward"] <= 1 and 0 <= ro["flat_groups"] <= 1, ro
    assert set(ro["reward_parts"]) >= {"exact_match", "format", "length"}, ro
    assert 0 < ro["reply_tokens"] <= 6 and ro["generation_tokens_per_s"] > 0, ro
    # One update per rollout: the training forward is the recomputation, measured against the sampler.
    assert ro["logp_diff_max"] < 1e-4 and 0 <= ro["logp_diff_mean"] <= ro["logp_diff_max"], ro
    assert "logp_diff_max" not in r and "logp_diff_mean" not in r, r
    assert r["entropy"] > 0, r  # the sampled tokens' mean surprise under the policy
    assert r["data_domains"] == {"arithmetic": 8}, r
print("reward by 20 steps", [round(sum(r["rollout"]["reward"] for r in rows[i:i + 20]) / 20, 3) for i in range(0, 100, 20)])
EOF_PY
grep -q "reward [0-9.]* reply [0-9]* tok, generation" "$work/a.log" || fail "no rollout figures in the progress lines"

# The same seed, the same rollouts and losses.
"$train" "$src/configs/tiny.ini" --run.dir="$work/b" "${grpo[@]}" --run.steps=100 2>"$work/b.log" ||
  fail "second grpo run: $(tail -n1 "$work/b.log")"
same() {  # same A B FIELD...: the two runs logged the same values
  python3 - "$@" <<'EOF_PY'
import json, sys
a, b, fields = sys.argv[1], sys.argv[2], sys.argv[3:]
get = lambda r, f: r["rollout"][f[8:]] if f.startswith("rollout.") else r[f]
ra = {r["step"]: r for r in map(json.loads, open(a))}
rb = {r["step"]: r for r in map(json.loads, open(b))}
for s, r in rb.items():
    for f in fields:
        assert get(r, f) == get(ra[s], f), (s, f, get(ra[s], f), get(r, f))
EOF_PY
}
same "$work/a/metrics/rank-0.jsonl" "$work/b/metrics/rank-0.jsonl" loss rollout.reward rollout.reply_tokens ||
  fail "a second run sampled other rollouts"

# Preempted mid-run and resumed: the rollouts are sampled again from the step and the same weights.
preempt_and_resume "$work/c" 4 "$work/c.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/c" "${grpo[@]}" \
  --run.steps=100 || fail "preempt and resume"
same "$work/a/metrics/rank-0.jsonl" "$work/c/metrics/rank-0.jsonl" loss rollout.reward ||
  fail "the resumed run's curve differs"

# Two updates per rollout: a rollout is sampled at its first step, under the weights of that moment, and its
# second step trains the other half of its replies one update later: the ratio is exactly 1 at a rollout's
# first update and moves at its second. Preempted at step 3 or later, the run stops after the rollout's last
# update (checkpoints fall between rollouts) and resumes to the same curve.
u2=("${grpo[@]}" --rl.updates_per_rollout=2 --run.steps=20)
"$train" "$src/configs/tiny.ini" --run.dir="$work/u2" "${u2[@]}" 2>"$work/u2.log" ||
  fail "two updates per rollout: $(tail -n1 "$work/u2.log")"
python3 - "$work/u2/metrics/rank-0.jsonl" <<'EOF_PY' || fail "two updates per rollout: the ratio or the rollouts are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20, len(rows)
firsts, seconds = rows[0::2], rows[1::2]
assert all("rollout" in r and r["ratio"] == 1.0 and r["clip_fraction"] == 0.0 for r in firsts), firsts[0]
assert all("rollout" not in r for r in seconds), seconds[0]
# Here a forward at sampling time recomputes every mini-batch's log-probabilities.
assert all(r["rollout"]["logp_diff_max"] < 1e-4 and "logp_diff_max" not in r for r in firsts), firsts[0]
moved = sum(r["ratio"] != 1.0 for r in seconds)
assert moved >= len(seconds) // 2, [r["ratio"] for r in seconds]
print(f"two updates per rollout: ratio 1 at every rollout's first update, moved at {moved} of {len(seconds)} second ones")
EOF_PY
preempt_and_resume "$work/u2r" 3 "$work/u2r.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/u2r" "${u2[@]}" ||
  fail "two updates per rollout: preempt and resume"
python3 - "$work/u2r" <<'EOF_PY' || fail "two updates per rollout: a checkpoint inside a rollout"
import os, sys
steps = [int(d.split("-")[1]) for t in ("recovery", "milestone") for d in os.listdir(f"{sys.argv[1]}/checkpoints/{t}")]
assert steps and all(s % 2 == 0 for s in steps), steps
EOF_PY
same "$work/u2/metrics/rank-0.jsonl" "$work/u2r/metrics/rank-0.jsonl" loss ratio ||
  fail "two updates per rollout: the resumed run's curve differs"
# On two pipeline stages the log-probabilities at sampling time are a forward through the pipeline, the
# last stage's sent to the first: the same rollouts and curve (the second updates' losses are near 0, and
# the pipeline's tied embedding sums its two stages' gradients in another order, which Adam carries to
# 2e-6 by step 14: compared absolutely).
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/u2pp" "${u2[@]}" --parallel.pp=2 \
  2>"$work/u2pp.log" || fail "two updates per rollout on pp2: $(tail -n1 "$work/u2pp.log")"
python3 - "$work/u2/metrics/rank-0.jsonl" "$work/u2pp/metrics/rank-0.jsonl" <<'EOF_PY' || fail "two updates per rollout on pp2"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 20
for x, y in zip(a, b):
    assert x.get("rollout", {}).get("reward") == y.get("rollout", {}).get("reward"), (x["step"], "other rollouts")
    assert abs(x["loss"] - y["loss"]) <= 1e-5 and abs(x["ratio"] - y["ratio"]) <= 1e-5, (x["step"], x["loss"], y["loss"])
EOF_PY
# Under ZeRO-3 the rollouts sample from, and record their log-probabilities under, the gathered weights:
# two data-parallel ranks give ZeRO-1's losses and ratios bit for bit.
for z in 1 3; do
  mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/u2z$z" "${model[@]}" "${rl[@]}" --rl.group_size=4 \
    --data.batch=4 --data.dataset="$work/sums" --rl.updates_per_rollout=2 --run.steps=6 --parallel.dp=2 \
    --parallel.zero=$z 2>"$work/u2z$z.log" || fail "ZeRO-$z rollouts: $(tail -n1 "$work/u2z$z.log")"
done
same "$work/u2z1/metrics/rank-0.jsonl" "$work/u2z3/metrics/rank-0.jsonl" loss ratio ||
  fail "rollouts under ZeRO-3 differ from ZeRO-1's"
rc=0
"$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${grpo[@]/--ckpt.recovery_every=10/--ckpt.recovery_every=5}" \
  --rl.updates_per_rollout=2 --run.steps=20 >"$work/bad.log" 2>&1 || rc=$?
[ "$rc" -eq 64 ] && grep -q "ckpt.recovery_every.*multiple of rl.updates_per_rollout = 2" "$work/bad.log" ||
  fail "recovery_every inside a rollout: exit $rc, $(head -n1 "$work/bad.log")"

# The KL to the reference, which at step 1 is the policy itself: exactly 0.
"$train" "$src/configs/tiny.ini" --run.dir="$work/kl" "${grpo[@]}" --rl.kl_coef=0.05 --run.steps=3 \
  2>"$work/kl.log" || fail "grpo with kl: $(tail -n1 "$work/kl.log")"
python3 - "$work/kl/metrics/rank-0.jsonl" <<'EOF_PY' || fail "the KL is wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[0]["kl"] == 0.0 and rows[0]["ratio"] == 1.0, rows[0]
assert rows[-1]["kl"] > 0, ("the policy moved but its KL is 0", rows[-1])
EOF_PY

# Two data-parallel ranks sample and train the rows one rank does in two micro-batches; two
# tensor-parallel ranks sample in step from the logits they gather (each holds half the vocabulary's
# columns, half the heads and their cache) and train as one rank does; two pipeline stages decode in turn
# (the stream's rows passed on, the last stage's logits sent back to the first) and train through the
# schedule; tp2 x pp2 both: the same rollouts, the same curve.
layout=("${model[@]}" "${rl[@]}" --rl.group_size=4 --data.batch=4 --data.dataset="$work/sums" --run.steps=5)
"$train" "$src/configs/tiny.ini" --run.dir="$work/dp1" "${layout[@]}" --parallel.microbatches=2 \
  2>"$work/dp1.log" || fail "dp1: $(tail -n1 "$work/dp1.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/dp2" "${layout[@]}" \
  --parallel.dp=2 2>"$work/dp2.log" || fail "dp2: $(tail -n1 "$work/dp2.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/tp2" "${layout[@]}" --parallel.microbatches=2 \
  --parallel.tp=2 2>"$work/tp2.log" || fail "tp2: $(tail -n1 "$work/tp2.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/pp2" "${layout[@]}" --parallel.microbatches=2 \
  --parallel.pp=2 2>"$work/pp2.log" || fail "pp2: $(tail -n1 "$work/pp2.log")"
mpirun -np 4 --oversubscribe "$train" "$src/configs/tiny.ini" --run.dir="$work/tp2pp2" "${layout[@]}" \
  --parallel.microbatches=2 --parallel.tp=2 --parallel.pp=2 2>"$work/tp2pp2.log" ||
  fail "tp2 x pp2: $(tail -n1 "$work/tp2pp2.log")"
for other in dp2 tp2 pp2 tp2pp2; do
  compare "$work/dp1" "$work/$other"
  python3 - "$work/dp1/metrics/rank-0.jsonl" "$work/$other/metrics/rank-0.jsonl" <<'EOF_PY' || fail "$other sampled other rollouts"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
for x, y in zip(a, b):
    assert x["rollout"]["reward"] == y["rollout"]["reward"], (x["rollout"], y["rollout"])
    assert x["rollout"]["reply_tokens"] == y["rollout"]["reply_tokens"]
    assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-4 * max(x["grad_norm"], 1e-3), (x["grad_norm"], y["grad_norm"])
EOF_PY
done

# A Mixture-of-Experts policy with its experts shared out over two ranks (ep2 within dp2): each rank
# samples its own prompts, and a decoding step sends tokens to the other rank's experts, so the two decode
# in step while either has rows (GPT::decoding), the one that finished with none (without that, the ranks
# wait on each other's exchanges for ever: hence the timeout). PPO with one reply a prompt and a hot
# sampler, so that the ranks' replies end at different steps. The same rollouts and curve as dp2 with every
# expert on each rank.
moe=(--model.ffn=moe --model.experts=4 --model.top_k=2 --model.moe_every=2)  # the second block: pp2 puts it on stage 1
"$train" "$src/configs/tiny.ini" --run.dir="$work/sft-moe" "${model[@]}" "${moe[@]}" --data.dataset="$work/chat" \
  --run.objective=sft --optim.lr=3e-3 --run.steps=100 --ckpt.milestone_every=100 2>"$work/sft-moe.log" ||
  fail "moe sft run: $(tail -n1 "$work/sft-moe.log")"
moe_rl=("${model[@]}" "${moe[@]}" "${rl[@]/--ckpt.init_from=*/--ckpt.init_from=$work/sft-moe/checkpoints/milestone/step-00000100}")
moe_rl=("${moe_rl[@]/--run.objective=grpo/--run.objective=ppo}")
moe_rl=("${moe_rl[@]/--rl.max_new_tokens=6/--rl.max_new_tokens=12}" --rl.temperature=3 --rl.group_size=1
  --data.batch=1 --data.dataset="$work/sums" --run.steps=5 --parallel.dp=2)
for ep in 1 2; do
  timeout 120 mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/moe-ep$ep" "${moe_rl[@]}" \
    --parallel.ep=$ep 2>"$work/moe-ep$ep.log" || fail "moe rollouts at ep$ep: exit $?, $(tail -n1 "$work/moe-ep$ep.log")"
done
# On two pipeline stages too (4 ranks): the stage without the MoE block follows its peers' decoding.
timeout 120 mpirun -np 4 --oversubscribe "$train" "$src/configs/tiny.ini" --run.dir="$work/moe-ep2pp2" \
  "${moe_rl[@]}" --parallel.ep=2 --parallel.pp=2 2>"$work/moe-ep2pp2.log" ||
  fail "moe rollouts at ep2 x pp2: exit $?, $(tail -n1 "$work/moe-ep2pp2.log")"
python3 -c 'import json, sys; assert any(json.loads(l)["rollout"]["reply_tokens"] % 1 for l in open(sys.argv[1]))' \
  "$work/moe-ep2/metrics/rank-0.jsonl" || fail "the ranks' replies never differed in length: not a test of decoding in step"
for other in moe-ep2 moe-ep2pp2; do
  compare "$work/moe-ep1" "$work/$other"
  same "$work/moe-ep1/metrics/rank-0.jsonl" "$work/$other/metrics/rank-0.jsonl" rollout.reward \
    rollout.reply_tokens || fail "$other sampled other rollouts"
done

# Code rewards: the prompts' tests in the sandbox, their outcomes counted; scored as each reply's sampling
# ends (the default) or after the rollout (rl.overlap_rewards = false): the same rewards and losses.
for overlap in true false; do
  "$train" "$src/configs/tiny.ini" --run.dir="$work/code-$overlap" "${model[@]}" "${rl[@]}" --rl.group_size=4 \
    --data.batch=8 --data.dataset="$work/code" --reward.weights=code:1,format:0.1 --run.steps=2 \
    --rl.overlap_rewards=$overlap 2>"$work/code.log" || fail "code rewards: $(tail -n1 "$work/code.log")"
done
python3 - "$work/code-true/metrics/rank-0.jsonl" "$work/code-false/metrics/rank-0.jsonl" <<'EOF_PY' || fail "code rewards"
import json, sys
while_sampling, after = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
ro = while_sampling[0]["rollout"]
assert sum(ro["sandbox"].values()) == 8, ro
assert "code" in ro["reward_parts"] and "exact_match" not in ro["reward_parts"], ro
assert ro["reward_span_ms"] >= ro["reward_ms"] >= 0, ro
for x, y in zip(while_sampling, after):
    assert x["loss"] == y["loss"] and x["rollout"]["reward"] == y["rollout"]["reward"], (x, y)
EOF_PY

# The gate, given the candidate's prompt set as submit-pipeline gives it: prompts have no replies to
# measure a loss on, so the loss is the chat dataset's (rl.format_dataset), for the candidate and the model
# it started from alike; the suites (here 20 of the sums) as for any candidate. A prompt set for a model
# not trained on one is refused.
"$train" "$src/configs/tiny.ini" --run.dir="$work/g" "${grpo[@]}" --run.steps=4 --ckpt.milestone_every=4 \
  2>"$work/g.log" || fail "grpo run to gate: $(tail -n1 "$work/g.log")"
mkdir -p "$work/suites/sums"
echo '{"name": "sums", "type": "exact_match", "max_new_tokens": 4}' >"$work/suites/sums/suite.json"
head -n 20 "$work/sums.jsonl" >"$work/suites/sums/tasks.jsonl"
cat >"$work/gate.ini" <<EOF_INI
[gate]
min_tokens = 1
[bpb]
max_absolute = 20
[suites]
dir = $work/suites
required.grpo = sums
[suite.sums]
accuracy.max_regression = 1.0
EOF_INI
"$gate" evaluate --checkpoint "$work/g/checkpoints/milestone/step-00000004" --dataset "$work/sums" \
  --baseline "$sft" --policy "$work/gate.ini" --out "$work/gate" --no-promote --threads 1 >"$work/gate.log" 2>&1 ||
  fail "gate of the grpo candidate: exit $?, $(tail -n2 "$work/gate.log")"
python3 - "$work/gate/verdict.json" "$work/chat" "$work/sums" <<'EOF_PY' || fail "the grpo candidate's verdict is wrong"
import json, os, sys
v = json.load(open(sys.argv[1]))
assert v["pass"] and v["dataset"] == os.path.realpath(sys.argv[2]) and v["prompt_set"] == os.path.realpath(sys.argv[3]), v
assert v["replies_only"] and v["domains"]["chat"]["tokens"] > 0 and v["baseline_domains"]["chat"]["tokens"] > 0, v
m = v["suites"]["sums"]["metrics"]["accuracy"]
assert m["n"] == 20 and m["lo"] <= m["value"] <= m["hi"], m
assert "sums" in v["baseline_suites"], v.keys()
EOF_PY
rc=0
"$gate" evaluate --checkpoint "$sft" --dataset "$work/sums" --baseline none --policy "$work/gate.ini" \
  --out "$work/gate-bad" --no-promote >"$work/gate-bad.log" 2>&1 || rc=$?
[ "$rc" -eq 64 ] && grep -q "is a prompt set, which has no replies to measure a loss on.*run.objective = sft" \
  "$work/gate-bad.log" || fail "a prompt set for an sft model: exit $rc, $(tail -n1 "$work/gate-bad.log")"
[ ! -e "$work/gate-bad/verdict.json" ] || fail "a refused gate left a verdict"

# PPO from the same policy, which has no value head: the head is added (ModelSpec::value_head) and trains
# beside the policy, its estimates the advantages' baseline (GAE). At one update per rollout the ratio is
# exactly 1 and the values are the forward's own (the value clip never holds); the value loss falls as the
# head learns what the replies earn. The same rollouts and curve after a preemption, on 2 data-parallel and
# on 2 tensor-parallel ranks and on 2 pipeline stages; two updates per rollout record the rollout's values and clip against them; the
# candidate is gated like GRPO's.
ppo=("${model[@]}" "${rl[@]/--run.objective=grpo/--run.objective=ppo}" --rl.group_size=2 --data.batch=8
  --data.dataset="$work/sums" --rl.value_coef=0.5)
"$train" "$src/configs/tiny.ini" --run.dir="$work/ppo" "${ppo[@]}" --run.steps=60 --ckpt.milestone_every=60 2>"$work/ppo.log" ||
  fail "ppo run: $(tail -n1 "$work/ppo.log")"
grep -q "initialised weights from .*step-00000300" "$work/ppo.log" || fail "ppo did not start from the sft policy"
python3 - "$work/ppo/metrics/rank-0.jsonl" <<'EOF_PY' || fail "the PPO metrics are wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 60, len(rows)
for r in rows:
    assert r["ratio"] == 1.0 and r["clip_fraction"] == 0.0 and r["value_clip_fraction"] == 0.0, r
    assert r["value_loss"] > 0 and "value" in r and 0 <= r["rollout"]["reward"] <= 1, r
    assert r["rollout"]["logp_diff_max"] < 1e-4, r["rollout"]
mean = lambda key, a, b: sum(r[key] for r in rows[a:b]) / (b - a)
first, last = mean("value_loss", 0, 10), mean("value_loss", 50, 60)
assert last < 0.75 * first, ("the value head did not learn", first, last)
print(f"ppo: value loss {first:.4f} over the first 10 steps, {last:.4f} over the last 10; reward by 20 steps",
      [round(sum(r["rollout"]["reward"] for r in rows[i:i + 20]) / 20, 3) for i in range(0, 60, 20)])
EOF_PY
# The run report plots the rollouts and the update: rewards (and each scorer's), reply length, the KL and
# clip fractions, the value head's loss; TensorBoard has them under rl/.
grep -qa "rl/value_loss" "$work"/ppo/tb/events.* && grep -qa "rl/reward" "$work"/ppo/tb/events.* ||
  fail "the ppo run's TensorBoard events have no rl/value_loss or rl/reward"
"$train" report "$work/ppo" >/dev/null 2>"$work/report.log" || fail "report of the ppo run: $(tail -n1 "$work/report.log")"
for series in reward "reward: exact_match" "reply tokens" generation KL "clip fraction" "value clip fraction" \
  "value loss"; do
  grep -q "<polyline class=\"series\" data-series=\"$series\"" "$work/ppo/report.html" ||
    fail "the ppo run's report has no '$series' series"
done
preempt_and_resume "$work/ppo-r" 4 "$work/ppo-r.log" "$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-r" \
  "${ppo[@]}" --run.steps=60 || fail "ppo: preempt and resume"
same "$work/ppo/metrics/rank-0.jsonl" "$work/ppo-r/metrics/rank-0.jsonl" loss value_loss rollout.reward ||
  fail "ppo: the resumed run's curve differs"
"$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-u2" "${ppo[@]}" --rl.updates_per_rollout=2 --run.steps=10 \
  2>"$work/ppo-u2.log" || fail "ppo, two updates per rollout: $(tail -n1 "$work/ppo-u2.log")"
python3 - "$work/ppo-u2/metrics/rank-0.jsonl" <<'EOF_PY' || fail "ppo, two updates per rollout"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
firsts, seconds = rows[0::2], rows[1::2]
assert all(r["ratio"] == 1.0 and r["value_clip_fraction"] == 0.0 for r in firsts), firsts[0]
assert any(r["ratio"] != 1.0 for r in seconds), seconds
EOF_PY
ppo_layout=("${model[@]}" "${rl[@]/--run.objective=grpo/--run.objective=ppo}" --rl.group_size=2 --data.batch=4
  --data.dataset="$work/sums" --run.steps=5)
"$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-dp1" "${ppo_layout[@]}" --parallel.microbatches=2 \
  2>"$work/ppo-dp1.log" || fail "ppo dp1: $(tail -n1 "$work/ppo-dp1.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-dp2" "${ppo_layout[@]}" --parallel.dp=2 \
  2>"$work/ppo-dp2.log" || fail "ppo dp2: $(tail -n1 "$work/ppo-dp2.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-tp2" "${ppo_layout[@]}" \
  --parallel.microbatches=2 --parallel.tp=2 2>"$work/ppo-tp2.log" || fail "ppo tp2: $(tail -n1 "$work/ppo-tp2.log")"
mpirun -np 2 "$train" "$src/configs/tiny.ini" --run.dir="$work/ppo-pp2" "${ppo_layout[@]}" \
  --parallel.microbatches=2 --parallel.pp=2 2>"$work/ppo-pp2.log" || fail "ppo pp2: $(tail -n1 "$work/ppo-pp2.log")"
for other in ppo-dp2 ppo-tp2 ppo-pp2; do
  compare "$work/ppo-dp1" "$work/$other"
  same "$work/ppo-dp1/metrics/rank-0.jsonl" "$work/$other/metrics/rank-0.jsonl" rollout.reward \
    rollout.reply_tokens || fail "$other sampled other rollouts"
done
sed 's/required.grpo = sums/required.ppo = sums/' "$work/gate.ini" >"$work/gate-ppo.ini"
"$gate" evaluate --checkpoint "$work/ppo/checkpoints/milestone/step-00000060" --dataset "$work/sums" \
  --baseline "$sft" --policy "$work/gate-ppo.ini" --out "$work/gate-ppo" --no-promote --threads 1 \
  >"$work/gate-ppo.log" 2>&1 || fail "gate of the ppo candidate: exit $?, $(tail -n2 "$work/gate-ppo.log")"
python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); assert v["suites"]["sums"]["metrics"]["accuracy"]["n"] == 20, v' \
  "$work/gate-ppo/verdict.json" || fail "the ppo candidate's verdict is wrong"
# The checkpoint's lineage names the policy it started from, the reward and the prompt set's version.
python3 - "$work/ppo/checkpoints/milestone/step-00000060/manifest.json" "$sft" <<'EOF_PY' || fail "the ppo checkpoint's lineage"
import json, os, sys
meta = json.load(open(sys.argv[1]))
lineage = meta["extra"]["lineage"]
rl = lineage["rl"]
assert os.path.realpath(lineage["parent"]) == os.path.realpath(sys.argv[2]), lineage
assert rl["objective"] == "ppo" and rl["reward_weights"] == {"exact_match": 1.0}, rl
assert rl["prompt_set_version"] == meta["dataset_version"] and rl["prompt_set_version"], (rl, meta["dataset_version"])
EOF_PY
# Handed back as open weights: the policy in the Hugging Face layout, the critic left behind.
"$ckpt" export "$work/ppo/checkpoints/milestone/step-00000060" --format hf --out "$work/ppo-hf" \
  >"$work/export.log" 2>&1 || fail "export of the ppo candidate: $(tail -n1 "$work/export.log")"
python3 - "$work/ppo-hf" <<'EOF_PY' || fail "the exported ppo policy is wrong"
import glob, json, struct, sys
names = []
for f in glob.glob(f"{sys.argv[1]}/*.safetensors"):
    with open(f, "rb") as fh:
        names += [k for k in json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0])) if k != "__metadata__"]
assert "lm_head.weight" in names or "transformer.wte.weight" in names, names
assert not any("value" in k for k in names), names
# The tokenizer of the chat dataset the policy speaks (rl.format_dataset): a prompt set has none.
assert glob.glob(f"{sys.argv[1]}/tokenizer.*"), "no tokenizer exported"
EOF_PY

# Bad input: one line naming the key or file, 64 or 65, nothing trained.
refused() {  # refused RC PATTERN ARGS...
  local rc=$1 pattern=$2
  shift 2
  "$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${model[@]}" "${rl[@]}" --data.batch=8 --run.steps=1 \
    "$@" >"$work/bad.log" 2>&1
  local got=$?
  [ $got -eq "$rc" ] || { cat "$work/bad.log" >&2; fail "$* exited $got, want $rc"; }
  grep -q -- "$pattern" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "$*: no '$pattern'"; }
}
refused 64 "rl.group_size" --rl.group_size=1 --data.dataset="$work/sums"
refused 64 "rl.group_size" --rl.group_size=3 --data.dataset="$work/sums"
refused 64 "reward.weights.*'judge' is not a scorer" --reward.weights=judge:1 --data.dataset="$work/sums"
refused 64 "parallel.sequence_parallel.*decodes a few rows" --parallel.tp=2 --parallel.sequence_parallel=true \
  --data.dataset="$work/sums"
refused 64 "rl.temperature" --rl.temperature=0 --data.dataset="$work/sums"
refused 64 "rl.updates_per_rollout.*\[1, 64\]" --rl.updates_per_rollout=0 --data.dataset="$work/sums"
refused 64 "run.steps.*multiple of rl.updates_per_rollout = 2" --rl.updates_per_rollout=2 --data.dataset="$work/sums"
refused 65 "prompts.jsonl: 4 of 4 prompts.*no answer" --data.dataset="$work/code"
refused 64 "run.objective" --data.dataset="$work/chat"
refused 64 "rl.value_coef.*PPO's value head" --rl.value_coef=1 --data.dataset="$work/sums"
refused 64 "model.value_head.*only run.objective = ppo" --model.value_head=on --data.dataset="$work/sums"
"$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${ppo[@]}" --ckpt.init_optimizer=keep --run.steps=1 \
  >"$work/bad.log" 2>&1
[ $? -eq 64 ] && grep -q "ckpt.init_optimizer.*has no value head" "$work/bad.log" && [ ! -e "$work/bad/checkpoints" ] ||
  { cat "$work/bad.log" >&2; fail "ppo keeping moments the head has none of: not 64"; }
no_policy=()
for a in "${rl[@]}"; do [[ $a == --ckpt.init_from=* ]] || no_policy+=("$a"); done
"$train" "$src/configs/tiny.ini" --run.dir="$work/bad" "${model[@]}" "${no_policy[@]}" \
  --data.dataset="$work/sums" --data.batch=8 --run.steps=1 >"$work/bad.log" 2>&1
[ $? -eq 64 ] && grep -q "ckpt.init_from" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "no policy: not 64"; }
echo "grpo and ppo: ok"
