#!/usr/bin/env bash
# Governance on the dev cluster, as real Unix users (docs/ADMISSION.md, "Approval", "Team isolation",
# "Pools"): alice (team-a), bob (team-b), carol (approver of both), dave (admin), created by
# scripts/devcluster/up. Every check runs as the user it is about (runuser), never as root:
#   pools      alice prepares a dataset with scripts/sbatch/prepare.sbatch on the data partition and trains
#              on it in team-a's directory; a training tier on the eval partition is refused;
#   isolation  bob cannot read alice's checkpoints, submit as team-a (not even past the plugin with a
#              forged environment; with the policy unreadable to slurmctld no forged job passes), see her
#              jobs in squeue or sacct, her job's /tmp or /dev/shm, or approve;
#              a run.dir outside the team's directory fails the job at start without draining the node;
#   approval   a large job is refused with the request command in the message; approved by carol it runs
#              once; a second use, an expired id, another team's id, a forged policy or environment and
#              garbage ids are refused, the controller stays up and no node is drained; the ledger shows it;
#   after submission  alice's scontrol update of her approved job (GPUs, nodes, pool, QOS, account) is
#              refused, a shorter time is judged against the approval it holds, dave's change is logged;
#              the hooks' markers written into a Comment hold nothing;
#   sandbox    alice's gate step (eval pool) runs a code suite whose tests try every way out of the sandbox
#              (homes, run directory, dataset, world-readable files, writes, network, fork bomb, memory, a
#              lingering child): none works, nothing is left on the host, no node drained;
#   hostile paths  bob's run.dir into team-a through '..' or a link is refused by sbatch; his jobs starting
#              from alice's checkpoint or training on her dataset fail naming the path, no node drained.
# Needs scripts/devcluster/up; FORGE_BUILD_DIR is the build under test.
set -uo pipefail
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=test/support/devcluster.sh
source "$SRC/test/support/devcluster.sh" governance
for u in alice bob carol dave; do id -u "$u" >/dev/null 2>&1 || fail "no user $u: scripts/devcluster/up creates them"; done
FQ=$STATE/bin/forge-quota
[ -x "$FQ" ] && [ -g "$FQ" ] || fail "$FQ is not the setgid forge-quota scripts/devcluster/up installs"
TEAM_A=$STATE/teams/team-a
# The ledger (and its approval store) must exist, root-owned, before users write requests into it.
"$BUILD/quota/forge-quota" sync >/dev/null || fail "forge-quota sync failed"
"$BUILD/quota/forge-quota" check-policy "$FORGE_QUOTA_POLICY" >/dev/null || fail "the dev cluster's policy does not check"

trap 'scancel "${jobs[@]}" 2>/dev/null; rm -rf "$work"; rm -rf "$TEAM_A/runs/gov-$$" "$TEAM_A/datasets/gov-$$"' EXIT
# The users cannot be assumed to reach this checkout (it may sit under /root): what their jobs run is copied
# to a world-readable place, laid out as FORGE_HOME and FORGE_BUILD_DIR expect.
home=$work/forge
mkdir -p "$home/scripts" "$home/build/launcher" "$home/build/dataio" "$home/configs"
cp -r "$SRC/scripts/sbatch" "$home/scripts/"
cp "$BUILD/launcher/forge-train" "$home/build/launcher/"
cp "$BUILD/dataio/forge-data" "$home/build/dataio/"
chmod -R a+rX "$work"
mkdir "$work/alice" && chown alice "$work/alice"  # where alice's jobs write their output

# shellcheck source=test/support/slurm_users.sh
source "$SRC/test/support/slurm_users.sh"
expect_refused() {  # expect_refused WHAT PATTERN CMD...: CMD fails and says PATTERN
  local what=$1 pattern=$2 out
  shift 2
  out=$("$@" 2>&1) && fail "$what: accepted: $out"
  grep -qF -- "$pattern" <<<"$out" || fail "$what: refused without '$pattern': $out"
  echo "  refused ($what): $({ grep -m1 -F -- "$pattern" <<<"$out" || tail -n1 <<<"$out"; } | cut -c1-160)"
}
no_drain() {
  scontrol ping | grep -q UP || fail "slurmctld is not up after $1"
  local bad
  bad=$(sinfo -h -N -o '%N %t' | awk '$2 ~ /drain|drng|down/')
  [ -z "$bad" ] || fail "nodes drained or down after $1: $bad"
}
final_state() {  # final_state JOB: waits for JOB to leave the queue, prints its sacct state
  for _ in $(seq 1 180); do [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && break; sleep 1; done
  sacct -n -X -P -j "$1" -o State | head -n1
}
partition_of() {  # partition_of JOB: as accounting recorded it (slurmdbd may take a moment after the end)
  local p=""
  for _ in $(seq 1 20); do
    p=$(sacct -n -X -P -j "$1" -o Partition | head -n1)
    [ -n "$p" ] && break
    sleep 0.5
  done
  echo "$p"
}

echo "== pools: data preparation on the data partition, training in team-a's directory"
"$SRC/scripts/make-demo-corpus.sh" "$work/corpus" 1 >/dev/null || fail "no corpus"
chmod -R a+rX "$work/corpus"
dataset=$TEAM_A/datasets/gov-$$
prep=$(as alice sbatch --parsable -A team-a -o "$TEAM_A/prep-$$.out" -D "$TEAM_A" "$home/scripts/sbatch/prepare.sbatch" \
  --input "$work/corpus/code=code" --input "$work/corpus/legal=legal" --vocab 512 --valid-fraction 0.1 \
  --out "$dataset") || fail "alice could not submit prepare.sbatch"
jobs+=("$prep")
[ "$(final_state "$prep")" = COMPLETED ] || fail "prepare job $prep: $(cat "$TEAM_A/prep-$$.out")"
[ "$(partition_of "$prep")" = data ] || fail "prepare job $prep did not run on the data partition"
rm -f "$TEAM_A/prep-$$.out"
[ "$(stat -c %G "$dataset")" = forge-a ] || fail "dataset not owned by team-a's group: $(stat -c '%U:%G %a' "$dataset")"
run=$TEAM_A/runs/gov-$$
sed -e "s|^dir = .*|dir = $run|" -e "s|^dataset = .*|dataset = $dataset|" -e "s/^steps = .*/steps = 4/" \
  "$SRC/configs/tiny.ini" >"$work/alice.ini"
printf '\n[ckpt]\nmilestone_every = 2\n' >>"$work/alice.ini"
train=$(as alice sbatch --parsable --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 \
  --train-spec="$work/alice.ini" -n1 --gres=gpu:1 -o "$work/alice/train-%j.out" -D "$work/alice" \
  "$home/scripts/sbatch/pretrain.sbatch" "$work/alice.ini" --run.threads=1) || fail "alice's training job not submitted"
jobs+=("$train")
[ "$(final_state "$train")" = COMPLETED ] || fail "alice's training job $train: $(cat "$work/alice/train-$train.out")"
[ "$(partition_of "$train")" = train ] || fail "training job $train not on the train partition"
ckpt=$(ls -d "$run"/checkpoints/milestone/step-* | head -n1)
[ -n "$ckpt" ] || fail "no milestone checkpoint in $run"
perm=$(stat -c '%G %A' "$ckpt")
[[ $perm == "forge-a drwxrws---" ]] || fail "checkpoint $ckpt: group/mode $perm, want forge-a drwxrws---"
echo "  prepared on 'data' (job $prep), trained on 'train' (job $train): $ckpt is $perm"
expect_refused "a training tier on the eval partition" "partition" \
  as alice sbatch --test-only --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 -p eval -n1 \
  --gres=gpu:1 --wrap true

echo "== isolation: bob against team-a"
expect_refused "bob lists alice's checkpoints" "Permission denied" as bob ls "$run/checkpoints"
expect_refused "bob reads a checkpoint file" "Permission denied" as bob cat "$(find "$run" -type f | head -n1)"
# The registry: only through the installed (setgid) forge-ckpt, only its system database, and only for a run
# the caller's team can write (docs/CHECKPOINTS.md, "Registry").
FC=$STATE/bin/forge-ckpt
[ -x "$FC" ] && [ -g "$FC" ] || fail "$FC is not the setgid forge-ckpt scripts/devcluster/up installs"
# The kernel stops bob at alice's directory before forge-ckpt's own check (that only a run's team registers
# its releases) is reached; ckpt.registry_privilege tests that check with a directory he can read.
expect_refused "bob registers alice's checkpoint" "forge-ckpt: error:" as bob "$FC" registry add "$ckpt"
expect_refused "bob points forge-ckpt at his own registry" "system registry" \
  as bob env FORGE_REGISTRY="$work/forged-registry.db" "$FC" registry add "$ckpt"
expect_refused "bob submits as team-a" "not a member" \
  as bob sbatch --test-only --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 -n1 --gres=gpu:1 --wrap true
# Past the plugin: a user's own SPANK plugin, loaded through a private slurm.conf, sends whatever choices
# FORGED_* say in place of forge_spank.so's checked ones.
cat >"$work/forger.c" <<'C'
#include <slurm/spank.h>
#include <stdio.h>
#include <stdlib.h>
SPANK_PLUGIN(forger, 1);
int slurm_spank_init_post_opt(spank_t sp, int ac, char** av) {
  static const char* names[] = {"TEAM", "TIER", "LAYOUT", "APPROVAL"};
  for (int i = 0; i < 4; ++i) {
    char in[32], out[32];
    snprintf(in, sizeof in, "FORGED_%s", names[i]);
    snprintf(out, sizeof out, "FORGE_%s", names[i]);
    if (getenv(in)) spank_job_control_setenv(sp, out, getenv(in), 1);
  }
  return 0;
}
C
gcc -shared -fPIC -o "$work/forger.so" "$work/forger.c" || fail "cannot build the forging plugin"
echo "required $work/forger.so" >"$work/forger-plugstack.conf"
sed "s|^PlugStackConfig=.*|PlugStackConfig=$work/forger-plugstack.conf|" "$SLURM_CONF" >"$work/forger.conf"
chmod 644 "$work"/forger*
forged() { local user=$1; shift; as "$user" env SLURM_CONF="$work/forger.conf" "$@"; }
expect_refused "bob forges the plugin's choices" "not a member" \
  forged bob FORGED_TEAM=team-a FORGED_TIER=explore FORGED_LAYOUT=tp1,pp1,dp1 sbatch --test-only -n1 --gres=gpu:1 --wrap true
# The same forgery while slurmctld cannot read the policy: refused, naming the file (fail closed), not judged
# on what the plugin sent: by the checker it runs while job_submit.lua still holds the policy it read last
# (at most 30 s), then by job_submit.lua itself. The check asks until each shows, and after the policy is
# readable again, until jobs pass again.
policy_file=$(readlink -f "$(sed -n 's/.* policy=\([^ ]*\).*/\1/p' "$STATE/etc/plugstack.conf" | head -n1)")
policy_mode=$(stat -c %a "$policy_file")
[ "$(stat -c %u "$policy_file")" = 0 ] || fail "the policy $policy_file is not root's"
trap 'chmod "$policy_mode" "$policy_file"; scancel "${jobs[@]}" 2>/dev/null; rm -rf "$work"; rm -rf "$TEAM_A/runs/gov-$$" "$TEAM_A/datasets/gov-$$"' EXIT
forge_alice_choices() {
  forged alice FORGED_TEAM=team-a FORGED_TIER=explore FORGED_LAYOUT=tp1,pp1,dp1 sbatch --test-only -n1 --gres=gpu:1 --wrap true 2>&1
}
chmod 600 "$policy_file"
for i in $(seq 1 40); do
  if out=$(forge_alice_choices); then fail "a forged job passed while slurmctld cannot read the policy: $out"; fi
  grep -q "slurmctld cannot read the admission policy $policy_file" <<<"$out" && break
  grep -q "the admission checker failed: cannot read the system policy" <<<"$out" ||
    fail "a forged job while slurmctld cannot read the policy, refused without naming it: $out"
  [ "$i" -lt 40 ] || fail "job_submit.lua did not notice the unreadable policy within 40 s"
  sleep 1
done
echo "refused as expected: forged choices while the controller cannot read the policy (each refusal names it)"
chmod "$policy_mode" "$policy_file"
for _ in $(seq 1 40); do forge_alice_choices >/dev/null && break; sleep 1; done
forge_alice_choices >/dev/null || fail "the controller does not accept jobs again once the policy is readable"
no_drain "an unreadable policy"
held=$(as alice sbatch --parsable -H -A team-a -t 1 -o /dev/null --wrap true) || fail "alice's held job not submitted"
jobs+=("$held")
[ -n "$(as alice squeue -h -j "$held" -o %i)" ] || fail "alice cannot see her own job $held"
[ -z "$(as bob squeue -h -o '%i %u' | grep -w alice)" ] || fail "bob sees alice's jobs in squeue"
[ -z "$(as bob sacct -a -X -n -P -S now-1hour -o User | grep -x alice)" ] || fail "bob sees alice's jobs in sacct"
[ -n "$(as dave squeue -h -o '%u' | grep -x alice)" ] || fail "dave (admin) does not see alice's jobs"
scancel "$held"
echo "  bob sees none of alice's jobs in squeue or sacct; dave (admin) does"
# Private /tmp and /dev/shm per job (forge_spank.so job_tmp=): files alice's job keeps there are seen by its
# own steps, not by bob's job on the same node, not on the host, and are gone when her job ends.
mkdir "$work/bob" && chown bob "$work/bob"
if ! grep -q "job_tmp=" "$(scontrol show config | awk '$1 == "PlugStackConfig" {print $3}')"; then
  echo "  SKIP /tmp and /dev/shm per job: the plugstack has no job_tmp= (write-plugstack.sh leaves it out for a build under /tmp)"
else
  holder=$(as alice sbatch --parsable -A team-a -p train -w node1 -t 5 -o /dev/null -D "$work/alice" \
    --wrap 'echo alice-secret >/tmp/secret && echo alice-secret >/dev/shm/secret && touch tmp-ready && sleep 300') ||
    fail "alice's job holding /tmp files not submitted"
  jobs+=("$holder")
  for _ in $(seq 1 120); do [ -f "$work/alice/tmp-ready" ] && break; sleep 0.5; done
  [ -f "$work/alice/tmp-ready" ] || fail "alice's job $holder did not start: $(squeue -h -j "$holder" -o '%T %r')"
  [ "$(as alice srun --jobid="$holder" --overlap -n1 cat /tmp/secret /dev/shm/secret 2>&1)" = $'alice-secret\nalice-secret' ] ||
    fail "a step of alice's job $holder does not see the job's /tmp and /dev/shm"
  peek=$(as bob sbatch --parsable -A team-b -p train -w node1 -t 5 -o "$work/bob/peek.out" -D "$work/bob" \
    --wrap 'ls -A /tmp /dev/shm; cat /tmp/secret /dev/shm/secret; true') || fail "bob's job not submitted"
  jobs+=("$peek")
  [ "$(final_state "$peek")" = COMPLETED ] || fail "bob's job $peek: $(cat "$work/bob/peek.out")"
  ! grep -q alice-secret "$work/bob/peek.out" && [ "$(grep -c 'No such file' "$work/bob/peek.out")" -eq 2 ] ||
    fail "bob's job on node1 saw alice's /tmp or /dev/shm: $(cat "$work/bob/peek.out")"
  [ ! -e /tmp/secret ] && [ ! -e /dev/shm/secret ] || fail "alice's job wrote the host's /tmp or /dev/shm"
  # On node1 (in its own tmpfs, which only the node's processes see): root's, closed to everyone else.
  on_node1() { nsenter -t "$(cat "$STATE/run/slurmd-node1.pid")" -m "$@"; }
  jobtmp=$STATE/tmpfs/jobs/$holder
  [ "$(on_node1 stat -c '%U %a' "$jobtmp" 2>&1)" = "root 700" ] ||
    fail "$jobtmp on node1: $(on_node1 stat -c '%U %a' "$jobtmp" 2>&1), want root 700"
  scancel "$holder"
  for _ in $(seq 1 60); do on_node1 test -e "$jobtmp" || break; sleep 0.5; done
  ! on_node1 test -e "$jobtmp" || fail "alice's job $holder ended but its /tmp stays in $jobtmp on node1"
  echo "  /tmp and /dev/shm: alice's job $holder keeps its own (its steps see them), bob's job $peek on node1 does not, gone at the end"
fi
# run.dir outside the team's directory: sbatch refuses it at once; a spec changed after submission (held,
# edited, released) is caught in slurmstepd, where the job fails at start and the node stays up.
sed -e "s|^dir = .*|dir = /var/tmp/gov-escape-$$|" "$work/alice.ini" >"$work/outside.ini"
cp "$work/alice.ini" "$work/escape.ini"
chmod 644 "$work"/*.ini
expect_refused "a run.dir outside team-a's directory" "is outside team team-a's directory" \
  as alice sbatch --test-only --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 \
  --train-spec="$work/outside.ini" -n1 --gres=gpu:1 --wrap true
bad=$(as alice sbatch --parsable -H --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 \
  --train-spec="$work/escape.ini" -n1 --gres=gpu:1 -o /dev/null -D "$work" --wrap true) || fail "escape job not submitted"
jobs+=("$bad")
cp "$work/outside.ini" "$work/escape.ini"
scontrol release "$bad" || fail "cannot release job $bad"
[ "$(final_state "$bad")" = FAILED ] || fail "job $bad with run.dir outside team-a's directory did not fail"
[ ! -e "/var/tmp/gov-escape-$$" ] || fail "the escaping job wrote /var/tmp/gov-escape-$$"
no_drain "a run.dir outside the team's directory"
echo "  run.dir outside team-a's directory: refused by sbatch; edited after submission, job $bad FAILED at start, no node drained"

echo "== approval"
sed -e 's/^dp = .*/dp = 8/' "$work/alice.ini" >"$work/big.ini"
chmod 644 "$work/big.ini"
big=(--train-team=team-a --train-tier=pretrain --train-layout=tp1,pp1,dp8 --train-spec="$work/big.ini" -n8 --gres=gpu:8
  -t 48:00:00 -o /dev/null -D "$work" --wrap true)
forged_big=(FORGED_TEAM=team-a FORGED_TIER=pretrain FORGED_LAYOUT=tp1,pp1,dp8 sbatch --test-only -n8 --gres=gpu:8
  -t 48:00:00 --wrap true)
# 8 GPUs x 48 h is over the policy's GPU-hour threshold: judged by the controller (sbatch cannot see --time).
expect_refused "unapproved large job" "forge-quota request" as alice sbatch --test-only "${big[@]}"
# 24 GPUs is over the GPU threshold: sbatch's plugin already says so.
expect_refused "unapproved 24-GPU job (plugin)" "forge-quota request" \
  as alice sbatch --test-only --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp24 -N3 --wrap true
request() { as "$1" "$FQ" request --tier "$2" --gpus 8 --time 48:00:00 --reason "$3" 2>/dev/null; }
id1=$(request alice pretrain "governance test: one 8-GPU pretraining job") || fail "alice's request failed"
[[ $id1 =~ ^apr-[0-9a-f]{12}$ ]] || fail "request printed '$id1', not an approval id"
expect_refused "alice approves herself" "may not decide" as alice "$FQ" approve "$id1"
expect_refused "bob approves" "may not decide" as bob "$FQ" approve "$id1"
# A forged policy naming bob approver: the setgid forge-quota reads only the system policy.
sed 's/^approvers = .*/approvers = bob/' "$FORGE_QUOTA_POLICY" >"$work/forged.ini"
chmod 644 "$work/forged.ini"
expect_refused "bob with a forged policy" "system policy" as bob env FORGE_QUOTA_POLICY="$work/forged.ini" "$FQ" approve "$id1"
expect_refused "bob with --ledger" "system ledger" as bob "$FQ" approve "$id1" --ledger "$work/ledger.db"
as carol "$FQ" approve "$id1" >/dev/null || fail "carol could not approve $id1"
job1=$(as alice sbatch --parsable --train-approval="$id1" "${big[@]}") || fail "approved job refused"
jobs+=("$job1")
[ "$(final_state "$job1")" = COMPLETED ] || fail "approved job $job1 did not complete"
grep -q "forge-approval=$id1" <<<"$(scontrol show job "$job1" 2>/dev/null; sacct -n -X -P -j "$job1" -o AdminComment)" ||
  fail "job $job1 does not carry forge-approval=$id1 in its AdminComment"
echo "  $id1 approved by carol, job $job1 ran"
expect_refused "second use" "used up" as alice sbatch --test-only --train-approval="$id1" "${big[@]}"
id2=$(request alice pretrain "governance test: expires") || fail "second request failed"
as carol "$FQ" approve "$id2" --expires 0:00:01 >/dev/null || fail "carol could not approve $id2"
sleep 2
expect_refused "expired id" "expired" as alice sbatch --test-only --train-approval="$id2" "${big[@]}"
id3=$(as bob "$FQ" request --tier finetune --gpus 8 --time 24:00:00 --reason "team-b's own" 2>/dev/null) || fail "bob's request failed"
as carol "$FQ" approve "$id3" >/dev/null || fail "carol could not approve $id3"
expect_refused "another team's id" "team-b" as alice sbatch --test-only --train-approval="$id3" "${big[@]}"
expect_refused "an id that was never issued, forged past the plugin" "apr-000000000000" \
  forged alice FORGED_APPROVAL=apr-000000000000 "${forged_big[@]}"
long=$(head -c 4096 /dev/zero | tr '\0' 'x')
for junk in garbage "$long" '%n%s%s%x%p' "apr-\$(touch /tmp/pwned)" "apr-123;reboot"; do
  expect_refused "approval id '${junk:0:24}'" "approval" as alice sbatch --test-only --train-approval="$junk" "${big[@]}"
  expect_refused "forged approval id '${junk:0:24}'" "approval" forged alice FORGED_APPROVAL="$junk" "${forged_big[@]}"
done
[ ! -e /tmp/pwned ] || fail "an approval id ran a command"
no_drain "garbage approval ids"

echo "== after submission: alice changes her admitted, approved job (scontrol update)"
id4=$(request alice pretrain "governance test: changed after submission") || fail "request for the held job failed"
as carol "$FQ" approve "$id4" >/dev/null || fail "carol could not approve $id4"
held=$(as alice sbatch --parsable -H --train-approval="$id4" "${big[@]}") || fail "the approved held job was refused"
jobs+=("$held")
# The job's record, field-exact (squeue -O): what admission depends on and the AdminComment.
record() { squeue -h -j "$held" -O "numnodes:8,partition:12,qos:12,timelimit:14,tres-per-node:24,account:12,admin_comment:300"; }
before=$(record)
# refused_update WHAT SLURM-TEXT SENTENCE FIELD=VALUE...: alice's update is refused with the rule's Slurm error
# (22.05 does not pass a job_modify's message on) and slurmctld's log holds the rule's sentence.
refused_update() {
  local what=$1 text=$2 sentence=$3
  shift 3
  expect_refused "$what" "$text for job $held" as alice scontrol update JobId="$held" "$@"
  grep -F "forge job_modify: refused uid $(id -u alice)'s update of job $held: " "$STATE/log/slurmctld.log" |
    tail -n1 | grep -qF -- "$sentence" || fail "$what: slurmctld's log lacks '$sentence'"
}
refused_update "grow its GPUs" "Node count specification invalid" \
  "--train-layout=tp1,pp1,dp8 needs tp*cp*dp*pp = 8 GPUs but the job asks for 24" Gres=gpu:24
refused_update "grow its nodes" "Node count specification invalid" "needs 1 node(s) but the job asks for 3" NumNodes=3
refused_update "GPUs per node" "Node count specification invalid" "asks for 16" TresPerNode=gres:gpu:16
refused_update "move it to the eval pool" "Access/permission denied" \
  "partition 'eval' (pool eval) does not take tier 'pretrain' jobs" Partition=eval
refused_update "re-QOS it" "Access/permission denied" "--qos=explore does not match tier 'pretrain'" QOS=explore
refused_update "another account" "Invalid account or account/partition combination specified" "--account=team-b does not match team 'team-a'" Account=team-b
# The hooks' markers written where alice may write: the Comment is hers and means nothing to them.
as alice scontrol update JobId="$held" Comment="forge-approval=$id1 AdminComment=forge-elastic:nodes=1-99 forge-tier=pretrain" ||
  fail "alice cannot set her job's Comment"
[ "$(record)" = "$before" ] || fail "alice's refused changes left a trace: $before -> $(record)"
# A shorter time limit, still over the GPU-hour rule (8 GPUs x 40 h): the checker finds it covered by the
# approval the job holds, which is not spent again.
as alice scontrol update JobId="$held" TimeLimit=40:00:00 || fail "alice could not shorten her approved job"
uses=$(as carol "$FQ" report --approvals --format csv | awk -F, -v id="$id4" '$1 == id {print $12 "/" $13}')
[ "$uses" = 1/1 ] || fail "shortening job $held changed $id4's uses to $uses"
# dave (an admin of the policy and a Slurm operator) may change anything; the controller logs it.
as dave scontrol update JobId="$held" Partition=eval || fail "dave (admin) could not move job $held"
grep -q "forge job_modify: admin uid $(id -u dave) changed training job $held: partition" "$STATE/log/slurmctld.log" ||
  fail "the admin's change of job $held is not in slurmctld's log"
scancel "$held"
echo "  job $held: alice's GPUs, nodes, pool, QOS and account changes refused; a shorter time admitted on $id4 ($uses uses); dave's move logged"
# A plain job of alice's that claims to be a forge job in its Comment, requeued: the controller's epilog
# leaves it to Slurm's requeue delay (it releases only jobs job_submit.lua marked in the AdminComment).
# (Requeued once its script runs: a job requeued while its allocation is still starting gets no delay.)
fake=$(as alice sbatch --parsable --requeue -p train -t 5 --comment="forge:{} forge-tier=pretrain" -o /dev/null \
  -D "$work/alice" --wrap 'touch started; sleep 60') || fail "alice's plain job was refused"
jobs+=("$fake")
for _ in $(seq 1 180); do [ -f "$work/alice/started" ] && break; sleep 0.5; done
[ -f "$work/alice/started" ] || fail "alice's plain job $fake did not start: $(squeue -h -j "$fake" -o '%T %r')"
as alice scontrol requeue "$fake" || fail "alice could not requeue her job $fake"
for _ in $(seq 1 60); do [ "$(squeue -h -j "$fake" -o %T)" = PENDING ] && break; sleep 0.5; done
# The watcher would release a forge job within seconds. Judged by the job's eligible time, not squeue's
# reason, which reads None until the scheduler's next pass sets BeginTime.
sleep 8
eligible=$(scontrol show job -o "$fake" | grep -o 'EligibleTime=[^ ]*' | cut -d= -f2)
wait_s=$(($(date -d "$eligible" +%s) - $(date +%s)))
[ "$wait_s" -gt 30 ] && ! grep -q "released requeued forge job $fake\$" "$STATE/log/forge-health.log" 2>/dev/null ||
  fail "alice's plain job $fake with a forged Comment was released early: eligible at $eligible, $(squeue -h -j "$fake" -o '%T %r')"
scancel "$fake"
echo "  a plain job with forge words in its Comment stays in Slurm's requeue delay (eligible in ${wait_s} s)"
no_drain "changes after submission"

echo "== hostile paths: bob's jobs aim at team-a's files"
# bob trains for team-b on a dataset anyone may read (a copy), so that each job below fails on the one path
# it aims at team-a, with the kernel's refusal naming it, and never drains a node.
TEAM_B=$STATE/teams/team-b
cp -r "$dataset" "$work/public-dataset" && chmod -R a+rX "$work/public-dataset"
bob_spec() {  # bob_spec NAME [SED-ARGS...]: team-b's spec in team-b's runs, edited by SED-ARGS; prints its path
  local name=$1
  shift
  sed -e "s|^dir = .*|dir = $TEAM_B/runs/gov-$$-$name|" -e "s|^dataset = .*|dataset = $work/public-dataset|" \
    -e "s/^steps = .*/steps = 2/" "$@" "$SRC/configs/tiny.ini" >"$work/bob-$name.ini"
  chmod 644 "$work/bob-$name.ini"
  echo "$work/bob-$name.ini"
}
bob_train() {  # bob_train SPEC: bob's team-b training job; prints its id
  as bob sbatch --parsable --train-team=team-b --train-tier=explore --train-layout=tp1,pp1,dp1 --train-spec="$1" \
    -n1 --gres=gpu:1 -o "$work/bob/%j.out" -D "$work/bob" "$home/scripts/sbatch/pretrain.sbatch" "$1" --run.threads=1
}
expect_failed() {  # expect_failed WHAT JOB PATTERN: JOB failed and its output names PATTERN; no node drained
  local state
  state=$(final_state "$2")
  [ "$state" = FAILED ] || fail "$1: job $2 ended $state: $(cat "$work/bob/$2.out")"
  grep -qF -- "$3" "$work/bob/$2.out" || fail "$1: job $2's output does not name '$3': $(cat "$work/bob/$2.out")"
  no_drain "$1"
  echo "  refused ($1): job $2 FAILED: $(grep -m1 -F -- "$3" "$work/bob/$2.out" | cut -c1-140)"
}
# run.dir into team-a's directory through '..' and through a link in team-b's: resolved before it is judged.
expect_refused "run.dir '..' out of team-b's directory" "is outside team team-b's directory" \
  as bob sbatch --test-only --train-team=team-b --train-tier=explore --train-layout=tp1,pp1,dp1 \
  --train-spec="$(bob_spec dotdot -e "s|^dir = .*|dir = $TEAM_B/runs/../../team-a/runs/gov-$$-bob|")" -n1 --gres=gpu:1 --wrap true
as bob ln -s "$TEAM_A/runs" "$TEAM_B/runs/gov-$$-link" || fail "bob cannot make a link in team-b's runs"
expect_refused "run.dir through a link to team-a" "is outside team team-b's directory" \
  as bob sbatch --test-only --train-team=team-b --train-tier=explore --train-layout=tp1,pp1,dp1 \
  --train-spec="$(bob_spec link -e "s|^dir = .*|dir = $TEAM_B/runs/gov-$$-link/bob|")" -n1 --gres=gpu:1 --wrap true
rm -f "$TEAM_B/runs/gov-$$-link"
# Starting from alice's checkpoint, or training on her dataset: the job runs as bob and cannot read them.
spec=$(bob_spec init)
printf '\n[ckpt]\ninit_from = %s\n' "$ckpt" >>"$spec"
j=$(bob_train "$spec") || fail "bob's job from alice's checkpoint not submitted"
jobs+=("$j")
expect_failed "ckpt.init_from = alice's checkpoint" "$j" "checkpoint directory '$ckpt': cannot read it: Permission denied"
j=$(bob_train "$(bob_spec data -e "s|^dataset = .*|dataset = $dataset|")") || fail "bob's job on alice's dataset not submitted"
jobs+=("$j")
expect_failed "data.dataset = alice's dataset" "$j" "dataset $dataset: cannot read it: Permission denied"
rm -rf "$TEAM_B/runs/gov-$$-"*

echo "== sandbox: alice's gate runs code that tries every way out"
# A team writes its own code suites, so their tests are anyone's code. Each task below passes only if its
# escape works: a pass@1 above 0 is an escape. What would outlive the sandbox is looked for on the host.
ctld_port=$(scontrol show config | awk '$1 == "SlurmctldPort" {print $3}')
echo "team-b's world-readable data" >"$work/world.txt" && chmod 644 "$work/world.txt"
mkdir -p "$work/suites/escape"
echo '{"name": "escape", "type": "code", "format": "text", "max_new_tokens": 2, "samples": 1}' >"$work/suites/escape/suite.json"
escape_task() {  # escape_task ID PYTHON: the completion lands in a string, then PYTHON runs as the tests
  python3 -c 'import json, sys; print(json.dumps({"id": sys.argv[1], "prompt": "note = r\"\"\"", "tests": "\"\"\"\n" + sys.argv[2]}))' "$1" "$2"
}
{
  escape_task home 'import os; assert os.listdir("/home/alice") is not None'
  escape_task run-dir "import os; assert os.listdir('$run')"
  escape_task dataset "import os; assert os.listdir('$dataset')"
  escape_task world-readable "assert open('$work/world.txt').read()"
  escape_task write "open('$run/escaped', 'w').write('x'); open('/var/tmp/forge-escaped-$$', 'w').write('x')"
  escape_task network "import socket; socket.create_connection(('127.0.0.1', $ctld_port), 2)"
  escape_task fork-bomb $'import os
while True:
    try:
        os.fork()
    except OSError:
        pass'
  escape_task memory 'b = bytearray(8 << 30); assert b'
  escape_task linger "import subprocess; subprocess.Popen(['sleep', '600'], start_new_session=True); import time; time.sleep(1); assert False"
} >"$work/suites/escape/tasks.jsonl"
cat >"$work/escape-gate.ini" <<INI
[gate]
required_domains = code, legal
min_tokens = 64
[bpb]
max_absolute = 100
[suites]
dir = $work/suites
required = escape
INI
chmod -R a+rX "$work/suites" "$work/escape-gate.ini"
cp "$BUILD/eval_gate/forge-gate" "$home/build/forge-gate" && chmod 755 "$home/build/forge-gate"
as alice srun --train-team=team-a --train-tier=eval --train-layout=tp1,pp1,dp1 -p eval -n1 --gres=gpu:1 -D "$work/alice" \
  "$home/build/forge-gate" evaluate --dataset "$dataset" --policy "$work/escape-gate.ini" --checkpoint "$ckpt" \
  --baseline none --no-promote --out "$work/alice/escape" --max-sequences 4 --threads 1 >"$work/alice/escape.log" 2>&1
[ -f "$work/alice/escape/verdict.json" ] || fail "alice's gate with the escape suite gave no verdict: $(tail -n3 "$work/alice/escape.log")"
scores=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["suites"]["escape"]["metrics"]["pass@1"]["per_task"])' \
  "$work/alice/escape/verdict.json") || fail "no escape scores in the verdict"
python3 -c 'import ast, sys; d = ast.literal_eval(sys.argv[1]); assert len(d) == 9 and not any(d.values()), d' "$scores" ||
  fail "an escape from the sandbox worked: $scores"
if [ -e "$run/escaped" ] || [ -e "/var/tmp/forge-escaped-$$" ]; then fail "a sandboxed program wrote outside its scratch"; fi
# The step's teardown may take a moment to reap its last processes; a lingering child would stay.
for _ in $(seq 1 20); do [ -z "$(pgrep -u alice)" ] && break; sleep 0.5; done
[ -z "$(pgrep -u alice)" ] || fail "processes of alice outlived her gate: $(pgrep -a -u alice)"
no_drain "the escape suite"
echo "  9 ways out (home, run directory, dataset, world-readable data, writes, network, fork bomb, memory, a"
echo "  lingering child) all failed inside alice's gate step; nothing left on the host, no node drained"

echo "== the ledger: requests, decisions, uses and jobs"
"$BUILD/quota/forge-quota" sync >/dev/null || fail "forge-quota sync failed"
report=$(as carol "$FQ" report --approvals --format csv) || fail "carol's approval report failed"
grep "$id1" <<<"$report" | grep -q "$job1" || fail "the report does not tie $id1 to job $job1: $report"
grep -q "$id3" <<<"$report" || fail "carol (approver of team-b) does not see $id3"
alice_view=$(as alice "$FQ" report --approvals --format csv) || fail "alice's approval report failed"
grep -q "$id1" <<<"$alice_view" || fail "alice does not see her own request"
! grep -q "$id3" <<<"$alice_view" || fail "alice sees team-b's request $id3"
as bob "$FQ" report --by team --format csv | grep -q team-a && fail "bob's report shows team-a"
as dave "$FQ" report --by team --format csv | grep -q team-a || fail "dave's (admin) report lacks team-a"
echo "  report --approvals: $id1 -> job $job1; alice sees team-a only, bob's team report hides team-a, dave sees all"
echo "PASS: governance (pools, isolation, approval) as alice, bob, carol and dave"
