# Sourced by the forge-train tests on MPI ranks: Open MPI as root over loopback, oversubscribed, one thread
# per rank; fail MESSAGE; compare RUN_A RUN_B [FROM [TOL]]: every step >= FROM (default 1) of run B has run
# A's loss within TOL relative (default 2e-5: summation order is all that may differ between layouts;
# absolute where A's is 0).
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
compare() {
  python3 - "$1/metrics/rank-0.jsonl" "$2/metrics/rank-0.jsonl" "${3:-1}" "${4:-2e-5}" <<'PY' || fail "losses of $2 differ from $1"
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
steps = [s for s in b if s >= int(sys.argv[3])]
assert steps and all(s in a for s in steps), (sorted(a), sorted(b))
worst = max(abs(b[s] - a[s]) / (abs(a[s]) or 1.0) for s in steps)  # a loss of 0 (GRPO's flat groups): absolute
print(f"{sys.argv[2]}: steps {min(steps)}-{max(steps)}, worst relative loss difference {worst:.1e}")
sys.exit(0 if worst <= float(sys.argv[4]) else 1)
PY
}
