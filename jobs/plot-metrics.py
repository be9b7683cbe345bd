#!/usr/bin/env python3
"""Plots one or more mpiformer runs from their metrics.jsonl: training and
validation loss, learning rate, tokens/s and MFU against the step, and the
run's goodput (the share of its launches' wall time in steps it kept, from
its last "goodput" record: the picture's foot, and printed). Several
run directories are overlaid, each in its own colour. A run resumed after a
preemption (or any restart in the same run directory) shows a dotted
vertical line where each new segment starts.

usage: jobs/plot-metrics.py RUN_DIR [RUN_DIR...] [--output metrics.png]

Needs matplotlib (Debian: apt-get install python3-matplotlib, for
/usr/bin/python3). Exit 2 when a directory holds no metrics.
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"plot-metrics: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_run(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        fail(f"{run_dir}: no metrics.jsonl (give the run directory, [run] dir of its deck)")
    steps, evals, restarts = [], [], []
    goodput = None
    segment_started = False
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                # A line cut short by a full disk (earlier builds could leave
                # one): skipped, and said.
                print(f"plot-metrics: {path}: skipping line {n}, which is not JSON ({e})",
                      file=sys.stderr)
                continue
            # Each run segment starts by recording its predicted memory.
            if "memory_predicted" in rec:
                segment_started = True
            elif "loss" in rec and "step" in rec:
                if segment_started and steps:
                    restarts.append(rec["step"])
                segment_started = False
                steps.append(rec)
            elif "val_loss" in rec:
                evals.append(rec)
            elif "goodput" in rec:
                goodput = rec["goodput"]
    if not steps:
        fail(f"{path}: no step lines (did the run train a step?)")
    return steps, evals, restarts, goodput


def goodput_text(label, g):
    return (f"{label}: goodput {100 * g['goodput']:.1f}% ({g['productive_s']:.1f} s of kept steps in "
            f"{g['wall_s']:.1f} s over {g['launches']} launch(es); saves {g['save_s']:.1f} s, "
            f"start-up {g['startup_s']:.1f} s, redone steps {g['lost_s']:.1f} s "
            f"({g['steps_redone']}))")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--output", "-o", help="PNG to write (default: RUN_DIR/metrics.png for one "
                    "run, metrics.png here for several)")
    args = ap.parse_args()
    runs = [(d, *read_run(d)) for d in args.runs]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("needs matplotlib (Debian: apt-get install python3-matplotlib, "
             "then run this with /usr/bin/python3)")
    out = args.output or (os.path.join(args.runs[0], "metrics.png") if len(runs) == 1 else "metrics.png")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (loss_ax, lr_ax), (tps_ax, mfu_ax) = axes
    notes = []
    for i, (run_dir, steps, evals, restarts, goodput) in enumerate(runs):
        colour = f"C{i}"
        label = os.path.basename(os.path.normpath(run_dir)) or run_dir
        x = [s["step"] for s in steps]
        # A step whose loss was not finite is logged as null: a gap.
        loss_ax.plot(x, [s["loss"] if s["loss"] is not None else float("nan") for s in steps],
                     color=colour, label=f"{label} train")
        if evals:
            loss_ax.plot([e["step"] for e in evals],
                         [e["val_loss"] if e["val_loss"] is not None else float("nan") for e in evals],
                         "o--", color=colour, label=f"{label} val")
        lr_ax.plot(x, [s["lr"] for s in steps], color=colour, label=label)
        tps_ax.plot(x, [s["tokens_per_s"] for s in steps], color=colour, label=label)
        mfu_ax.plot(x, [100 * s["mfu"] for s in steps], color=colour, label=label)
        for r in restarts:
            for ax in axes.flat:
                ax.axvline(r, color=colour, linestyle=":", linewidth=1)
        if goodput:
            notes.append(goodput_text(label, goodput))
    loss_ax.set_ylabel("loss (nats/token)")
    lr_ax.set_ylabel("learning rate")
    tps_ax.set_ylabel("tokens/s")
    mfu_ax.set_ylabel("MFU (%)")
    for ax in axes[1]:
        ax.set_xlabel("step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=8)
    if any(r[3] for r in runs):
        fig.suptitle("dotted lines: a run restarted (resumed from a checkpoint)", fontsize=9)
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    for i, note in enumerate(notes):
        fig.text(0.01, 0.01 + 0.03 * i, note, fontsize=8)
        print(f"plot-metrics: {note}")
    fig.savefig(out + ".tmp.png", dpi=100)
    os.replace(out + ".tmp.png", out)  # whole or absent
    print(f"plot-metrics: wrote {out}")


if __name__ == "__main__":
    main()
