#!/usr/bin/env bash
# 200 concurrent sbatch submissions, half allowed (held, then cancelled) and half rejected: every one
# gets its own right answer.
# Usage: slurm_burst.sh FORGE_QUOTA_BINARY
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm_lib.sh
source "$HERE/slurm_lib.sh"

N=${FORGE_BURST_N:-200}
quota_sync
mkdir -p "$WORK/burst"

# One submission: even i allowed (held so it never runs), odd i from an unknown team of its own.
submit_one() {
  local i=$1 dir=$2 team=team-a
  [ $((i % 2)) -eq 0 ] || team=team-z$i
  sbatch --parsable -H -J "forge-burst-$i" -o /dev/null --train-team="$team" --train-tier=explore \
    --train-layout=tp1,pp1,dp8 -N1 --gpus-per-node=8 --wrap true >"$dir/$i.out" 2>"$dir/$i.err"
  echo $? >"$dir/$i.rc"
}
export -f submit_one

start=$SECONDS
seq 0 $((N - 1)) | xargs -P 50 -I{} bash -c 'submit_one "$@"' _ {} "$WORK/burst"
elapsed=$((SECONDS - start))

ids=()
for ((i = 0; i < N; i++)); do
  rc=$(cat "$WORK/burst/$i.rc" 2>/dev/null)
  out=$(cat "$WORK/burst/$i.out" 2>/dev/null)
  if [ $((i % 2)) -eq 0 ]; then
    if [ "$rc" = 0 ] && [[ $out =~ ^[0-9]+$ ]]; then
      ids+=("$out")
      cleanup_jobs+=("$out")
    else
      fail "burst submission $i (allowed) got rc=$rc: $out $(cat "$WORK/burst/$i.err")"
    fi
  else
    [ "$rc" != 0 ] || { cleanup_jobs+=("$out"); fail "burst submission $i (team-z$i) was accepted"; }
    grep -q "unknown team 'team-z$i'" "$WORK/burst/$i.err" ||
      fail "burst submission $i got the wrong answer: $(cat "$WORK/burst/$i.err")"
  fi
done
# The accepted ones are what they claim: explore QOS, team-a's account.
bad=$(squeue -h -j "$(IFS=,; echo "${ids[*]}")" -o '%i %q %a' | awk '$2 != "explore" || $3 != "team-a"')
[ -z "$bad" ] || fail "accepted burst jobs with the wrong QOS/account: $bad"
scancel "${ids[@]}"
cleanup_jobs=()
check_no_drain "the burst"
echo "ok: $N concurrent submissions in ${elapsed}s: ${#ids[@]} accepted, $((N - ${#ids[@]})) rejected, all as expected"
