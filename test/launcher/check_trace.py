#!/usr/bin/env python3
"""Checks forge-train's traces (written from the Chrome trace event format, not from the writer's code).

usage: check_trace.py TRACE_DIR RUN_DIR FIRST LAST [--outliers N]

For every rank-NNNNN.json in TRACE_DIR and the merged.json:
- it loads as JSON; spans (B/E) are balanced and nested per track, operations in flight (b/e) are
  balanced per id;
- each traced step has its data fetch, a forward and a backward span for every block this rank holds
  per micro-batch, the optimizer, and its collectives with group names and bytes;
- per step, the summed time of the compute spans (less the communicator calls nested in them) is the
  metrics file's compute_ms within 5%, for the median step of each rank (a step in which the rank was
  descheduled between two spans loses that slice from its spans only: the median is immune to one such
  step in three);
- merged.json holds every rank's events (pid = rank) on one timeline starting at 0.
--outliers N lets N ranks miss the 5% (reported): with many ranks oversubscribed on few cores, a rank
descheduled for a time slice between two spans loses that slice from its spans only.
Prints one line per rank; exits 1 with the reason on the first violation.
"""
import glob
import json
import os
import re
import sys


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def spans(events, where):
    """Closed spans as (name, cat, start, end, depth) from B/E events; checks balance and nesting."""
    stack, out = [], []
    last = None
    for e in events:
        if e["ph"] not in "BE":
            continue
        if last is not None and e["ts"] < last["ts"]:
            fail(f"{where}: span events out of time order: {e} after {last} (open: {[b['name'] for b in stack]})")
        last = e
        if e["ph"] == "B":
            stack.append(e)
        else:
            if not stack:
                fail(f"{where}: an E event without a B at ts {e['ts']}")
            b = stack.pop()
            out.append((b["name"], b.get("cat", ""), b["ts"], e["ts"], len(stack)))
    if stack:
        fail(f"{where}: {len(stack)} span(s) never ended: {[b['name'] for b in stack]}")
    return out


def operations(events, where):
    open_ops, done = {}, []
    for e in events:
        if e["ph"] == "b":
            key = json.dumps(e["id2"])
            if key in open_ops:
                fail(f"{where}: operation id {key} begun twice")
            open_ops[key] = e
        elif e["ph"] == "e":
            key = json.dumps(e["id2"])
            b = open_ops.pop(key, None)
            if b is None:
                fail(f"{where}: operation id {key} ended without a begin")
            if b["name"] != e["name"] or e["ts"] < b["ts"]:
                fail(f"{where}: operation {key} begins as {b['name']} and ends as {e['name']}")
            done.append(b)
    if open_ops:
        fail(f"{where}: {len(open_ops)} operation(s) never ended")
    return done


def main():
    trace_dir, run_dir, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    allowed = int(sys.argv[6]) if len(sys.argv) == 7 and sys.argv[5] == "--outliers" else 0
    outliers = []
    files = sorted(glob.glob(os.path.join(trace_dir, "rank-*.json")))
    if not files:
        fail(f"no rank-*.json in {trace_dir}")
    worst = 0.0
    for path in files:
        rank = int(re.search(r"rank-(\d+)\.json$", path).group(1))
        doc = json.load(open(path))
        events = doc["traceEvents"]
        where = os.path.basename(path)
        if any(e.get("pid") != rank for e in events):
            fail(f"{where}: an event with a pid other than {rank}")
        sp = spans(events, where)
        ops = operations(events, where)
        for op in ops:
            group = op["name"].split(" ")[-1]
            if group not in ("tp", "dp", "pp", "embed", "world") or "bytes" not in op.get("args", {}):
                fail(f"{where}: operation without a group or bytes: {op}")
        metrics = {r["step"]: r for r in map(json.loads, open(os.path.join(run_dir, "metrics", f"rank-{rank}.jsonl")))}
        steps = [(int(n.split()[1]), s, e) for n, c, s, e, d in sp if c == "step"]
        if [n for n, _, _ in steps] != list(range(first, last + 1)):
            fail(f"{where}: traced steps {[n for n, _, _ in steps]}, want {first}-{last}")
        errors = []  # per step: (relative error, traced ms, metrics ms)
        for n, s0, s1 in steps:
            inside = [x for x in sp if s0 <= x[2] and x[3] <= s1]
            # A checkpoint's verification forward is not the step's training (nor in its compute_ms).
            ckpts = [(x[2], x[3]) for x in inside if x[1] == "checkpoint"]
            inside = [x for x in inside if x[1] == "checkpoint" or not any(a <= x[2] and x[3] <= b for a, b in ckpts)]
            names = [x[0] for x in inside]
            for want in ("data fetch", "optimizer", "zero gradients"):
                if want not in names:
                    fail(f"{where}: step {n} has no '{want}' span")
            fwd = sorted(int(x.split()[-1]) for x in names if re.fullmatch(r"forward block \d+", x))
            bwd = sorted(int(x.split()[-1]) for x in names if re.fullmatch(r"backward block \d+", x))
            mbs = sum(1 for x in names if x.startswith("forward micro-batch"))
            if not fwd or mbs == 0 or fwd != bwd or len(fwd) % mbs:
                fail(f"{where}: step {n}: forward blocks {fwd}, backward {bwd}, {mbs} micro-batches")
            # Compute: the compute spans' time less the communicator calls nested in them (tensor
            # parallelism's sums, gradient buckets issued during backward, ZeRO's gather in the optimizer).
            compute = 0.0
            for name, cat, a, b, depth in inside:
                if cat != "compute":
                    continue
                nested = sum(y[3] - y[2] for y in inside if y[1] in ("wait", "issue") and a <= y[2] and y[3] <= b)
                compute += (b - a) - nested
            want_ms = metrics[n]["compute_ms"]
            errors.append((abs(compute / 1e3 - want_ms) / want_ms, compute / 1e3, want_ms))
        rel, traced_ms, metrics_ms = sorted(errors)[(len(errors) - 1) // 2]
        if rel > 0.05:
            outliers.append(f"{where}: in its median step the compute spans sum to {traced_ms:.3f} ms, the "
                            f"metrics' compute_ms to {metrics_ms:.3f} ms")
            if len(outliers) > allowed:
                fail("; ".join(outliers))
            print(f"outlier: {outliers[-1]}")
        else:
            worst = max(worst, rel)
        groups = sorted({op["name"] for op in ops})
        print(f"rank {rank}: steps {first}-{last}, {len(sp)} spans, {len(ops)} operations ({', '.join(groups)})")
    merged = json.load(open(os.path.join(trace_dir, "merged.json")))["traceEvents"]
    pids = sorted({e["pid"] for e in merged})
    if pids != list(range(len(files))):
        fail(f"merged.json holds pids {pids}, want 0..{len(files) - 1}")
    if min(e["ts"] for e in merged if "ts" in e) != 0:
        fail("merged.json does not start at 0")
    for pid in pids:
        mine = [e for e in merged if e["pid"] == pid]
        spans(mine, f"merged.json pid {pid}")
        operations(mine, f"merged.json pid {pid}")
    print(f"merged: {len(pids)} ranks on one timeline; compute spans within {100 * worst:.2f}% of the metrics"
          + (f" on {len(pids) - len(outliers)} ranks" if outliers else ""))


main()
