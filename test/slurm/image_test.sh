#!/usr/bin/env bash
# Container images on the dev cluster (docs/IMAGES.md), as the real user alice:
#   build    forge-image build makes an OCI bundle of the build's programs from Debian packages; verify
#            recomputes its digest, and a changed file is found (65);
#   bad      a path that is no directory, a directory that is no bundle, a bundle that is not ours, one
#            every user may write, one with other programs than the job's build (64), a node whose oci.conf
#            names a runtime that is not installed (69): each refused by name before any rank starts, and
#            a job of bob's naming alice's image fails the same way, no node drained;
#   slurm    Slurm's own `srun --container` runs the image for a one-task step;
#   train    alice's 16-rank job on two nodes with run.image runs every rank in the image (through
#            oci.conf's crun) with the losses of the same job outside it; its checkpoints record the digest;
#   preempt  SIGUSR1 reaches the ranks through crun: a recovery checkpoint, exit 75, and the run started
#            again in the image goes on along the uninterrupted run's loss curve;
#   resume   the run resumed in another image says so with both digests, and trains on; its release's
#            registry entry and lineage name the image.
# Needs scripts/devcluster/up (with crun: scripts/install-deps.sh); FORGE_BUILD_DIR is the build under test.
set -uo pipefail
SRC=${FORGE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=test/support/devcluster.sh
source "$SRC/test/support/devcluster.sh" image-test
# shellcheck source=test/support/metrics.sh
source "$SRC/test/support/metrics.sh"
[ -f "$STATE/etc/oci.conf" ] || fail "the dev cluster has no oci.conf: crun is not installed (scripts/install-deps.sh)"
IMAGE=$SRC/scripts/forge-image

trap 'scancel "${jobs[@]}" 2>/dev/null; [ -n "${FORGE_KEEP:-}" ] || rm -rf "$work"' EXIT
# What alice's jobs run, where she can reach it (the checkout may sit under /root).
home=$work/forge
mkdir -p "$home/scripts" "$home/build"
cp -r "$SRC/scripts/sbatch" "$IMAGE" "$home/scripts/"
for p in launcher/forge-train dataio/forge-data eval_gate/forge-gate ckpt/forge-ckpt; do
  mkdir -p "$home/build/$(dirname "$p")" && cp "$BUILD/$p" "$home/build/$p"
done
mkdir "$work/alice" "$work/bob" && chown alice "$work/alice" && chown bob "$work/bob"
cp "$SRC/configs/tiny.ini" "$work/tiny.ini"
chmod -R a+rX "$work"
# shellcheck source=test/support/slurm_users.sh
source "$SRC/test/support/slurm_users.sh"
expect_exit() {  # expect_exit WHAT CODE PATTERN CMD...: CMD exits CODE and says PATTERN
  local what=$1 code=$2 pattern=$3 out rc=0
  shift 3
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" -eq "$code" ] || fail "$what: exit $rc, not $code: $out"
  grep -q -- "$pattern" <<<"$out" || fail "$what: the message does not say '$pattern': $out"
  echo "refused ($code): $what"
}

# --- build ---------------------------------------------------------------------------------------------
start=$SECONDS
digest=$("$IMAGE" build --build-dir "$BUILD" "$work/image" 2>"$work/build.log" | tail -n1) || fail "forge-image build failed"
[[ $digest == sha256:* ]] || fail "forge-image build printed no digest: $digest"
echo "built $work/image in $((SECONDS - start)) s: $digest"
[ "$("$IMAGE" verify "$work/image")" = "$digest" ] || fail "verify does not give the digest build printed"
[ "$("$IMAGE" digest "$work/image")" = "$digest" ] || fail "digest does not give the digest build printed"
[ -x "$work/image/rootfs/opt/forge/bin/forge-train" ] || fail "the image has no forge-train"
grep -q '"libopenmpi3=' "$work/image/rootfs/etc/forge-image.json" || fail "the image does not list its packages"
lib=$(find "$work/image/rootfs/usr/lib" -name 'libxxhash.so.*' -type f | head -n1)
cp -p "$lib" "$work/lib.orig" && printf x >>"$lib"
expect_exit "a changed file of the image" 65 "has changed since it was built" "$IMAGE" verify "$work/image"
cp -p "$work/lib.orig" "$lib"
[ "$("$IMAGE" verify "$work/image")" = "$digest" ] || fail "the image does not verify once the file is back"
expect_exit "an existing output" 64 "exists" "$IMAGE" build --build-dir "$BUILD" "$work/image"

# --- bad images and nodes ------------------------------------------------------------------------------
expect_exit "no directory" 64 "is not a directory" "$IMAGE" check "$work/none"
mkdir -p "$work/notbundle" "$work/foreign/rootfs" && echo '{}' >"$work/foreign/config.json"
expect_exit "no bundle" 64 "not an OCI bundle" "$IMAGE" check "$work/notbundle"
expect_exit "another bundle" 64 "not a SlurmForge image" "$IMAGE" check "$work/foreign"
mkdir -p "$work/otherbuild"
cp -r "$home/build/." "$work/otherbuild/" && printf x >>"$work/otherbuild/launcher/forge-train"
expect_exit "other programs" 64 "holds another forge-train" "$IMAGE" check "$work/image" --build-dir "$work/otherbuild"
chmod o+w "$work/image/rootfs/opt/forge/bin"
expect_exit "an image every user may write" 64 "every user may write" "$IMAGE" check "$work/image"
chmod o-w "$work/image/rootfs/opt/forge/bin"
mkdir "$work/etc" && cp "$SLURM_CONF" "$work/etc/slurm.conf"
sed 's|crun |/nonexistent/crun |' "$STATE/etc/oci.conf" >"$work/etc/oci.conf"
expect_exit "no OCI runtime on the node" 69 "/nonexistent/crun" env SLURM_CONF="$work/etc/slurm.conf" "$IMAGE" check "$work/image"
[ "$("$IMAGE" check "$work/image" --build-dir "$home/build")" = "$digest" ] || fail "the good image does not check"

# Slurm's own `srun --container` runs the same image for a one-task step; 22.05 refuses two tasks on a node
# in one (why the batch scripts start each rank with forge-train in-image, through the same oci.conf).
out=$(as alice srun --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp1 -N1 -n1 --gpus-per-node=1 \
  --mpi=none -D "$work/alice" --container="$work/image" /opt/forge/bin/forge-ckpt --help 2>&1) ||
  fail "srun --container with the image failed: $out"
grep -q "usage: forge-ckpt" <<<"$out" || fail "srun --container did not run the image's forge-ckpt: $out"
as alice srun --train-team=team-a --train-tier=explore --train-layout=tp1,pp1,dp2 -N1 -n2 --gpus-per-node=2 \
  --mpi=none -D "$work/alice" --container="$work/image" /opt/forge/bin/forge-ckpt --help >/dev/null 2>&1 &&
  echo "note: this Slurm runs two containerized tasks on a node; forge-train in-image is no longer needed for it"
echo "srun --container runs the image for a one-task step"

# A rank started outside the image the spec names (not through the batch scripts) refuses to train.
expect_exit "a rank outside its image" 64 "runs outside any image" \
  "$BUILD/launcher/forge-train" "$work/tiny.ini" --run.dir="$work/outside" --run.image="$work/image" --run.steps=1

# --- train in the image --------------------------------------------------------------------------------
# 16 ranks on two nodes: containers on one node and across nodes bootstrap MPI together (PMIx).
args=(--run.threads=1 --parallel.dp=16 --data.batch=16 --model.d_model=32 --model.seq_len=32
  --ckpt.recovery_every=3 --ckpt.milestone_every=0)
submit() {  # submit USER NAME ARGS...: a 16-rank training job on two nodes; prints its id
  local user=$1 name=$2
  shift 2
  as "$user" sbatch --parsable --train-team="team-${user:0:1}" --train-tier=explore --train-layout=tp1,pp1,dp16 \
    -N2 --ntasks-per-node=8 --gres=gpu:8 -o "$work/$user/$name-%j.out" -D "$work/$user" \
    "$home/scripts/sbatch/pretrain.sbatch" "$work/tiny.ini" "${args[@]}" "$@"
}
wait_job() {  # wait_job ID: its final state
  local state=""
  for _ in $(seq 1 300); do
    state=$(sacct -n -X -P -j "$1" -o State 2>/dev/null | tail -n1)
    case $state in COMPLETED | FAILED | CANCELLED* | TIMEOUT | OUT_OF_ME* | NODE_FAIL) break ;; esac
    sleep 1
  done
  echo "$state"
}
inside=$(submit alice inside --run.dir="$work/alice/inside" --run.image="$work/image" --run.steps=6) || fail "job in the image not submitted"
outside=$(submit alice outside --run.dir="$work/alice/outside" --run.steps=6) || fail "job outside the image not submitted"
jobs+=("$inside" "$outside")
[ "$(wait_job "$inside")" = COMPLETED ] || fail "the job in the image did not complete: $(tail -n5 "$work"/alice/inside-*.out)"
[ "$(wait_job "$outside")" = COMPLETED ] || fail "the job outside the image did not complete: $(tail -n5 "$work"/alice/outside-*.out)"
grep -q "every rank runs in image $work/image ($digest)" "$work"/alice/inside-*.out || fail "the job does not say it runs in the image"
diff <(losses "$work/alice/outside/metrics/rank-0.jsonl") <(losses "$work/alice/inside/metrics/rank-0.jsonl") >/dev/null ||
  fail "the losses in the image differ from those outside it"
for m in "$work"/alice/inside/checkpoints/*/step-*/manifest.json; do
  grep -q "\"image\": \"$digest\"" "$m" || fail "$m does not record the image's digest"
done
grep -q '"image"' "$work"/alice/outside/checkpoints/*/step-*/manifest.json && fail "a run outside any image records one"
echo "16 ranks on 2 nodes in the image: the losses of the run outside it; checkpoints record $digest"

# --- preemption in the image --------------------------------------------------------------------------
# Slurm's preemption warning (SIGUSR1 to the step, from srun) reaches the ranks through crun: they save a
# recovery checkpoint and exit 75, and the run started again in the image goes on along the loss curve of the
# same run outside it, uninterrupted.
step=(srun --train-team=team-a --train-tier=explore "--train-layout=tp1,pp1,dp2" -N1 -n2 --gres=gpu:2 --mpi=pmix -D "$work")
long=("$work/tiny.ini" --run.threads=1 --parallel.dp=2 --data.batch=2 --run.steps=300 --ckpt.recovery_every=0
  --ckpt.milestone_every=0)
"${step[@]}" "$BUILD/launcher/forge-train" "${long[@]}" --run.dir="$work/plain" >"$work/plain.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -n3 "$work/plain.log")"
preempt_and_resume "$work/preempted" 20 "$work/preempted.log" "${step[@]}" "$BUILD/launcher/forge-train" in-image \
  "$work/image" /opt/forge/bin/forge-train "${long[@]}" --run.dir="$work/preempted" --run.image="$work/image" ||
  fail "preemption in the image: $(tail -n3 "$work/preempted.log")"
grep -q "stopped: preempted" "$work/preempted.log" || fail "the ranks in the image did not stop for the preemption"
diff <(losses "$work/plain/metrics/rank-0.jsonl") <(losses "$work/preempted/metrics/rank-0.jsonl") >/dev/null ||
  fail "the run preempted in the image left the loss curve of the uninterrupted run"
echo "preempted in the image (SIGUSR1 through crun): checkpoint, exit 75, resumed on the uninterrupted loss curve"
# Each task's bundle and crun's state go when the task ends, also where the node's /tmp is shared (no job_tmp=).
leftover=$(find /tmp -maxdepth 1 \( -name 'forge-oci-*' -o -name 'node[0-9]*.*.*.*.*' \) -print -quit)
[ -z "$leftover" ] || fail "a task in the image left $leftover in the node's /tmp"

# --- resume in another image ---------------------------------------------------------------------------
other=$("$IMAGE" build --build-dir "$BUILD" --bind /var/tmp "$work/image2" 2>/dev/null | tail -n1) || fail "second build failed"
[ "$other" != "$digest" ] || fail "an image with other bind mounts has the same digest"
resumed=$(submit alice resumed --run.dir="$work/alice/inside" --run.image="$work/image2" --run.steps=8) || fail "resume not submitted"
jobs+=("$resumed")
[ "$(wait_job "$resumed")" = COMPLETED ] || fail "the resume in another image did not complete: $(tail -n5 "$work"/alice/resumed-*.out)"
grep -q "was trained in image $digest; this run is in image $other" "$work"/alice/resumed-*.out ||
  fail "the resume in another image does not warn with both digests: $(grep -i image "$work"/alice/resumed-*.out)"
[ "$(losses "$work/alice/inside/metrics/rank-0.jsonl" | wc -l)" -ge 8 ] || fail "the resumed run did not train on"
# The release of that run carries the image into the registry.
echo '{"pass": true, "domains": {"all": {"loss": 1.0}}}' >"$work/verdict.json"
export FORGE_REGISTRY=$work/registry.db
"$BUILD/ckpt/forge-ckpt" promote "$work/alice/inside/checkpoints/milestone/step-00000008" --verdict "$work/verdict.json" \
  --team team-a >/dev/null || fail "promote of the run trained in images failed"
"$BUILD/ckpt/forge-ckpt" registry show tiny --json | python3 -c 'import json,sys; d = json.load(sys.stdin); assert d["image"] == sys.argv[1], d["image"]' "$other" ||
  fail "the registry does not record the release's image"
"$BUILD/ckpt/forge-ckpt" registry lineage tiny | grep -q "trained in image $other" || fail "the lineage does not show the image"
echo "resumed in another image: warned with both digests; the release's registry entry records $other"

# --- another team's image ------------------------------------------------------------------------------
# alice keeps her image in her own directory; bob's job naming it fails before any rank starts.
mv "$work/image" "$work/alice/image" && chmod 700 "$work/alice"
drained_before=$(sinfo -h -t drain -o %N)
refused=$(submit bob theirs --run.dir="$work/bob/run" --run.image="$work/alice/image" --run.steps=6) || fail "bob's job not submitted"
jobs+=("$refused")
state=$(wait_job "$refused")
[ "$state" = FAILED ] || fail "bob's job with alice's image ended $state"
grep -q "image '$work/alice/image' is not a directory you can read" "$work"/bob/theirs-*.out ||
  fail "bob's job does not name the image it cannot use: $(tail -n3 "$work"/bob/theirs-*.out)"
[ "$(sinfo -h -t drain -o %N)" = "$drained_before" ] || fail "a refused image drained a node"
[ -e "$work/bob/run/metrics" ] && fail "bob's refused job started ranks"
echo "bob's job with alice's image: refused by name, nothing drained"
echo "PASS"
