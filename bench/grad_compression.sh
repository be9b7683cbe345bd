#!/usr/bin/env bash
# [train] grad_compression on this machine: for one model at DP ranks, the
# loss every LOG steps of runs with float, bf16 and int8 gradients on the
# wire (the same seed and data), the largest relative difference of the
# loss from float's over the run and over its last 10%, and the bytes each
# rank sends a step (the run's own dp_sent_mb), and each run's mean loss
# over its last 10% (one step's loss is one batch's: the runs' batches
# differ by their trajectories). A table in Markdown.
#   MODEL=inputs/tiny.toml DP=2 STEPS=300 SEQ= MB=4 GB=16 LOG=50 OUT=bench-out PRESET=cpu
source "$(dirname "$0")/lib.sh"
MODEL=${MODEL:-inputs/tiny.toml}
DP=${DP:-2}
STEPS=${STEPS:-300}
MB=${MB:-4}
GB=${GB:-16}
LOG=${LOG:-50}
OUT=${OUT:-bench-out}/grad_compression/$(basename "$MODEL" .toml)_dp$DP
mkdir -p "$OUT"
case "$MODEL" in *tiny*) prep_corpus byte ;; *) prep_corpus gpt2 ;; esac
common=(--set train.steps="$STEPS" --set train.log_every=1 --set train.eval_every=0
        --set data.val='""' --set run.peak_tflops=1 --set parallel.dp="$DP"
        --set train.micro_batch="$MB" --set train.global_batch="$GB"
        --set checkpoint.resume=never --set checkpoint.every=0)
[ -z "${SEQ:-}" ] || common+=(--set model.seq_len="$SEQ")
for c in none bf16 int8; do
  rm -rf "$OUT/$c"
  mpirun --oversubscribe -np "$DP" "$BIN" train "$MODEL" "${common[@]}" \
    --set train.grad_compression="$c" --set run.dir="$OUT/$c" >"$OUT/$c.log" 2>&1 ||
    { tail "$OUT/$c.log"; exit 1; }
  rm -rf "$OUT/$c/checkpoints"
done
python3 - "$OUT" "$LOG" "$MODEL" "$DP" <<'PY'
import json, sys
out, every, model, dp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(c):
    return [j for j in map(json.loads, open(f"{out}/{c}/metrics.jsonl")) if "loss" in j and "step" in j]
runs = {c: load(c) for c in ("none", "bf16", "int8")}
steps = [j["step"] for j in runs["none"]]
print(f"{model}, dp {dp}: loss every {every} steps")
print()
print("| step | float | bf16 | int8 |")
print("| --- | --- | --- | --- |")
for i, s in enumerate(steps):
    if s == 1 or s % every == 0 or s == steps[-1]:
        print(f"| {s} | " + " | ".join(f"{runs[c][i]['loss']:.4f}" for c in ("none", "bf16", "int8")) + " |")
print()
print("| gradients on the wire | MB sent a step per rank | vs float | largest loss difference | over the last 10% | mean loss, last 10% |")
print("| --- | --- | --- | --- | --- | --- |")
def sent(c):
    v = [j["dp_sent_mb"] for j in runs[c] if "dp_sent_mb" in j]
    return sum(v) / len(v)
tail = max(1, len(steps) // 10)
for c in ("none", "bf16", "int8"):
    d = [abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(runs[c], runs["none"])]
    mean = sum(j["loss"] for j in runs[c][-tail:]) / tail
    print(f"| {'float' if c == 'none' else c} | {sent(c):.3f} | {sent(c) / sent('none'):.3f} | "
          f"{max(d):.2e} | {max(d[-tail:]):.2e} | {mean:.4f} |")
PY
