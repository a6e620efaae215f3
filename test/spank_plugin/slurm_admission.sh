#!/usr/bin/env bash
# Admission on the dev cluster with real sbatch/srun: an allowed job runs with FORGE_* set; each kind of
# rejection (plugin in sbatch, job_submit.lua in slurmctld, the plugin again in slurmstepd) gives its
# message and a non-zero exit; hostile option values are refused cleanly; no node is ever drained; a bad
# layout gets the same message from sbatch and from forge-train, whose parser is shared.
# Usage: slurm_admission.sh FORGE_QUOTA_BINARY
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm_lib.sh
source "$HERE/slurm_lib.sh"

quota_sync
ok_opts=(--train-team=team-a --train-tier=explore --train-layout=tp2,pp1,dp4)
node8=(-N1 --gpus-per-node=8)

# expect_reject WHAT PATTERN SBATCH-ARGS...: sbatch must fail with PATTERN on stderr and make no job.
expect_reject() {
  local what=$1 pattern=$2 out rc
  shift 2
  out=$(sbatch --parsable -o /dev/null "$@" --wrap true 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    cleanup_jobs+=("${out##*$'\n'}")
    fail "$what: sbatch accepted the job ($out)"
  fi
  [ $rc -lt 128 ] || fail "$what: sbatch died with status $rc: $out"
  [[ $out == *"$pattern"* ]] || fail "$what: expected '$pattern' in: $out"
  echo "ok: $what -> $(grep -m1 -o 'forge: .*' <<<"$out" | cut -c1-150)"
}

# --- an allowed job runs with the plugin's environment ---------------------------------------------
job=$(sbatch --parsable "${ok_opts[@]}" "${node8[@]}" -o "$WORK/ok.out" --wrap 'env | grep ^FORGE_ | sort') ||
  fail "the allowed submission was rejected: $job"
cleanup_jobs+=("$job")
state=$(wait_done "$job" 90)
[ "$state" = COMPLETED ] || fail "allowed job $job ended $state: $(cat "$WORK/ok.out" 2>/dev/null)"
for want in FORGE_TEAM=team-a FORGE_TIER=explore FORGE_LAYOUT=tp2,pp1,dp4 FORGE_PREEMPTIBLE=1; do
  grep -qx "$want" "$WORK/ok.out" || fail "allowed job $job lacks $want; it saw: $(tr '\n' ' ' <"$WORK/ok.out")"
done
qos=$(scontrol show job "$job" | grep -o ' QOS=[^ ]*' | cut -d= -f2)
[ "$qos" = explore ] || fail "allowed job $job ran under QOS '$qos', expected explore (set by job_submit.lua)"
echo "ok: allowed job $job ran with FORGE_* under QOS $qos"

# srun creating its own allocation goes through the same checks
out=$(srun "${ok_opts[@]}" "${node8[@]}" -t 5 printenv FORGE_LAYOUT 2>&1) || fail "srun of an allowed job failed: $out"
[ "$(tail -n1 <<<"$out")" = tp2,pp1,dp4 ] || fail "srun job saw FORGE_LAYOUT '$out'"
out=$(srun --train-team=team-z --train-tier=explore --train-layout=tp1,pp1,dp1 -N1 true 2>&1) &&
  fail "srun with an unknown team ran"
[[ $out == *"unknown team 'team-z'"* ]] || fail "srun rejection said: $out"
echo "ok: srun allowed and rejected"

# --- rejections in sbatch (the plugin) ----------------------------------------------------------------
expect_reject "unknown team" "unknown team 'team-z'" --train-team=team-z --train-tier=explore --train-layout=tp1,pp1,dp1
expect_reject "not a member" "is not a member of team 'team-b'" --train-team=team-b --train-tier=explore --train-layout=tp1,pp1,dp1
expect_reject "tier not allowed" "team 'team-a' may not use tier 'finetune'" --train-team=team-a --train-tier=finetune --train-layout=tp1,pp1,dp1
expect_reject "bad layout (TP across nodes)" "TP=16 does not fit inside one node" --train-team=team-a --train-tier=pretrain --train-layout=tp16,pp1,dp1
expect_reject "bad layout (syntax)" "expected tpX,ppY,dpZ" --train-team=team-a --train-tier=pretrain --train-layout=tp2,pp2
expect_reject "missing option" "missing --train-layout" --train-team=team-a --train-tier=pretrain
printf '[model]\nheads = 6\n[parallel]\ntp = 4\ndp = 2\n' >"$WORK/tp4.ini"
expect_reject "layout does not suit the spec's model" \
  "--train-layout=tp4,pp1,dp2 does not suit the job spec: parallel.tp: must divide model.heads = 6" \
  --train-team=team-a --train-tier=explore --train-layout=tp4,pp1,dp2 --train-spec="$WORK/tp4.ini" "${node8[@]}"

# over quota: a snapshot in which team-a has spent its budget
/usr/bin/python3 - "$SNAPSHOT" "$WORK/spent.json" <<'PY' || fail "cannot write a spent snapshot"
import json, sys
doc = json.load(open(sys.argv[1]))
doc["teams"]["team-a"]["used_gpu_hours"] = 1e9
json.dump(doc, open(sys.argv[2], "w"))
PY
chmod 0644 "$WORK/spent.json"
mv -f "$WORK/spent.json" "$SNAPSHOT"
expect_reject "over quota" "over quota: team 'team-a'" "${ok_opts[@]}" "${node8[@]}"
quota_sync
sbatch --test-only "${ok_opts[@]}" "${node8[@]}" --wrap true >/dev/null 2>&1 || fail "a fresh sync did not lift the quota rejection"

# --- rejections in slurmctld (job_submit.lua): the real request against the plugin's choices ---------
expect_reject "QOS not the tier's" "--qos=pretrain does not match tier 'explore'" "${ok_opts[@]}" "${node8[@]}" --qos=pretrain
expect_reject "nodes != layout" "needs 1 node(s) but the job asks for 2" "${ok_opts[@]}" -N2 --gpus-per-node=8
expect_reject "GPUs != layout" "needs tp*cp*dp*pp = 8 GPUs but the job asks for 4" "${ok_opts[@]}" -N1 --gpus-per-node=4
# Node ranges (elastic jobs, parallel.elastic): the maximum is the layout's size, the minimum holds a replica.
el_opts=(--train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp16 --gpus-per-node=8 --ntasks-per-node=8)
expect_reject "range beyond the layout" "the range ends at 3; use --nodes=1-2" "${el_opts[@]}" -N 1-3
expect_reject "range minimum below a replica" "at 1 node(s) the job has 8 GPUs, fewer than one model replica" \
  --train-team=team-a --train-tier=explore --train-layout=tp1,pp16,dp1 --gpus-per-node=8 -N 1-2
job=$(sbatch --parsable --hold "${el_opts[@]}" -N 1-2 -o /dev/null --wrap true) || fail "an elastic range was rejected: $job"
cleanup_jobs+=("$job")
info=$(scontrol show job -o "$job")
[[ $info == *"NumNodes=1-2"* && $info == *"AdminComment=forge-elastic:nodes=1-2"* ]] ||
  fail "the elastic job lost its range or its record: $(grep -oE '(NumNodes|AdminComment)=[^ ]*' <<<"$info" | tr '\n' ' ')"
scancel "$job"
echo "ok: node ranges: 1-2 admitted with its range kept for requeues, 1-3 and a range below a replica rejected"
expect_reject "account != team" "--account=team-b does not match team 'team-a'" "${ok_opts[@]}" "${node8[@]}" -A team-b
expect_reject "tier QOS without the plugin" "QOS 'pretrain' is for training jobs" -N1 --qos=pretrain
expect_reject "time over the tier's max wall" "exceeds tier 'explore''s max wall" "${ok_opts[@]}" "${node8[@]}" -t 5:00:00

# --- rejection in slurmstepd: the allocation changed after submission ----------------------------------
job=$(sbatch --parsable -H "${ok_opts[@]}" "${node8[@]}" -o "$WORK/tampered.out" --wrap 'echo ran') ||
  fail "cannot submit the held job: $job"
cleanup_jobs+=("$job")
scontrol update JobId="$job" NumNodes=2-2 || fail "scontrol update NumNodes=2 of $job failed"
scontrol release "$job" || fail "scontrol release $job failed"
state=$(wait_done "$job" 90)
[ "$state" = FAILED ] || fail "job $job with a changed allocation ended $state (expected FAILED by the plugin)"
grep -q "rejected at start: the job was given 16 GPUs" "$WORK/tampered.out" ||
  fail "job $job output lacks the plugin's message: $(cat "$WORK/tampered.out")"
grep -q '^ran$' "$WORK/tampered.out" && fail "job $job ran its script despite the rejection"
check_no_drain "the slurmstepd rejection"
echo "ok: slurmstepd rejected job $job ($state) and left the nodes up"

# --- hostile option values ---------------------------------------------------------------------------
long=$(head -c 4096 /dev/zero | tr '\0' A)
hostile=("$long" '%n%s%n%s%x' "\$(touch $WORK/pwned);\`touch $WORK/pwned\`|&;<>*" $'\xff\xfe\xc3\x28team')
for v in "${hostile[@]}"; do
  expect_reject "hostile team" "forge: " --train-team="$v" --train-tier=explore --train-layout=tp1,pp1,dp1 >/dev/null
  expect_reject "hostile tier" "forge: " --train-team=team-a --train-tier="$v" --train-layout=tp1,pp1,dp1 >/dev/null
  expect_reject "hostile layout" "forge: " --train-team=team-a --train-tier=explore --train-layout="$v" >/dev/null
done
[ ! -e "$WORK/pwned" ] || fail "a shell metacharacter in an option value ran a command"
echo "ok: ${#hostile[@]} hostile values x 3 options rejected"

# --- plugstack arguments, through a private client slurm.conf (sbatch reads PlugStackConfig itself) -------
so=$(awk '{print $2}' <<<"$forge_line")
sed "s|^PlugStackConfig=.*|PlugStackConfig=$WORK/private-plugstack.conf|" "$SLURM_CONF" >"$WORK/private-slurm.conf"
echo "required $so policy=$POLICY snapshot=$WORK/missing.json fail-closed" >"$WORK/private-plugstack.conf"
SLURM_CONF=$WORK/private-slurm.conf expect_reject "fail-closed without a snapshot" "(fail-closed)" \
  "${ok_opts[@]}" "${node8[@]}" --test-only
echo "required $so policy=$POLICY snapshot=$WORK/missing.json fail-open" >"$WORK/private-plugstack.conf"
out=$(SLURM_CONF=$WORK/private-slurm.conf sbatch --test-only "${ok_opts[@]}" "${node8[@]}" --wrap true 2>&1) ||
  fail "fail-open without a snapshot rejected the job: $out"
[[ $out == *"quota not checked (fail-open)"* ]] || fail "fail-open gave no warning: $out"
echo "required $so policy=$POLICY mode=warn" >"$WORK/private-plugstack.conf"
out=$(SLURM_CONF=$WORK/private-slurm.conf sbatch --test-only --train-team=team-z --train-tier=explore \
  --train-layout=tp2,pp1,dp4 "${node8[@]}" --wrap true 2>&1)
[[ $out == *"unknown team 'team-z'"*"mode=warn"* ]] || fail "mode=warn did not report the rejection: $out"
echo "ok: fail-closed, fail-open and mode=warn"

check_no_drain "all rejections"
echo "ok: no node drained"

# --- one parser, one message: a layout with an unknown dimension, a zero, a duplicate or an overflowing
# product is rejected by sbatch (the plugin) and by forge-train (exit 64, FORGE_LAYOUT as srun would set it)
# with forge::parse_layout's message, here taken from `forge-quota layout` -------------------------------
forge_train=${FORGE_BUILD_DIR:?}/launcher/forge-train
[ -x "$forge_train" ] || fail "no $forge_train: build the forge-train target"
bad_layouts=(tq2,pp1,dp1 tp0,pp1,dp1 tp2,tp2,pp1,dp1 tp1024,pp1024,dp1024)
for bad in "${bad_layouts[@]}"; do
  why=$("$FORGE_QUOTA" layout "$bad" 2>&1) && fail "forge-quota layout accepted $bad"
  why=${why#forge-quota: error: }
  [[ $why == "'$bad' is not a layout: "* ]] || fail "forge-quota layout $bad said: $why"
  expect_reject "layout $bad in sbatch" "forge: --train-layout: $why" --train-team=team-a --train-tier=explore \
    --train-layout="$bad" "${node8[@]}" >/dev/null
  out=$(FORGE_LAYOUT=$bad timeout 120 "$forge_train" "${FORGE_SOURCE_DIR:?}/configs/tiny.ini" \
    --run.dir="$WORK/train-$bad" 2>&1)
  rc=$?
  [ $rc -eq 64 ] || fail "forge-train with FORGE_LAYOUT=$bad exited $rc, expected 64: $(tail -n1 <<<"$out")"
  [[ $out == *"FORGE_LAYOUT: $why"* ]] ||
    fail "forge-train with FORGE_LAYOUT=$bad lacks the parser's message '$why': $(tail -n1 <<<"$out")"
done
echo "ok: ${#bad_layouts[@]} bad layouts rejected by sbatch and by forge-train (64) with the same message"
