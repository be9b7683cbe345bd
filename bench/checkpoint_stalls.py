#!/usr/bin/env python3
"""What each save stopped training for, from a run's log and metrics.

usage: checkpoint_stalls.py LOG METRICS STEPS
prints: saves-on-the-way  first-stall-s  mean-later-stall-s  mean-step-ms  checkpoint-MB

A synchronous save stalls for the whole of it ("wrote ... in T s"); a
background one for what it took ("step N taken in T s": its checksums and
layout, and its snapshot where it copies it then), plus any wait of the
next update for a snapshot copied beside its step ("the update waited T
s"), plus any wait for the previous write, which is charged to the save
that made it.
Saves at STEPS (the last, synchronous in both modes) are left out. Used by
bench/async_checkpoint.sh and bench/gpu-check.sh.
"""
import json
import re
import sys


def main():
    log, metrics, steps = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
    stalls = {}
    for step, t in re.findall(r"checkpoint: step (\d+) taken in ([0-9.]+) s", log):
        stalls[int(step)] = float(t)
    for step, t in re.findall(r"checkpoint: wrote \S+step_0*(\d+)\.h5 \([0-9.]+ MB in ([0-9.]+) s", log):
        stalls[int(step)] = float(t)
    for step, t in re.findall(r"checkpoint: step (\d+)'s snapshot copied .* the update waited ([0-9.]+) s", log):
        stalls[int(step)] += float(t)
    on_way = sorted(s for s in stalls if s < steps)
    if not on_way:
        sys.exit(f"{sys.argv[1]}: no save before step {steps}")
    # A wait for step M's write belongs to the save after M that made it.
    for t, m in re.findall(r"training waited ([0-9.]+) s for the background write of step (\d+)", log):
        later = [s for s in on_way if s > int(m)]
        if later:
            stalls[later[0]] += float(t)
    first = stalls[on_way[0]]
    rest = sum(stalls[s] for s in on_way[1:]) / max(1, len(on_way) - 1)
    ms = [json.loads(l)["step_ms"] for l in open(metrics) if '"step_ms"' in l]
    mb = re.findall(r"\(([0-9.]+) MB", log)[-1]
    print(len(on_way), first, rest, sum(ms) / len(ms), mb)


if __name__ == "__main__":
    main()
