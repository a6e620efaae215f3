#!/usr/bin/env bash
# Who may write the model registry (docs/CHECKPOINTS.md, "Registry"): only who may write a release's run
# directory registers it (exit 74 naming the user otherwise); a new registry is made 0660 with its -wal and
# -shm kept; a registry of schema version 1 gains owner_group, origin and image. As root, also a setgid copy of forge-ckpt
# (AT_SECURE), built with a system registry under the build directory: it refuses any other registry (64),
# wants the registry's files made by root (74), and lets a user register releases only from run
# directories that user may write, without ever owning a file of the registry.
# Usage: registry_privilege_test.sh FORGE_TRAIN FORGE_CKPT FORGE_CKPT_TEST_SYSTEM SYSTEM_REGISTRY SOURCE_DIR
set -uo pipefail
train=$1 ckpt=$2 ckpt_sys=$3 sys=$4 src=$5
work=$(mktemp -d)
[ -n "$work" ] && [ -d "$work" ] || { echo "FAIL: mktemp -d" >&2; exit 1; }
sysdir=$(dirname "$sys")
case $sysdir in */system-registry) ;; *) echo "FAIL: SYSTEM_REGISTRY $sys is not in a system-registry directory" >&2; exit 1 ;; esac
trap 'rm -rf "$work" "$sysdir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset FORGE_REGISTRY SLURM_JOB_ACCOUNT SLURM_JOB_ID
umask 022

# expect CODE TEXT COMMAND...: the command exits CODE and prints exactly the one line TEXT.
expect() {
  local code=$1 text=$2 rc out
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$code" ] && [ "$out" = "$text" ] ||
    fail "${*}: exit $rc, expected $code and the line \"$text\"; got: $out"
}

# One small release, not registered.
"$train" "$src/configs/tiny.ini" --run.name=priv --run.dir="$work/run" --run.threads=1 --run.peak_gflops=100 \
  --model.layers=1 --model.d_model=32 --model.heads=2 --model.seq_len=64 --model.vocab=300 --run.steps=2 \
  --ckpt.milestone_every=2 2>"$work/train.log" || fail "training failed: $(tail -n1 "$work/train.log")"
echo '{"pass": true}' >"$work/verdict.json"
out=$("$ckpt" promote "$work/run/checkpoints/milestone/step-00000002" --verdict "$work/verdict.json" --no-register \
  --json) || fail "promote failed: $out"
release=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["release"])' "$out") || fail "promote said: $out"
my_group=$(id -gn)

# A new registry: 0660 minus the caller's umask 022 would be 0640; forge-ckpt's umask is 007, and the -wal
# and -shm files stay after the last connection.
"$ckpt" registry init --registry "$work/reg/registry.db" >"$work/init.out" || fail "registry init failed"
[ "$(cat "$work/init.out")" = "registry $work/reg/registry.db is ready" ] || fail "registry init said: $(cat "$work/init.out")"
for f in registry.db registry.db-wal registry.db-shm; do
  [ -f "$work/reg/$f" ] || fail "registry init left no $f"
  [ "$(stat -c %a "$work/reg/$f")" = 660 ] || fail "$f is mode $(stat -c %a "$work/reg/$f"), expected 660"
done
"$ckpt" registry add "$release" --registry "$work/reg/registry.db" >/dev/null || fail "registry add by the run's owner failed"
"$ckpt" registry show priv --registry "$work/reg/registry.db" | grep -qx "owner group  $my_group" ||
  fail "registry show does not name the owner group $my_group"
# The caller's own files keep the caller's umask: the release, an export.
[ "$(stat -c %a "$release")" = 755 ] || fail "the release directory is mode $(stat -c %a "$release"), expected 755"
"$ckpt" registry export priv --registry "$work/reg/registry.db" --out "$work/priv.h5" --params-only >/dev/null ||
  fail "registry export failed"
[ "$(stat -c %a "$work/priv.h5")" = 644 ] || fail "the export is mode $(stat -c %a "$work/priv.h5"), expected 644"

# A registry of schema version 1 (no owner_group, origin or image) is brought up to date, its entries kept.
python3 - "$work/v1.db" "$release" <<'PY' || fail "could not write a version 1 registry"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.executescript("""
CREATE TABLE releases (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL UNIQUE,
  source TEXT NOT NULL, team TEXT NOT NULL, run_dir TEXT NOT NULL, objective TEXT NOT NULL,
  step INTEGER NOT NULL, train_jobs TEXT NOT NULL, promote_job TEXT NOT NULL, dataset_version TEXT NOT NULL,
  tokenizer_sha256 TEXT NOT NULL, spec_hash TEXT NOT NULL, parent TEXT NOT NULL,
  parent_id INTEGER REFERENCES releases(id), lineage TEXT NOT NULL, verdict TEXT NOT NULL,
  metrics TEXT NOT NULL, export_path TEXT NOT NULL, registered_unix REAL NOT NULL, UNIQUE (name, version));
CREATE INDEX releases_source ON releases(source);
CREATE INDEX releases_parent ON releases(parent);
PRAGMA user_version=1;
""")
db.execute("INSERT INTO releases VALUES (1,'old',1,'/x/old/checkpoints/release/step-1','','nlp','/x/old','lm',1,"
           "'[]','','','','','',NULL,'null','null','null','',0)")
db.commit()
PY
"$ckpt" registry show old:1 --registry "$work/v1.db" | grep -qx "owner group  -" || fail "the version 1 entry reads wrong"
[ "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("PRAGMA user_version").fetchone()[0])' "$work/v1.db")" = 4 ] ||
  fail "the version 1 registry was not brought to version 4"
"$ckpt" registry show old:1 --registry "$work/v1.db" --json |
  python3 -c 'import json,sys; d = json.load(sys.stdin); assert d["origin"] is None and d["image"] == "", d' ||
  fail "the version 1 entry gained an origin or an image"
"$ckpt" registry add "$release" --registry "$work/v1.db" --json >"$work/v1-add.json" || fail "registry add into the upgraded registry failed"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ref"] == "priv:1" and d["owner_group"] == sys.argv[2], d' \
  "$work/v1-add.json" "$my_group" || fail "registry add into the upgraded registry: $(cat "$work/v1-add.json")"

# The rest needs root: other users, and a file system that honours setgid bits.
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the checks as another user and of a setgid forge-ckpt need root (running as $(id -un))"
  echo "PASS (without the root checks)"
  exit 0
fi
if ! command -v setpriv >/dev/null || ! getent passwd nobody >/dev/null || ! getent group nogroup >/dev/null; then
  echo "SKIP: the checks as another user need setpriv, the user nobody and the group nogroup"
  echo "PASS (without the root checks)"
  exit 0
fi
# The other user: nobody, with a group of its own and one team group, so that it is in neither nogroup (the
# setgid copy's group: a setgid program of one's own group runs unprivileged) nor root's groups.
user_gid=65533 team_gid=65532
as_nobody() { setpriv --reuid=nobody --regid=$user_gid --groups=$team_gid "$@"; }
team_group=$(getent group $team_gid | cut -d: -f1)
team_group=${team_group:-$team_gid}
chmod 755 "$work"

# The plain binary: nobody may write the registry's file, not the run directory (root's, 0755).
chmod 777 "$work/reg"
chmod 666 "$work/reg"/registry.db*
chmod 755 "$work/run"
expect 74 "forge-ckpt: error: user nobody cannot write $work/run: only its team (the group that owns it) registers its releases" \
  as_nobody "$ckpt" registry add "$release" --registry "$work/reg/registry.db"
# Anyone may export a release; only its team records the export.
mkdir -m 777 "$work/nobody-out"
as_nobody "$ckpt" registry export priv --registry "$work/reg/registry.db" --out "$work/nobody-out" --params-only \
  >/dev/null 2>"$work/export.err" || fail "registry export as nobody failed: $(cat "$work/export.err")"
[ "$(stat -c %U "$work/nobody-out/priv-v1.h5")" = nobody ] || fail "the export as nobody is not nobody's"
grep -q "the export is not recorded in the registry: only the team that owns $work/run" "$work/export.err" ||
  fail "registry export as nobody said: $(cat "$work/export.err")"
"$ckpt" registry show priv --registry "$work/reg/registry.db" --json |
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["export_path"].endswith("/priv.h5"), d' ||
  fail "nobody's export replaced the recorded one"

# Another team's release (a run directory nobody cannot read) is neither listed, shown nor exported to nobody,
# and said to be another team's rather than where it lies.
chmod 700 "$work/run"
out=$(as_nobody "$ckpt" registry list --registry "$work/reg/registry.db" 2>&1) || fail "registry list as nobody failed: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] && ! grep -q "priv" <<<"$out" || fail "registry list shows nobody a release it cannot read: $out"
for cmd in show lineage; do
  expect 64 "forge-ckpt: error: no model 'priv' that you may see in registry '$work/reg/registry.db': it is another team's" \
    as_nobody "$ckpt" registry $cmd priv --registry "$work/reg/registry.db"
done
expect 64 "forge-ckpt: error: no model 'priv:1' that you may see in registry '$work/reg/registry.db': it is another team's" \
  as_nobody "$ckpt" registry export priv:1 --registry "$work/reg/registry.db" --out "$work/nobody-out" --params-only
"$ckpt" registry list --registry "$work/reg/registry.db" | grep -q "^priv:1 " || fail "root no longer sees the release"
chmod 755 "$work/run"
if findmnt -no OPTIONS -T "$ckpt_sys" | grep -qw nosuid || findmnt -no OPTIONS -T "$work" | grep -qw nosuid; then
  echo "SKIP: setgid checks: the build or temporary directory is mounted nosuid"
  echo "PASS (without the setgid checks)"
  exit 0
fi
mkdir "$work/sg"
cp "$ckpt_sys" "$work/sg/forge-ckpt"
chgrp nogroup "$work/sg/forge-ckpt"
chmod 2755 "$work/sg/forge-ckpt"
sg=$work/sg/forge-ckpt
rm -rf "$sysdir"

# Only the system registry, whichever way another is named; before promote copies anything.
refusal="forge-ckpt: error: forge-ckpt runs setgid: it uses only the system registry $sys, not '$work/reg/registry.db'"
expect 64 "$refusal" "$sg" registry list --registry "$work/reg/registry.db"
expect 64 "$refusal" env FORGE_REGISTRY="$work/reg/registry.db" "$sg" registry add "$release"
expect 64 "$refusal" as_nobody env FORGE_REGISTRY="$work/reg/registry.db" "$sg" registry show priv
expect 64 "$refusal" "$sg" promote "$work/run/checkpoints/milestone/step-00000002" --verdict "$work/verdict.json" \
  --registry "$work/reg/registry.db"
# Its files must be root's, made beforehand by the plain binary.
expect 74 "forge-ckpt: error: forge-ckpt runs setgid: the registry file $sys does not exist; root creates the registry and its -wal and -shm files by running 'forge-ckpt registry init' (the unprivileged binary)" \
  "$sg" registry list
install -d -o root -g nogroup -m 2770 "$sysdir"
"$ckpt" registry init --registry "$sys" >/dev/null || fail "registry init of the system registry failed"
for f in "$sys" "$sys-wal" "$sys-shm"; do
  [ "$(stat -c %U:%G:%a "$f")" = root:nogroup:660 ] || fail "$f is $(stat -c %U:%G:%a "$f"), expected root:nogroup:660"
done
ln -s "$sys" "$work/link.db"
"$sg" registry list --registry "$work/link.db" >/dev/null || fail "the setgid copy refuses a link to the system registry"
# A -wal of nobody's (as SQLite would have made it for nobody) is refused.
mv "$sys-wal" "$work/wal" && cp "$work/wal" "$sys-wal" && chown nobody "$sys-wal"
expect 74 "forge-ckpt: error: forge-ckpt runs setgid: the registry file $sys-wal is not a regular file owned by root (uid $(id -u nobody)); root creates the registry and its -wal and -shm files by running 'forge-ckpt registry init' (the unprivileged binary)" \
  as_nobody "$sg" registry list
mv -f "$work/wal" "$sys-wal"

# nobody cannot write the run directory (root's, 0755): refused, and nothing registered.
expect 74 "forge-ckpt: error: user nobody cannot write $work/run: only its team (the group that owns it) registers its releases" \
  as_nobody "$sg" registry add "$release"
as_nobody "$sg" registry list --json >"$work/list.jsonl" || fail "registry list as nobody failed"
[ ! -s "$work/list.jsonl" ] || fail "nobody's refused add registered something: $(cat "$work/list.jsonl")"
# Root, who may write it, registers it through the setgid copy.
out=$("$sg" registry add "$release") || fail "registry add as root through the setgid copy failed: $out"
[ "$out" = "registered $release as priv:1 in $sys" ] || fail "registry add as root said: $out"
# A run directory of nobody's team group (2770): nobody registers its release, and reads the registry.
cp -a "$work/run" "$work/team-run"
chgrp -R $team_gid "$work/team-run"
chmod 2770 "$work/team-run"
as_nobody "$sg" registry add "$work/team-run/checkpoints/release/step-00000002" --team team-x --json >"$work/team.json" ||
  fail "registry add as nobody of its team's release failed: $(cat "$work/team.json")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ref"] == "priv:2" and d["team"] == "team-x" and d["owner_group"] == sys.argv[2], d' \
  "$work/team.json" "$team_group" || fail "nobody's registration: $(cat "$work/team.json")"
as_nobody "$sg" registry show priv:1 | grep -qx "owner group  root" || fail "registry show as nobody: no owner group root"
# nobody wrote the registry, yet owns none of its files, which stay the group's to write.
for f in "$sys" "$sys-wal" "$sys-shm"; do
  [ "$(stat -c %U:%G:%a "$f")" = root:nogroup:660 ] || fail "after nobody's write $f is $(stat -c %U:%G:%a "$f")"
done
# Commands without the registry give the group up: what they write is the caller's.
as_nobody "$sg" list "$work/team-run" >/dev/null || fail "forge-ckpt list as nobody through the setgid copy failed"
echo "PASS: only who may write a run directory registers its releases; new registries 0660 with kept -wal/-shm; version 1 upgraded; the setgid copy uses only the system registry, root's files"
