#!/usr/bin/env bash
# Where a GRPO step's time goes on the CPU, and whether sampling on the training ranks is as fast as the
# gate's own generator (issue 43): a chat model fine-tuned on single-digit sums (4 blocks of 256, 2
# threads; its replies a short sentence), then run.objective = grpo on the sums' prompt set (32 replies a
# step: 4 prompts x 8, up to 24 new tokens, temperature 1, exact-match reward). Prints the step's shares
# (generation, reward, the rollout's other work: the batches, and the KL reference's forward if any; at one
# update per rollout the training forward is the recomputation of the log-probabilities; training), the
# rollouts' generation tokens/s, and `forge-gate generate` on the same checkpoint with the same batch,
# sampling and prompts in the same run: the ratio RL / generate (the issue's goal: >= 0.9).
# Then PPO with the same settings: its training time a step against GRPO's (the value head's cost).
# Then the code reward: the same model on 100 prompts with Python tests (reward.weights = code:1), every
# reply run in the bubblewrap sandbox, 1 and 2 at once (rl.sandbox_parallel); rewards per second and their
# share of the step, next to the machine's limit measured in the same run: the same programs run by a bare
# python3, as many at once, no sandbox.
#
# usage: bench/grpo.sh [BUILD_DIR] [STEPS]   (default build/release, 20 GRPO steps; the programs are built if
#   needed). JOBS=N sets the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
steps=${2:-20}
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
build_targets grpo.sh "$build" forge-train forge-data forge-gate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
machine

/usr/bin/python3 - "$work" <<'PY'
import json, random, sys
work = sys.argv[1]
random.seed(5)
with open(f"{work}/chat.jsonl", "w") as f:
    for _ in range(2000):
        a, b = random.randint(0, 9), random.randint(0, 9)
        f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                         {"role": "assistant",
                                          "content": f"{a} and {b} make {a + b}, so the answer is {a + b}."}]}) + "\n")
with open(f"{work}/code.jsonl", "w") as f:
    ops = [("add", "+"), ("sub", "-"), ("mul", "*"), ("big", "max"), ("small", "min")]
    for i in range(100):
        name, op = ops[i % len(ops)]
        a, b = random.randint(0, 9), random.randint(0, 9)
        want = eval(f"{op}({a}, {b})") if op.isalpha() else eval(f"{a} {op} {b}")
        f.write(json.dumps({"id": f"code-{i}", "prompt": f"Write {name}(a, b) for {a} and {b}.",
                            "tests": f"assert {name}({a}, {b}) == {want}", "entry_point": name}) + "\n")
with open(f"{work}/sums.jsonl", "w") as f, open(f"{work}/generate.jsonl", "w") as g:
    for a in range(10):
        for b in range(10):
            f.write(json.dumps({"id": f"sum-{a}-{b}", "prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
            g.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"}]}) + "\n")
PY
"$build/dataio/forge-data" prepare --format chat --input "$work/chat.jsonl=chat" --vocab 320 --valid-fraction 0.05 \
  --out "$work/chat" >/dev/null 2>"$work/prepare.log" || { tail -n3 "$work/prepare.log" >&2; exit 1; }
"$build/dataio/forge-data" prepare --format prompts --input "$work/sums.jsonl=arithmetic" --out "$work/sums" \
  >/dev/null 2>"$work/prepare.log" || { tail -n3 "$work/prepare.log" >&2; exit 1; }
model=(--run.threads=2 --model.family=llama --model.layers=4 --model.d_model=256 --model.heads=4 --model.kv_heads=2
  --model.seq_len=64 --model.vocab=320 --ckpt.recovery_every=0)
"$build/dataio/forge-data" prepare --format prompts --input "$work/code.jsonl=code" --out "$work/code" \
  >/dev/null 2>"$work/prepare.log" || { tail -n3 "$work/prepare.log" >&2; exit 1; }
"$build/launcher/forge-train" "$root/configs/tiny.ini" --run.dir="$work/sft" "${model[@]}" --data.dataset="$work/chat" \
  --run.objective=sft --optim.lr=3e-3 --run.steps=300 --ckpt.milestone_every=300 2>"$work/sft.log" ||
  { tail -n3 "$work/sft.log" >&2; exit 1; }
sft=$work/sft/checkpoints/milestone/step-00000300
"$build/launcher/forge-train" "$root/configs/tiny.ini" --run.dir="$work/grpo" "${model[@]}" --run.objective=grpo \
  --ckpt.init_from="$sft" --rl.format_dataset="$work/chat" --data.dataset="$work/sums" --data.batch=32 \
  --rl.group_size=8 --rl.max_new_tokens=24 --optim.lr=1e-4 --optim.min_lr=1e-4 --optim.warmup_steps=0 \
  --run.steps="$steps" --ckpt.milestone_every=0 2>"$work/grpo.log" || { tail -n3 "$work/grpo.log" >&2; exit 1; }
# The peer: the gate's generator on the same checkpoint, batch 32 (4 prompts x 8 samples at a time), the
# same sampling, every one of the 100 prompts.
"$build/eval_gate/forge-gate" generate --checkpoint "$sft" --dataset "$work/chat" --chat \
  --prompts "$work/generate.jsonl" --samples 8 --batch 32 --max-new-tokens 24 --temperature 1 --threads 2 2>"$work/generate.err" >/dev/null ||
  { tail -n3 "$work/generate.err" >&2; exit 1; }
peer=$(sed -n 's/.*; \([0-9.]*\) tokens\/s per rank.*/\1/p' "$work/generate.err")
/usr/bin/python3 - "$work/grpo/metrics/rank-0.jsonl" "$peer" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]  # the first two steps warm the caches
peer = float(sys.argv[2])
n = len(rows)
mean = lambda f: sum(f(r) for r in rows) / n
# A step is its batch (data_wait_ms: the rollout, sampled, scored and recomputed) and its training
# (step_ms: forward, backward and update).
train = mean(lambda r: r["step_ms"])
step = train + mean(lambda r: r["data_wait_ms"])
gen = mean(lambda r: r["rollout"]["generation_ms"])
reward = mean(lambda r: r["rollout"]["reward_ms"])
rollout = step - train - gen - reward  # the batches (the log-probabilities: the training forward's)
tps = mean(lambda r: r["rollout"]["generation_tokens_per_s"])
print(f"shape: llama 4 x 256, 32 replies a step (4 prompts x 8), up to 24 new tokens, 2 threads; steps 3-{n + 2}")
print(f"step {step:.1f} ms: generation {gen:.1f} ms ({100 * gen / step:.1f}%), reward {reward:.2f} ms "
      f"({100 * reward / step:.2f}%), rollout's other work {rollout:.1f} ms ({100 * rollout / step:.1f}%), "
      f"training {train:.1f} ms ({100 * train / step:.1f}%)")
reply = mean(lambda r: r["rollout"]["reply_tokens"])
print(f"reward {mean(lambda r: r['rollout']['reward']):.3f}, reply {reply:.1f} tokens")
print(f"generation: {tps:.0f} tokens/s during RL, forge-gate generate {peer:.0f} tokens/s: "
      f"RL / generate {tps / peer:.2f}")
PY

# PPO on the same shape (run.objective = ppo, the same settings and seed): what the value head costs a step
# (its estimates, the advantages along each reply, its share of the backward), against the GRPO run above.
"$build/launcher/forge-train" "$root/configs/tiny.ini" --run.dir="$work/ppo" "${model[@]}" --run.objective=ppo \
  --ckpt.init_from="$sft" --rl.format_dataset="$work/chat" --data.dataset="$work/sums" --data.batch=32 \
  --rl.group_size=8 --rl.max_new_tokens=24 --optim.lr=1e-4 --optim.min_lr=1e-4 --optim.warmup_steps=0 \
  --run.steps="$steps" --ckpt.milestone_every=0 2>"$work/ppo.log" || { tail -n3 "$work/ppo.log" >&2; exit 1; }
/usr/bin/python3 - "$work/grpo/metrics/rank-0.jsonl" "$work/ppo/metrics/rank-0.jsonl" <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)][2:] for p in sys.argv[1:]]
mean = lambda rows, f: sum(f(r) for r in rows) / len(rows)
(g_train, p_train), (g_gen, p_gen) = ([mean(rows, f) for rows in runs] for f in (
    lambda r: r["step_ms"], lambda r: r["rollout"]["generation_ms"]))
print(f"ppo: training {p_train:.1f} ms a step against grpo's {g_train:.1f} ms: ppo / grpo {p_train / g_train:.3f}; "
      f"generation {p_gen:.1f} against {g_gen:.1f} ms; value loss {runs[1][0]['value_loss']:.4f} at step 3, "
      f"{runs[1][-1]['value_loss']:.4f} at the last")
PY

# The code reward: each reply (a sentence from this model, which Python rejects: a sandbox run that fails,
# as most early code replies do) runs in its own sandbox; 1 and 2 at once, scored after the rollout
# (rl.overlap_rewards = false, the peer) and as each reply's sampling ends (the default).
code_steps=6
for parallel in 1 2; do
  for overlap in false true; do
    "$build/launcher/forge-train" "$root/configs/tiny.ini" --run.dir="$work/code-$parallel-$overlap" "${model[@]}" \
      --run.objective=grpo --ckpt.init_from="$sft" --rl.format_dataset="$work/chat" --data.dataset="$work/code" \
      --data.batch=32 --rl.group_size=8 --rl.max_new_tokens=24 --reward.weights=code:1 \
      --rl.sandbox_parallel=$parallel --rl.overlap_rewards=$overlap --run.steps=$code_steps \
      --ckpt.milestone_every=0 2>"$work/code.log" || { tail -n3 "$work/code.log" >&2; exit 1; }
  done
done
# The limit: the programs the sandbox ran, by a bare python3 (the tests after a reply of the same length),
# 64 of them, 1 and 2 at once.
bare() {
  local start end
  start=$(date +%s.%N)
  seq 64 | xargs -P "$1" -I{} /usr/bin/python3 -c 'The answer is 7 and 2 make 9.
assert add(7, 2) == 9' 2>/dev/null || true
  end=$(date +%s.%N)
  /usr/bin/python3 -c "print(64 / ($end - $start))"
}
bare1=$(bare 1)
bare2=$(bare 2)
/usr/bin/python3 - "$work" "$bare1" "$bare2" <<'PY'
import json, sys
work, bare = sys.argv[1], {1: float(sys.argv[2]), 2: float(sys.argv[3])}
print("code reward: 100 prompts with Python tests, 32 replies a step, each run in the bubblewrap sandbox")
for parallel in (1, 2):
    steps = {}
    for overlap in ("false", "true"):
        rows = [json.loads(l) for l in open(f"{work}/code-{parallel}-{overlap}/metrics/rank-0.jsonl")][1:]
        n = len(rows)
        mean = lambda f: sum(f(r) for r in rows) / n
        step = mean(lambda r: r["step_ms"] + r["data_wait_ms"])
        steps[overlap] = step
        gen = mean(lambda r: r["rollout"]["generation_ms"])
        wait = mean(lambda r: r["rollout"]["reward_ms"])
        span = mean(lambda r: r["rollout"]["reward_span_ms"])
        outcomes = {}
        for r in rows:
            for k, v in r["rollout"].get("sandbox", {}).items():
                outcomes[k] = outcomes.get(k, 0) + v
        if overlap == "false":  # scored after sampling: the span is the scoring alone
            rate = 32 / (wait / 1e3)
            print(f"  {parallel} at once, after the rollout: {rate:.1f} rewards/s, reward {wait:.0f} ms of a "
                  f"{step:.0f} ms step ({100 * wait / step:.0f}%), generation {gen:.0f} ms; bare python3 "
                  f"{bare[parallel]:.1f} runs/s: sandbox / bare {rate / bare[parallel]:.2f}; outcomes {outcomes}")
        else:
            print(f"  {parallel} at once, while sampling: the step waits {wait:.0f} ms for rewards "
                  f"({100 * wait / step:.0f}% of a {step:.0f} ms step), generation {gen:.0f} ms, scoring spans "
                  f"{span:.0f} ms from the first reply; step after / while {steps['false'] / step:.2f}")
PY
load_after
