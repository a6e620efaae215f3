#!/usr/bin/env bash
# The README's first command as a newcomer runs it (label fresh): scripts/demo.sh --fast in a clean copy of
# this checkout (what git tracks and the files it would track, without any build tree), with no
# FORGE_BUILD_DIR, so the demo configures and builds its own tree (the `programs` target; ccache may serve
# the objects the suite's build compiled, never that build's tree) and every stage runs on what it built.
# Then checks that every stage ran and printed its line, that the run's outputs exist (continuous loss
# curve across the preemption, gate verdict, cost report), and that the demo leaves no job behind. The
# demo points the cluster at the copy's plugin and programs; at the end they are pointed back at the
# suite's build (FORGE_BUILD_DIR) and the copy is removed.
# Exit 0 = pass; one "FAIL: ..." line per failed check. Needs scripts/devcluster/up.
set -uo pipefail

STATE=${FORGE_DEVCLUSTER_DIR:-/var/lib/forge-devcluster}
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ -r "$STATE/env.sh" ] || { echo "FAIL: $STATE/env.sh missing: start the cluster with scripts/devcluster/up"; exit 1; }
# shellcheck source=/dev/null
source "$STATE/env.sh"
scontrol ping 2>/dev/null | grep -q 'is UP' || { echo "FAIL: slurmctld not answering (scripts/devcluster/status)"; exit 1; }
[ -n "${FORGE_BUILD_DIR:-}" ] || { echo "FAIL: FORGE_BUILD_DIR is not set (ctest sets it to the build tree)"; exit 1; }
SUITE_BUILD=$FORGE_BUILD_DIR
unset FORGE_BUILD_DIR

# World-readable: the demo's jobs and its users (carol approves) read the copy's scripts and programs.
WORK=$(mktemp -d /var/tmp/forge-fresh.XXXXXX)
chmod 755 "$WORK"
LOG=$WORK/demo.log
COPY=$WORK/checkout
job_ids() { sed -nE 's/^(train|gate) job: *([0-9]+)$/\2/p' "$LOG" 2>/dev/null; }
# The cluster's plugin, hooks and installed programs back on the suite's build, as scripts/test.sh set them.
restored=0
restore_cluster() {
  restored=1
  (cd "$SRC" && scripts/slurm/write-plugstack.sh "$SUITE_BUILD" "$STATE/forge-plugstack.conf" &&
    FORGE_SPANK_PLUGSTACK=$STATE/forge-plugstack.conf FORGE_HEALTH_BIN=$SUITE_BUILD/health/forge-health \
      FORGE_QUOTA_BIN=$SUITE_BUILD/quota/forge-quota FORGE_CKPT_BIN=$SUITE_BUILD/ckpt/forge-ckpt \
      scripts/devcluster/up) >"$WORK/restore.log" 2>&1
}
cleanup() {
  local ids
  ids=$(job_ids)
  [ -n "$ids" ] && scancel $ids 2>/dev/null
  [ $restored = 1 ] || restore_cluster || echo "FAIL: the cluster is not back on $SUITE_BUILD: $(tail -n1 "$WORK/restore.log")"
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$COPY"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r cp --parents -t "$COPY" 2>/dev/null)
else
  (cd "$SRC" && tar --exclude=./build --exclude='./build-*' -cf - .) | tar -C "$COPY" -xf -
fi
[ -x "$COPY/scripts/demo.sh" ] && [ ! -e "$COPY/build" ] || { echo "FAIL: cannot make a clean copy of $SRC in $COPY"; exit 1; }
chmod -R a+rX "$COPY"
BUILD=$COPY/build/release

export FORGE_DEMO_DIR=$WORK/demo
timeout "${FORGE_DEMO_TIMEOUT:-1800}" "$COPY/scripts/demo.sh" --fast >"$LOG" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "demo.sh --fast exited $rc; the last lines of its output:"
  tail -n 40 "$LOG" | sed 's/^/    /'
fi

for s in "install dependencies" "build" "dev cluster up" "demo corpus and dataset" "approval: the pretraining job" \
  "admission holds after submission" "submit the pipeline" \
  "preempt the training job" "a GPU fails mid-run" "gate: evaluate" "post-training: SFT on chat data" \
  "post-training: DPO on preference pairs" "open weights: the release out" "evaluation: task suites" \
  "reinforcement learning: GRPO" \
  "accounting: forge-quota sync and report" "done"; do
  grep -qE "^\[demo [0-9:]+\] == $s" "$LOG" || fail "no progress line for stage '$s'"
done
run=$FORGE_DEMO_DIR/runs/demo
grep -qE "^loss curve: [0-9]+ steps, .* continuous across the preemption" "$LOG" ||
  fail "no continuous loss curve reported"
grep -q "resumed from" "$LOG" || fail "the training job did not report resuming from a checkpoint"
# Pools and approval (docs/ADMISSION.md): data preparation on the data partition, training on train, the gate
# on eval; the pretraining job admitted with carol's approval, which the ledger ties to the job.
grep -qE "^prepare job [0-9]+ ran on partition data \(node\[3-4\]\)" "$LOG" || fail "the dataset was not prepared on the data pool's two nodes"
grep -qE "^  rank 1 on .*shards written" "$LOG" || fail "the prepare's work split (rank 1) is not shown"
grep -qE "on 2 ranks$" "$LOG" || fail "the dataset was not prepared on 2 ranks"
grep -qE "^languages \(token share\):.* en [0-9]" "$LOG" || fail "the dataset's language shares are not shown"
grep -qE "^pools: training job [0-9]+ ran on partition train, its gate [0-9]+ on eval$" "$LOG" ||
  fail "training and gate pools: $(grep -m1 '^pools:' "$LOG")"
approval=$(grep -oE 'apr-[0-9a-f]{12}' "$LOG" | head -n1)
[ -n "$approval" ] || fail "no approval id in the demo's output"
train_job=$(grep -m1 -oE '^train job: [0-9]+' "$LOG" | grep -oE '[0-9]+$')
grep -E "^$approval\b|\b$approval\b" "$LOG" | grep -qw "carol" ||
  fail "the approval report does not show carol's decision on $approval"
grep -q "^as bob: 0 rows mention $approval" "$LOG" || fail "bob sees team-a's approval: $(grep -m1 '^as bob:' "$LOG")"
for change in NumNodes=3 Gres=gpu:24 Partition=eval QOS=pretrain; do
  grep -qE "^refused $change: .* for job [0-9]+ \(.+\)$" "$LOG" ||
    fail "alice's $change of her held job was not refused with the rule: $(grep -m1 "$change" "$LOG")"
done
sacct -n -X -P -j "$train_job" -o AdminComment | grep -q "forge-approval=$approval" ||
  fail "training job $train_job does not carry forge-approval=$approval"
[ -s "$run/summary.json" ] || fail "no $run/summary.json"
[ -s "$run/gate/verdict.json" ] || fail "no gate verdict ($run/gate/verdict.json)"
[ -s "$FORGE_DEMO_DIR/quota-report.html" ] || fail "no cost report ($FORGE_DEMO_DIR/quota-report.html)"
grep -q "<svg" "$run/report.html" 2>/dev/null || fail "no training report with plots ($run/report.html)"
grep -q "^model llama: 2 blocks of 128, 4 heads sharing 2 key/value heads" "$LOG" ||
  fail "the demo did not show its pretraining run's model family: $(grep -m1 '^model ' "$LOG")"
# Open weights (issue 40): the release out in the Hugging Face layout, imported, fine-tuned with its own
# chat template, gated, out again; the fine-tune's lineage leads to the import and where it came from.
ow=$FORGE_DEMO_DIR/open-weights
for f in config.json generation_config.json model.safetensors tokenizer.model tokenizer_config.json; do
  [ -s "$ow/published/$f" ] && [ -s "$ow/fine-tuned/$f" ] || fail "the open-weights stage did not write $f"
done
grep -qE "^imported $ow/published \(LlamaForCausalLM, bfloat16" "$LOG" || fail "no import of the published release shown"
grep -qE "^  imported from $ow/published " "$LOG" || fail "the fine-tune's lineage does not lead to the import's origin"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s.get('layout') == 'tp2,pp2,dp4' and s.get('ranks') == 16 else 'summary says ' + str(s.get('layout')))" \
  "$run/summary.json" || fail "the run did not train on tp2,pp2,dp4 (16 ranks)"
python3 -c "import glob,json,sys; m=json.load(open(sorted(glob.glob(sys.argv[1]))[-1])); sys.exit(0 if m['extra']['spec'].get('parallel.sequence_parallel') == 'true' else 'not sequence-parallel')" \
  "$run/checkpoints/milestone/*/manifest.json" || fail "the demo run did not train with sequence parallelism"

# Steps 3-4 traced on all 16 ranks and merged (test/launcher/check_trace.py: balanced, every block,
# collectives with groups and bytes, compute spans = the metrics' compute time within 5%; 16 ranks share
# 2 cores here, so one rank may lose a time slice between two spans).
grep -q "^trace: steps 3-4 of 16 ranks on one timeline" "$LOG" || fail "no merged trace of the 16 ranks reported"
python3 "$SRC/test/launcher/check_trace.py" "$run/trace/steps-3-4" "$run" 3 4 --outliers 1 >"$WORK/trace-check.txt" 2>&1 ||
  fail "the demo's trace: $(tail -n1 "$WORK/trace-check.txt")"
grep -q "^forge_job_tokens_per_second{job_id=" "$LOG" || fail "the running job's Prometheus gauges were not shown"
grep -q "^prometheus: .*forge_quota.prom" "$LOG" || fail "no forge-quota Prometheus textfile"
# The vision-language model: aligned from the release (which comes out bit for bit), then gated on the
# held-out pictures with both question suites' intervals above chance, and round-tripped through LLaVA's
# layout.
grep -qE "^alignment: ([0-9]+) of \1 language-model tensors bit-identical to the release" "$LOG" ||
  fail "no bit-identical release after alignment: $(grep -m1 '^alignment:' "$LOG")"
grep -qE "^vqa: chance on these 100 questions is 0\.[0-9]+; suite:shapes accuracy .*; suite:shapes-choice accuracy" "$LOG" ||
  fail "the vision-language model's gate did not beat chance: $(grep -m1 '^vqa:' "$LOG")"
grep -qE "^llava: LlavaForConditionalGeneration, image_token_index [0-9]+, 16 positions a picture; ([0-9]+) of \1 tensors back bit for bit" "$LOG" ||
  fail "the vision-language model did not round-trip through LLaVA's layout: $(grep -m1 '^llava:' "$LOG")"
[ -s "$ow/vlm/model.safetensors" ] && [ -s "$ow/vlm/tokenizer.model" ] || fail "no LLaVA export at $ow/vlm"
grep -qE "^grpo: [0-9]+ steps, [0-9]+ rollouts of 64 replies .* sampler vs trainer log-probabilities within" "$LOG" ||
  fail "the reinforcement-learning stage did not report its rollouts: $(grep -m1 '^grpo:' "$LOG")"
grep -qE "^grpo gate: copy accuracy [0-9.]+ \[[0-9.]+, [0-9.]+\] -> [0-9.]+ \[[0-9.]+, [0-9.]+\], difference [-+][0-9.]+ \[" "$LOG" ||
  fail "the reinforcement-learning candidate's held-out accuracy was not shown: $(grep -m1 '^grpo gate:' "$LOG")"
python3 - "$FORGE_DEMO_DIR" <<'PY' || fail "the reinforcement-learning candidate's gate is wrong"
import json, sys
work = sys.argv[1]
v = json.load(open(f"{work}/runs/grpo/gate/verdict.json"))
assert v["pass"] and v["promoted_to"], [c for c in v["checks"] if not c["pass"]]
assert v["prompt_set"] == f"{work}/prompts" and v["dataset"] == f"{work}/tasks-dataset", (v["prompt_set"], v["dataset"])
assert sorted(v["suites"]) == ["arith", "copy"] and v["baseline_suites"]["copy"]["metrics"]["accuracy"]["n"] == 60, v["suites"]
PY
grep -q "quota not checked" "$LOG" && fail "a submission was not checked against the quota: $(grep -m1 'quota not checked' "$LOG")"
# The preemption is the planned path: one line for the 16-rank job, not one per rank, and not an error.
train_out=$(ls -v "$FORGE_DEMO_DIR"/forge-forge-pretrain-*.out 2>/dev/null | head -n1)
n=$(grep -c ": stopped: preempted" "$train_out" 2>/dev/null)
[ "$n" = 1 ] || fail "the preempted job's output has $n 'stopped: preempted' lines, want 1 (${train_out:-no output file})"
grep "forge-train: error:" "$train_out" 2>/dev/null | grep -v "GPU error: xid 79" | grep -q . &&
  fail "the preemption printed as an error: $(grep -m1 'forge-train: error:' "$train_out")"
# The injected GPU fault: class gpu, its node drained by forge-health (then resumed), the job resumed.
grep -q "exit class: gpu" "$train_out" || fail "the GPU fault was not classed gpu: $(grep 'exit class' "$train_out")"
grep -qE "^node node[0-9]: (drain|drng)[a-z]*: forge-health: gpu" "$LOG" || fail "the sick node was not drained by forge-health"
# Its record is <job>-<restart>[.<attempt>].json: a loaded machine may have run a step again in place first
# (a late kill of the preempted step, or a launch that failed), which is recovery working, not a failure.
grep -qE "^failure record [0-9]+-[1-9][0-9]*(\.[0-9]+)?\.json: class gpu after step [0-9]+, suspects: rank [0-9]+ on node[0-9]" "$LOG" ||
  fail "no gpu failure record naming the suspect rank and node; the job's steps: $(grep -E '^failure record|exit class:' "$LOG" | sed 's/^.*\.out://' | paste -sd';' -)"
# The cost report carries the run's MFU (from the summary.json forge-train wrote) for the training job and
# its ETTR; the preempted allocation is not all waste: it checkpointed at the signal.
train_job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$run/summary.json")
sacct -X -D -n -P -j "$train_job" -o State,ElapsedRaw,AllocTRES >"$WORK/train-sacct.txt" 2>&1
# The job's summary where sacct shows it (jobstats style): the batch script's Comment.
comment=$(sacct -X -n -P -j "$train_job" -o Comment 2>&1 | tail -n1)
python3 -c 'import json,sys; c=json.loads(sys.argv[1][len("forge:"):]); assert sys.argv[1].startswith("forge:") and c["class"] == "ok" and c["tokens"] > 0 and c["steps"] == 40, c' "$comment" 2>/dev/null ||
  fail "sacct -o Comment of job $train_job does not hold the run summary: '$comment'"
python3 - "$FORGE_DEMO_DIR/quota-report.json" "$run/summary.json" "$WORK/train-sacct.txt" <<'PY' ||
import json, re, sys
rows, summary = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
row = [r for r in rows if r["job"] == str(summary["job_id"])]
assert row and row[0]["mfu"] is not None and abs(row[0]["mfu"] - summary["mean_mfu"]) < 1e-9, (row, summary["mean_mfu"])
assert row[0]["ettr"] is not None and 0 < row[0]["ettr"] <= 1, row[0]
requeued = 0.0
for line in open(sys.argv[3]):
    state, elapsed, tres = line.strip().split("|")
    if state in ("REQUEUED", "PREEMPTED"):
        requeued += int(elapsed) * int(re.search(r"gres/gpu=(\d+)", tres).group(1)) / 3600
assert requeued > 0, "sacct shows no requeued allocation of the training job"
assert row[0]["wasted_gpu_hours"] < requeued, (row[0]["wasted_gpu_hours"], requeued)
PY
  fail "the cost report's MFU, ETTR or waste of the training job is wrong: $(cat "$WORK/train-sacct.txt")"

# The fine-tune: a chat dataset with loss masks, SFT from the promoted release on the replies only, gated
# on the held-out replies against that release (measured alike) and promoted.
sft=$FORGE_DEMO_DIR/runs/sft
grep -qE "^chat \(forge-chat-1\): [0-9]+ conversations" "$LOG" || fail "no chat dataset report"
grep -qE "^sft: 20 steps, loss .* on the replies: [0-9]+ scored tokens per step of 2048 positions" "$LOG" ||
  fail "the SFT run's line is missing: $(grep -m1 '^sft:' "$LOG")"
python3 - "$sft/gate/verdict.json" "$run/gate/verdict.json" "$sft/metrics/rank-0.jsonl" <<'PY' ||
import json, sys
v, parent = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert v["pass"] and v["promoted_to"], v
assert v["replies_only"] and v["document_mask"], "the fine-tune was not judged on its replies"
assert v["baseline"]["path"] == parent["promoted_to"], (v["baseline"], parent["promoted_to"])
assert v["domains"]["chat"]["loss"] < v["baseline_domains"]["chat"]["loss"], "the fine-tune answers no better"
rows = [json.loads(l) for l in open(sys.argv[3])]
assert all(0 < r["scored_tokens"] < 2048 for r in rows), [r["scored_tokens"] for r in rows]
PY
  fail "the fine-tune's gate verdict or metrics are wrong: $(cat "$sft/gate/summary.txt" 2>&1 | head -n 3)"

# DPO from the fine-tune as its own reference: ln 2 at step 1, the loss falls, the reference kept.
python3 - "$FORGE_DEMO_DIR/runs/dpo/metrics/rank-0.jsonl" <<'PY' ||
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 40 and abs(rows[0]["loss"] - math.log(2)) < 1e-4, rows[0]
assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["reward_margin"] > 0, rows[-1]
PY
  fail "the DPO run did not start at ln 2 and improve: $(grep -m1 '^dpo:' "$LOG")"
ls "$FORGE_DEMO_DIR"/pairs-dataset/references/*.logps.json >/dev/null 2>&1 ||
  fail "no reference log-probabilities kept beside the preference dataset"
# Lineage: the DPO model's checkpoint names the fine-tune it came from, and that one the pretrained release,
# each with the dataset version it was trained on (pretraining corpus, then the chat set).
python3 - "$FORGE_DEMO_DIR" <<'PY' || fail "the DPO checkpoint's lineage does not lead back to the pretraining run"
import glob, json, sys
work = sys.argv[1]
m = json.load(open(sorted(glob.glob(f"{work}/runs/dpo/checkpoints/milestone/step-*/manifest.json"))[-1]))
chain = m["extra"]["lineage"]
versions = [json.load(open(f"{work}/{d}/manifest.json"))["version"] for d in ("chat-dataset", "dataset")]
assert "/runs/sft/" in chain["parent"] and chain["parent_dataset_version"] == versions[0], chain
grand = chain["parent_lineage"]
assert "/runs/demo/" in grand["parent"] and grand["parent_dataset_version"] == versions[1], grand
PY
# The DPO model's gate: measured on the held-out pairs against the fine-tune (its reference, margin 0),
# accuracy and margin with their standard errors, passed and promoted.
python3 - "$FORGE_DEMO_DIR/runs/dpo/gate/verdict.json" <<'PY' ||
import json, sys
v = json.load(open(sys.argv[1]))
d, b = v["domains"]["pairs"], v["baseline_domains"]["pairs"]
assert v["pass"] and v["promoted_to"], v["checks"] if "checks" in v else v
assert b["reward_margin"] == 0 and b["accuracy"] == 0, ("the reference does not score 0 against itself", b)
assert d["accuracy"] > 0.5 and d["reward_margin"] > 2 * d["reward_margin_se"] > 0, d
PY
  fail "the DPO gate's verdict is wrong: $(cat "$FORGE_DEMO_DIR/runs/dpo/gate/summary.txt" 2>&1 | head -n 5)"
# The registry (the gates registered each release): the DPO model's lineage is the fine-tune and the
# pretrained model, with the pairs', the chat set's and the pretraining dataset's versions.
python3 - "$FORGE_DEMO_DIR" "$BUILD/ckpt/forge-ckpt" <<'PY' || fail "the registry's lineage of the DPO model is wrong"
import json, subprocess, sys
work, forge_ckpt = sys.argv[1], sys.argv[2]
release = json.load(open(f"{work}/runs/dpo/gate/verdict.json"))["promoted_to"]
out = json.loads(subprocess.run([forge_ckpt, "registry", "lineage", release, "--json"], check=True,
                                capture_output=True, text=True).stdout)
gens = out["generations"]
assert [g["objective"] for g in gens] == ["dpo", "sft", "lm"], gens
versions = [json.load(open(f"{work}/{d}/manifest.json"))["version"] for d in ("pairs-dataset", "chat-dataset", "dataset")]
assert [g["dataset_version"] for g in gens] == versions, (gens, versions)
assert all(g["ref"] for g in gens), ("a generation is not registered", gens)
PY

# Distillation of the release into a half-width student on two tensor-parallel ranks: the KL to the teacher
# falls, and the gate measures it on the held-out split with its standard error.
grep -qE "^distill: 20 steps, KL to the teacher" "$LOG" || fail "the distillation run's line is missing"
python3 - "$FORGE_DEMO_DIR/runs/distill" <<'PY' ||
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics/rank-0.jsonl")]
assert len(rows) == 20 and rows[-1]["kl_teacher"] < 0.8 * rows[0]["kl_teacher"], (rows[0], rows[-1])
v = json.load(open(f"{run}/gate/verdict.json"))
assert v["pass"], v
domains = v["domains"]
assert all(d["kl"] > 0 and d["kl_se"] > 0 for d in domains.values()), domains
# Over all held-out tokens, not per domain: the first step's KL is the mixture's, and one domain (code) can
# sit above the mixture's mean even after training.
held_out = sum(d["kl_sum"] for d in domains.values()) / sum(d["tokens"] for d in domains.values())
assert held_out < rows[0]["kl_teacher"], (held_out, rows[0], domains)
PY
  fail "the distillation run or its gate is wrong: $(cat "$FORGE_DEMO_DIR/runs/distill/gate/summary.txt" 2>&1 | head -n 5)"

# Mixture of Experts on dp2 with ep2 and ZeRO-3: the loss falls, every step's metrics carry both blocks'
# expert load (all tokens accounted, top-2 of 4 experts, dropless), the all-to-all and the weights'
# gathers; the report plots the load.
grep -qE "^moe: 20 steps, loss" "$LOG" || fail "the MoE run's line is missing"
grep -qE "parameters: .* M active per token \(4 experts, top 2, ep2\)" "$LOG" || fail "the MoE plan line is missing"
python3 - "$FORGE_DEMO_DIR/runs/moe" <<'PY' ||
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics/rank-0.jsonl")]
assert len(rows) == 20 and rows[-1]["loss"] < rows[0]["loss"], (rows[0], rows[-1])
for r in rows:
    assert [m["layer"] for m in r["moe"]] == [0, 1] and r["expert_comm_bytes"] > 0, r
    assert r["gather_bytes"] > 0 and r["state_mib"] > 0, r
    for m in r["moe"]:
        assert sum(m["tokens"]) == 2 * 4 * 128 * 2 and m["dropped_fraction"] == 0, m
assert "expert load, MoE block 1" in open(f"{run}/report.html").read()
PY
  fail "the MoE run is wrong"

# Long context on cp2: the loss falls and every step moved key/value chunks around the ring.
grep -qE "^long context: 10 steps of 2048 tokens on cp2" "$LOG" || fail "the long-context run's line is missing"
python3 - "$FORGE_DEMO_DIR/runs/long" <<'PY' ||
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics/rank-0.jsonl")]
assert len(rows) == 10 and rows[-1]["loss"] < rows[0]["loss"], (rows[0], rows[-1])
assert all(r["cp_comm_bytes"] > 0 and r["tokens"] == 2048 * r["step"] for r in rows), rows[0]
PY
  fail "the long-context run is wrong"
python3 -c "import glob,json,sys; m=json.load(open(sorted(glob.glob(sys.argv[1]))[-1])); sys.exit(0 if m['extra']['spec'].get('model.recompute') == 'full' else 'no full recompute')" \
  "$FORGE_DEMO_DIR/runs/long/checkpoints/milestone/*/manifest.json" || fail "the long-context run did not recompute"

# Task suites: the taught model passes against the release on all four suites, every metric with its
# interval and the gate on two ranks; the untrained release and the model taught wrong answers are blocked.
python3 - "$FORGE_DEMO_DIR" <<'PY' ||
import json, sys
work = sys.argv[1]
v = json.load(open(f"{work}/runs/tasks/gate/verdict.json"))
assert v["pass"] and v["promoted_to"], [c for c in v["checks"] if not c["pass"]]
assert sorted(v["suites"]) == ["arith", "code", "copy", "refusal"], sorted(v["suites"])
for name, s in v["suites"].items():
    for metric, m in s["metrics"].items():
        assert m["lo"] <= m["value"] <= m["hi"] and m["n"] > 0, (name, metric, m)
        assert m["value"] >= v["baseline_suites"][name]["metrics"][metric]["value"] or metric == "over_refusal_rate"
assert v["suites"]["arith"]["metrics"]["accuracy"]["value"] >= 0.5 and v["suites"]["code"]["metrics"]["pass@4"]["value"] > 0
for blocked in (f"{work}/gate-untrained", f"{work}/runs/tasks-wrong/gate"):
    b = json.load(open(f"{blocked}/verdict.json"))
    assert not b["pass"] and not b["promoted_to"], blocked
    assert any(c["kind"] == "max_regression" and not c["pass"] for c in b["checks"]), blocked
    assert b["baseline_suites_reused"], blocked  # the taught model's own results, same suite versions
PY
  fail "the task-suite gates are wrong: $(grep -A3 'evaluation: task suites' "$LOG" | head -n 5)"
grep -qE "tokens/s per rank" "$LOG" || fail "forge-gate generate did not report tokens/s"

# What a newcomer reads: each node once in the cluster summary (with its partitions), the blocked models
# named, the cost report's jobs costliest first with small jobs readable and the long tail folded.
for n in node1 node2 node3 node4; do
  c=$(sed -n '/^== nodes/,/^== partitions/p' "$LOG" | grep -c "^  $n ")
  [ "$c" = 1 ] || fail "the cluster summary lists $n $c times"
done
grep -qE "^  node3 +data,train\*? " "$LOG" ||
  fail "the cluster summary does not show node3's two partitions: $(grep -m1 '^  node3 ' "$LOG")"
grep -A1 "^the untrained release, gated against the taught model:" "$LOG" | grep -q "^  gate verdict: FAIL" ||
  fail "the untrained release's blocked verdict is not labelled"
grep -A1 "^the model taught wrong answers, gated against the taught model:" "$LOG" | grep -q "^  gate verdict: FAIL" ||
  fail "the wrongly taught model's blocked verdict is not labelled"
python3 - "$FORGE_DEMO_DIR/quota-report.json" "$FORGE_DEMO_DIR/quota-report.html" <<'PY' ||
import json, sys
rows = json.load(open(sys.argv[1]))
costs = [r["cost"] for r in rows]
assert costs == sorted(costs, reverse=True), ("not costliest first", [r["job"] for r in rows][:20])
html = open(sys.argv[2]).read()
assert len(rows) <= 16 or f"other ({len(rows) - 15})" in html, "the HTML report does not fold the jobs after the 15th"
PY
  fail "the cost report by job is not ordered, folded and readable"

# The two reports, kept for the browser test (browser_test.py; its screenshots land next to them), and the
# demo's output for whoever reads a failure.
pages=$SUITE_BUILD/test/artifacts/demo
rm -rf "$pages" && mkdir -p "$pages" &&
  cp "$run/report.html" "$FORGE_DEMO_DIR/quota-report.html" "$LOG" "$pages/" || fail "cannot keep the reports in $pages"

# The demo built its own tree: every program of the target, in the copy, none taken from the suite's build.
grep -q "^demo: using the build in" "$LOG" && fail "the demo used a given build tree instead of building its own"
(source "$COPY/scripts/lib/programs.sh" && forge_check_programs "$BUILD") 2>&1 | sed 's/^/FAIL: the demo build: /' | grep . && fails=$((fails + 1))
# The cluster ran the copy's plugin and its setgid forge-quota (up installs the build's copy), not the suite's.
grep -q "^required $BUILD/spank_plugin/forge_spank.so " "$STATE/forge-plugstack.conf" ||
  fail "the cluster's SPANK plugin is not the copy's: $(grep -m1 '^required' "$STATE/forge-plugstack.conf")"
cmp -s "$BUILD/quota/forge-quota" "$STATE/bin/forge-quota" || fail "the installed forge-quota is not the copy's build"
# Nothing left queued or running: the next test needs the nodes.
for id in $(job_ids); do
  state=$(squeue -h -j "$id" -o %T 2>/dev/null)
  [ -z "$state" ] || fail "job $id is still in the queue ($state)"
done
restore_cluster || fail "the cluster is not back on $SUITE_BUILD: $(tail -n1 "$WORK/restore.log")"

if [ $fails -eq 0 ]; then
  echo "PASS: demo.sh --fast in a clean copy, on its own build: $(grep -E '^loss curve' "$LOG"); total $(grep -oE '^\[demo [0-9:]+\]' "$LOG" | sed -n '1p;$p' | tr -d '[]demo ' | paste -sd- -)"
  exit 0
fi
exit 1
